"""What a numba kernel compiles to: its PTX, and ptxas's resource report (registers, spills,
shared memory), with or without a GPU.

The simulator has no compiler, so on a machine without a GPU the compilation runs in a
child process with the simulator off (``GEMM_LESSONS_ENGINE=compile``); NVVM comes from
numba-cuda's ``cu13`` extra. Each kernel's ``ptx(cc)`` hook (see :class:`Kernel`) says
which Python function and signature to compile: the configuration a GPU would run.

    python -m gemm_lessons ptx k01_coalesced --cc 80
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from . import engines, registry

__all__ = ["variant", "ptx", "ptx_many", "compile_here", "ptxas_report", "find_ptxas",
           "find_disassembler", "sass"]


def _cc_tuple(cc):
    if isinstance(cc, str):
        cc = cc.replace(".", "").replace("sm_", "")
        return int(cc[:-1]), int(cc[-1])
    if isinstance(cc, int):
        return cc // 10, cc % 10
    return tuple(cc)


def variant(name):
    """``(registered name, configuration changes)`` of ``name`` or ``name@FIELD=VALUE``
    (``k06_cluster@RELEASE=cluster``: the kernel built with that change to its GPU
    configuration; an integer VALUE is read as one). tools/record_ncu.sh's driver reads
    its kernel names with it too."""
    base, _, change = name.partition("@")
    if not change:
        return base, None
    field, eq, value = change.partition("=")
    if not (eq and field and value):
        raise ValueError(f"{name!r}: a variant is NAME@FIELD=VALUE, e.g. "
                         "k06_cluster@RELEASE=cluster")
    return base, {field: int(value) if value.lstrip("-").isdigit() else value}


def compile_here(name, cc):
    """PTX of registered kernel ``name`` compiled in this process (a GPU or the compile
    engine); ``name@FIELD=VALUE`` compiles it with that change to its configuration, where
    its ``ptx`` hook takes one."""
    from numba import cuda
    base, change = variant(name)
    entry = registry.get(base)
    if entry.ptx is None:
        raise ValueError(f"{base} is a {entry.language} kernel: it has no numba PTX "
                         "(Triton kernels show theirs through kernel.asm on a GPU)")
    if change is None:
        fn, sig, *options = entry.ptx(cc)   # options: compile_ptx keywords, e.g. launch_bounds
    else:
        try:
            fn, sig, *options = entry.ptx(cc, config=change)
        except TypeError as e:
            raise ValueError(f"{base}'s PTX hook takes no configuration change "
                             f"({name})") from e
    if len(cc) == 2 and cc >= (9, 0):
        cc = cc + ("a",)    # as numba compiles for a 9.x GPU: sm_90a (wgmma and friends)
    text, _ = cuda.compile_ptx(fn, sig, cc=cc, **(options[0] if options else {}))
    return text


def ptx(name, cc=(8, 0)) -> str:
    """The PTX of the registered numba kernel ``name`` for compute capability ``cc``
    (``name@FIELD=VALUE``: with that change to its GPU configuration, for the kernels whose
    PTX hook takes one, e.g. ``k06_cluster@RELEASE=cluster``)."""
    return ptx_many([name], cc)[name]


def _cache_dir():
    """Where compiled PTX is kept between processes: ``$GEMM_LESSONS_CACHE/ptx``, else
    ``~/.cache/gemm_lessons/ptx``."""
    base = os.environ.get("GEMM_LESSONS_CACHE") or Path.home() / ".cache" / "gemm_lessons"
    return Path(base) / "ptx"


_DIGEST = []


def _source_digest():
    """One hash of every source file of the package and of the compiler's versions: a
    kernel's PTX follows from them alone, so any edit makes every cached PTX stale."""
    if not _DIGEST:
        import hashlib
        from importlib.metadata import version
        h = hashlib.sha256()
        for name in ("numba-cuda", "numba", "llvmlite"):
            try:
                h.update(f"{name} {version(name)};".encode())
            except Exception:      # noqa: BLE001  (not installed under that name)
                h.update(f"{name} ?;".encode())
        root = Path(__file__).resolve().parent
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
        _DIGEST.append(h.hexdigest()[:24])
    return _DIGEST[0]


def ptx_many(names, cc=(8, 0)) -> dict:
    """{name: PTX} of registered numba kernels for compute capability ``cc``, compiled here
    on a GPU, else in one child process with the simulator off (one NVVM start for all).
    Each PTX is kept on disk (:func:`_cache_dir`), keyed by the package's sources, so a
    kernel compiles once until the package changes."""
    cc, names = _cc_tuple(cc), list(names)
    for name in names:
        registry.get(variant(name)[0])  # unknown names fail here, with the known ones
    folder = _cache_dir()
    path = {name: folder / f"{name}-sm{cc[0]}{cc[1]}-{_source_digest()}.ptx" for name in names}
    out = {name: path[name].read_text() for name in names if path[name].is_file()}
    todo = [name for name in names if name not in out]
    if todo:
        fresh = _compile_many(todo, cc)
        for name, text in fresh.items():
            try:        # write, then rename: a process reading at the same time sees all or none
                folder.mkdir(parents=True, exist_ok=True)
                tmp = path[name].with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(text)
                tmp.replace(path[name])
            except OSError:
                pass    # a read-only home: compile again next time
        out.update(fresh)
    return {name: out[name] for name in names}


