"""What a Triton kernel compiles to, with or without a GPU: Triton GPU IR, PTX and SASS.

Triton compiles for a named target without a GPU (``triton.compile`` with a ``GPUTarget``;
its wheel ships ptxas and nvdisasm). In a process running Triton's interpreter, ``@triton.jit``
gives interpreted functions, so the compilation then runs in a child process with the
interpreter off, as :mod:`gemm_lessons.compiled` does for numba.

The arguments are specialised as a launch on contiguous, 16-byte-aligned operands whose
sizes are multiples of 16 would be: pointers and integers divisible by 16, integers equal
to 1 (unit strides) folded into constants.

    from gemm_lessons import triton_asm
    asm = triton_asm.compile_kernel(matmul_kernel, args, constants, num_warps=8,
                                    num_stages=3, cc=(9, 0))
    asm["ptx"], asm["sass"], asm["shared"]
"""
from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

__all__ = ["compile_kernel", "compile_kernels", "grep"]

_PTR = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32", "int32": "*i32",
        "float8_e4m3fn": "*fp8e4nv", "float8_e5m2": "*fp8e5"}


def _qualname(fn):
    """'module:name' of a @triton.jit function (interpreted or compiled)."""
    base = fn
    while hasattr(base, "fn"):
        base = base.fn
    return f"{base.__module__}:{base.__name__}"


def _resolve(qualname):
    mod, name = qualname.split(":")
    return getattr(importlib.import_module(mod), name)


def _compile_here(qualname, args, constants, num_warps, num_stages, cc):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _resolve(qualname)
    gluon = getattr(fn, "is_gluon", lambda: False)()
    names = list(fn.arg_names)
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in constants or name not in args:     # given, or its default
            value = constants[name] if name in constants else fn.params[i].default
            signature[name] = "constexpr"
            constexprs[(i,)] = tuple(value) if isinstance(value, list) else value
            continue
        value = args[name]
        if isinstance(value, dict):                    # a TMA descriptor: dtype, block shape
            block = ", ".join(str(n) for n in value["block"])
            layout = f",{_gluon_layout(value)!r}" if gluon else ""   # Gluon: its smem layout
            signature[name] = f"tensordesc<{_PTR[value['desc']][1:]}[{block}]{layout}>"
            continue
        if isinstance(value, str):                     # a pointer: its element dtype
            signature[name] = _PTR[value]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif value == 1:                               # Triton folds 1s into constants
            signature[name] = "constexpr"
            constexprs[(i,)] = 1
        else:
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", cc[0] * 10 + cc[1], 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    return {"ttgir": k.asm.get("ttgir", ""), "ptx": k.asm["ptx"], "sass": _sass(k.asm["cubin"]),
            "shared": int(k.metadata.shared), "num_warps": int(k.metadata.num_warps)}


def _gluon_layout(desc):
    """The shared layout Gluon gives a descriptor's block (its default swizzle)."""
    from triton.experimental.gluon import language as gl
    dtype = {"float8_e4m3fn": "float8e4nv", "float8_e5m2": "float8e5"}.get(desc["desc"],
                                                                          desc["desc"])
    return gl.NVMMASharedLayout.get_default_for(list(desc["block"]), getattr(gl, dtype))


def _sass(cubin):
    """nvdisasm's SASS of a cubin (Triton ships nvdisasm); '' where it is missing."""
    import shutil
    import tempfile
    import triton
    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    if not os.path.exists(exe):
        exe = shutil.which("nvdisasm")
    if exe is None:
        return ""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        proc = subprocess.run([exe, "-c", path], capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else ""


def compile_kernel(fn, args, constants, *, num_warps=4, num_stages=3, cc=(9, 0)):
    """Compile the @triton.jit (or Gluon) ``fn`` for compute capability ``cc`` with no launch.

    ``args``: each runtime argument's example value: a dtype name ('float16', 'bfloat16',
    'float32') for a pointer, ``{"desc": dtype name, "block": [rows, cols]}`` for a host-side
    TMA descriptor (``TensorDescriptor``), an int otherwise (its divisibility by 16, or being 1, is what
    Triton specialises on). ``constants``: the constexpr arguments. Returns
    ``{'ttgir', 'ptx', 'sass', 'shared' (bytes), 'num_warps'}``.
    """
    return compile_kernels([dict(fn=fn, args=args, constants=constants, num_warps=num_warps,
                                 num_stages=num_stages, cc=cc)])[0]


def compile_kernels(jobs):
    """:func:`compile_kernel` for several ``dict(fn=, args=, constants=, num_warps=,
    num_stages=, cc=)`` at once (one child process for all of them)."""
    from . import engines
    jobs = [dict(job, fn=_qualname(job["fn"]), cc=list(job.get("cc", (9, 0)))) for job in jobs]
    if not engines.engine().kind == "simulator":
        return [_run(job) for job in jobs]
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "TRITON_INTERPRET")}
    env["GEMM_LESSONS_ENGINE"] = "compile"
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # triton 3.9 warns when it is unset
    proc = subprocess.run([sys.executable, "-m", "gemm_lessons.triton_asm"],
                          input=json.dumps(jobs), env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        names = ", ".join(sorted({job["fn"] for job in jobs}))
        raise RuntimeError(f"compiling {names} failed:\n{proc.stderr.strip()[-3000:]}")
    return json.loads(proc.stdout)


def _run(job):
    return _compile_here(job["fn"], job["args"], job["constants"], job.get("num_warps", 4),
                         job.get("num_stages", 3), tuple(job["cc"]))


def grep(text, pattern):
    """The distinct matches of the regular expression ``pattern`` in ``text``, sorted."""
    return sorted(set(re.findall(pattern, text)))


if __name__ == "__main__":
    jobs = json.loads(sys.stdin.read())
    import gemm_lessons  # noqa: F401  (decides the engine: 'compile', no interpreter)
    sys.stdout.write(json.dumps([_run(job) for job in jobs]))