def _compile_many(names, cc):
    import json
    if engines.engine().kind in ("cuda", "compile"):
        return {name: compile_here(name, cc) for name in names}
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "TRITON_INTERPRET")}
    env["GEMM_LESSONS_ENGINE"] = "compile"
    proc = subprocess.run([sys.executable, "-m", "gemm_lessons.compiled", f"{cc[0]}{cc[1]}",
                           *names], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {', '.join(names)} to PTX failed:\n"
                           f"{proc.stderr.strip()[-3000:]}")
    return json.loads(proc.stdout)


def find_ptxas():
    """The ptxas that matches the NVVM numba compiles with: the one the CUDA wheels install
    beside it (numba-cuda's cu13 extra: ``nvidia.cu13``; ``nvidia.cuda_nvcc``), else the one on
    the PATH, else None. A ptxas older than NVVM rejects its PTX ("Unsupported .version")."""
    import importlib
    for mod in ("nvidia.cu13", "nvidia.cuda_nvcc"):
        try:
            paths = importlib.import_module(mod).__path__
        except ImportError:
            continue
        for base in paths:
            cand = Path(base) / "bin" / "ptxas"
            if cand.exists():
                return str(cand)
    return shutil.which("ptxas")


def ptxas_report(ptx_text, cc=(8, 0), warnings=False):
    """{'registers', 'spill_stores', 'spill_loads', 'smem_bytes', 'stack_bytes'} from
    ``ptxas -v`` on ``ptx_text``, plus 'warnings' (ptxas's own, such as wgmma instructions it
    had to serialize) when asked; None where ptxas is not installed."""
    exe = find_ptxas()
    if exe is None:
        return None
    cc = _cc_tuple(cc)
    import hashlib
    import json
    key = hashlib.sha256(f"{exe} {cc} {warnings}\0{ptx_text}".encode()).hexdigest()[:32]
    cached = _cache_dir() / f"ptxas-{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    rep = _ptxas(exe, ptx_text, cc, warnings)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rep))
        tmp.replace(cached)
    except OSError:
        pass
    return rep


def _ptxas(exe, ptx_text, cc, warnings):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx_text)
        target = re.search(r"^\.target\s+(sm_\w+)", ptx_text, re.M)
        arch = target.group(1) if target else f"sm_{cc[0]}{cc[1]}"
        proc = subprocess.run([exe, "-v", f"-arch={arch}", str(src), "-o",
                               str(Path(d) / "k.cubin")], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed: {proc.stderr.strip()[-2000:]}")
    log = proc.stderr + proc.stdout

    def num(pattern):
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0
    rep = {"registers": num(r"Used (\d+) registers"),
           "spill_stores": num(r"(\d+) bytes spill stores"),
           "spill_loads": num(r"(\d+) bytes spill loads"),
           "stack_bytes": num(r"(\d+) bytes stack frame"),
           "smem_bytes": num(r"(\d+) bytes smem")}
    if warnings:
        rep["warnings"] = [ln.split(": ", 1)[-1].split(" in the function")[0].strip()
                           for ln in log.splitlines()
                           if "warning" in ln.lower() or "Performance Loss" in ln]
    return rep


def find_disassembler():
    """A SASS disassembler: ``nvdisasm`` (branch targets as labels), else ``cuobjdump``;
    from the PATH, else the copies Triton ships; as (path, arguments), or None."""
    for exe, args in (("nvdisasm", ["-c"]), ("cuobjdump", ["-sass"])):
        found = shutil.which(exe)
        if found is None:
            try:
                import triton
                cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / exe
                found = str(cand) if cand.exists() else None
            except ImportError:
                found = None
        if found:
            return found, args
    return None


def sass(ptx_text, cc=(9, 0)):
    """The SASS ptxas makes of ``ptx_text`` (for the PTX's own ``.target``, else ``cc``),
    disassembled: no GPU needed. None where ptxas or a disassembler is missing."""
    import tempfile
    ptxas, dis = find_ptxas(), find_disassembler()
    if ptxas is None or dis is None:
        return None
    target = re.search(r"^\.target\s+(sm_\w+)", ptx_text, re.M)
    cc = _cc_tuple(cc)
    arch = target.group(1) if target else f"sm_{cc[0]}{cc[1]}"
    with tempfile.TemporaryDirectory() as d:
        src, cubin = Path(d) / "k.ptx", Path(d) / "k.cubin"
        src.write_text(ptx_text)
        subprocess.run([ptxas, f"-arch={arch}", str(src), "-o", str(cubin)], check=True,
                       capture_output=True, text=True)
        return subprocess.run([dis[0], *dis[1], str(cubin)], check=True, capture_output=True,
                              text=True).stdout


if __name__ == "__main__":
    import json
    if len(sys.argv) < 3:
        sys.exit("usage: python -m gemm_lessons.compiled CC NAME... (e.g. 80 k01_naive): "
                 "{name: PTX} as JSON")
    json.dump({n: compile_here(n, _cc_tuple(sys.argv[1])) for n in sys.argv[2:]}, sys.stdout)
