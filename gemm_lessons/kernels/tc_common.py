"""What the lesson-06 tensor-core kernels share: their tile configuration, the block order,
the launcher and the checks around it. One copy each; every ``k06_*`` module imports these.

* :class:`PipelineConfig` - the tiles of the WMMA pipelines (``k06_double_buffer``,
  ``k06_multistage``, ``k06_cp_async``); it checks its own constraints and raises a
  ``ValueError`` that names the one violated;
* :func:`engine_config` - the configuration of this engine (the GPU's, or the simulator's
  smaller tiles with the same loop), with overrides;
* :func:`grouped_block` - the numba device function that gives a block its tile in the
  grouped order of lesson 07 (the plain-Python twin is ``gemm_lessons.common.grouped_order``);
* :func:`rows16` - an operand as a flat array whose rows start 16-byte aligned (what a
  16-byte ``cp.async`` needs), copied into a zero-padded buffer only when it is not;
* :func:`allow_smem` - raise a kernel's dynamic shared-memory limit past 48 KiB;
* :func:`check_bf16` - bf16 tensor cores need compute capability 8.0;
* :func:`launch` - the launcher every lesson-06 kernel uses (same arguments), and
  :func:`ptx_hook` - the registry's ``ptx(cc)`` hook for that signature.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from numba import cuda

from .. import engines
from ..common import cdiv, smem_optin

__all__ = ["TileConfig", "PipelineConfig", "engine_config", "grouped_block", "rows16", "allow_smem", "launchers",
           "check_bf16", "check_hopper", "launch", "ptx_hook"]


class TileConfig:
    """The checks shared by the tensor-core kernels' configurations (frozen dataclasses of
    tile sizes): every field a positive integer (a field typed ``str`` is a choice that
    :meth:`rules` checks), and every ``(holds, what the tiles need)`` pair of :meth:`rules`
    true; a ValueError names the first that is not."""

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in (str, "str"):
                continue
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{f.name} must be a positive integer, got {v!r}")
        for ok, rule in self.rules():
            if not ok:
                raise ValueError(f"{self}: the tiles need {rule}")

    def rules(self):
        return []

    def replace(self, **changes):
        """This configuration with some fields changed (checked again)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class PipelineConfig(TileConfig):
    """Tiles of a WMMA pipeline: a BM x BN block tile walked through K in BK-deep tiles,
    cut into WM x WN warp tiles (16 x 16 fragments), STAGES shared buffers; GROUP_M block
    rows walk across N together (L2 reuse, lesson 07)."""
    BM: int = 128
    BN: int = 256
    BK: int = 64
    WM: int = 64
    WN: int = 64
    STAGES: int = 4
    GROUP_M: int = 8

    def rules(self):
        threads = 32 * (self.BM // self.WM) * (self.BN // self.WN)
        return [
            (self.WM % 16 == 0 and self.WN % 16 == 0, "WM and WN multiples of 16 (fragments)"),
            (self.BK % 16 == 0, "BK a multiple of 16 (one WMMA k-slice)"),
            (self.BM % self.WM == 0 and self.BN % self.WN == 0,
             "BM a multiple of WM and BN a multiple of WN (whole warp tiles)"),
            (self.STAGES >= 2, "STAGES >= 2 (one buffer read while the next is written)"),
            (threads <= 1024, f"at most 1024 threads per block ({threads} warps x 32)"),
            (threads % (self.BK // 8) == 0 and threads % (self.BN // 8) == 0,
             "threads per block a multiple of the 16-byte chunks in a row of A (BK / 8) "
             "and of B (BN / 8): a thread's chunks then lie in one column"),
        ]


def engine_config(gpu, sim, overrides=None):
    """``gpu`` on a GPU, ``sim`` on the simulator, with ``overrides`` (a dict of fields,
    or a whole configuration) applied."""
    if isinstance(overrides, type(gpu)):
        return overrides
    if overrides is not None and not isinstance(overrides, dict):
        raise TypeError(f"config must be a {type(gpu).__name__} or a dict of its fields, "
                        f"got {type(overrides).__name__}")
    return (gpu if engines.on_gpu() else sim).replace(**(overrides or {}))


@cuda.jit(device=True, inline="always")
def grouped_block(pid, M, N, BM, BN, GROUP):
    """(first row, first column) of block ``pid``'s tile when the blocks run in bands of
    GROUP block rows that walk across N together: the band's A rows and the current B
    columns stay in L2 (lesson 07 draws this order)."""
    n_m, n_n = (M + BM - 1) // BM, (N + BN - 1) // BN
    first_m = (pid // (GROUP * n_n)) * GROUP
    group_m = min(n_m - first_m, GROUP)
    return ((first_m + (pid % (GROUP * n_n)) % group_m) * BM,
            ((pid % (GROUP * n_n)) // group_m) * BN)


def rows16(t, rows, cols):
    """(flat tensor, row stride) of a ``rows x cols`` operand whose rows start 16-byte
    aligned: ``t`` itself when it is laid out that way, else a zero-padded copy (rows and
    columns past ``t``'s own are zeros: that is how K is padded to a multiple of 8)."""
    R, C = t.shape
    aligned = (rows, cols) == (R, C) and (t.stride(1) == 1 or C == 1) and \
        t.data_ptr() % 16 == 0 and (R == 1 or (t.stride(0) % 8 == 0 and t.stride(0) >= C))
    if aligned:
        ld = t.stride(0) if R > 1 else cdiv(C, 8) * 8
    else:
        ld = cdiv(cols, 8) * 8
        padded = torch.zeros(rows, ld, dtype=t.dtype, device=t.device)
        padded[:R, :C] = t
        t = padded
    return t.as_strided(((rows - 1) * ld + cols,), (1,)), ld


_SMEM_SET = set()


def _arg_key(a):
    """What numba's type of a launch argument depends on, read without typing it."""
    if hasattr(a, "is_c_contiguous"):                  # a device array
        return (str(a.dtype), a.ndim, a.is_c_contiguous(), a.is_f_contiguous())
    return type(a)                                     # a scalar


def allow_smem(kernel, args, nbytes):
    """Large pipelines need more than the 48 KiB of shared memory a kernel gets by default:
    raise the kernel's limit (cuFuncSetAttribute MAX_DYNAMIC_SHARED_SIZE_BYTES), once per
    compiled version (the check costs no typing of the arguments after the first call)."""
    if nbytes <= 48 * 1024 or not engines.on_gpu():
        return
    limit = smem_optin(torch.cuda.current_device())
    if nbytes > limit:
        raise ValueError(f"this tile configuration needs {nbytes} bytes of shared memory per "
                         f"block; {engines.engine().device_name} allows {limit}: fewer STAGES "
                         "or a smaller BM, BN or BK")
    key = (id(kernel), nbytes, tuple(_arg_key(a) for a in args))
    if key in _SMEM_SET:
        return
    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    from numba.cuda.cudadrv.driver import binding, driver
    fn = compiled._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, fn.handle, fn.device.id)
    _SMEM_SET.add(key)


def check_bf16(dtype):
    """A ValueError on a GPU older than compute capability 8.0 for bf16 inputs."""
    eng = engines.engine()
    if dtype == torch.bfloat16 and eng.kind == "cuda" and eng.capability < (8, 0):
        raise ValueError(f"bf16 tensor cores need compute capability 8.0; {eng.device_name} "
                         "has " + ".".join(map(str, eng.capability)) + ": use float16")


def check_hopper(entry, what):
    """A ValueError when this engine's GPU is not one ``entry`` (a registered Kernel) runs
    on: ``what`` (its instructions) exists on compute capability 9.x only."""
    eng = engines.engine()
    if eng.kind == "cuda" and not entry.runs_on(eng.capability):
        raise ValueError(f"{what} on compute capability 9.x (Hopper) only; "
                         f"{eng.device_name} has " + ".".join(map(str, eng.capability)))


def launch(kernel, a, b, c, out, alpha, beta, BM, BN):
    """``out = alpha * a @ b + beta * c`` with a lesson-06 kernel (built for a's dtype) of
    BM x BN block tiles: K padded to a multiple of 8, operands passed as flat arrays of
    16-byte rows, a 1-D grid (the kernel orders its blocks itself). ``c`` may be None when
    ``beta == 0`` (never read then)."""
    check_bf16(a.dtype)
    M, K = a.shape
    N = b.shape[1]
    K = cdiv(K, 8) * 8                   # the kernel's K: a multiple of 8 (zero-padded)
    A, lda = rows16(a, M, K)
    B, ldb = rows16(b, K, N)
    Cin = c if (c is not None and beta != 0) else out       # beta == 0: never read
    args = (engines.as_numba(A), engines.as_numba(B), engines.as_numba(Cin),
            engines.as_numba(out), M, N, K, lda, ldb, np.float32(alpha), np.float32(beta))
    grid = cdiv(M, BM) * cdiv(N, BN)
    allow_smem(kernel, args, kernel.smem_bytes)
    kernel[grid, kernel.threads, engines.numba_stream(), kernel.smem_bytes](*args)


def ptx_hook(make, config):
    """The registry's ``ptx(cc)`` hook for a kernel built by ``make(config, bf16=...)`` with
    :func:`launch`'s arguments (A, B flat; C; Out; M, N, K, lda, ldb; alpha, beta)."""
    def hook(cc, bf16=False):
        dt = "int16" if bf16 else "float16"
        return (make(config, bf16=bf16).py_func,
                f"void({dt}[::1], {dt}[::1], {dt}[:, :], {dt}[:, ::1], int64, int64, int64, "
                f"int64, int64, float32, float32)")
    return hook


def launchers(make_kernel, gpu, sim):
    """The three launchers every WMMA rung of lesson 06 has, for its ``make_kernel`` and its
    GPU and simulator configurations:

    * ``kernel_for(config=None, bf16=False)``: the kernel object ``run`` launches for
      ``config`` (overrides of this engine's configuration), the same cached object, so its
      compiled overloads can be read;
    * ``run(a, b, c, out, alpha=1.0, beta=0.0, config=None)``: ``out = alpha * a @ b +
      beta * c`` (``c`` may be None when ``beta == 0``);
    * ``blas_gemm``: the ``gl.gemm`` hook (3-D views with one batch)."""
    def kernel_for(config=None, bf16=False):
        return make_kernel(engine_config(gpu, sim, config), bf16)

    def run(a, b, c, out, alpha=1.0, beta=0.0, config=None):
        cfg = engine_config(gpu, sim, config)
        kernel = make_kernel(cfg, a.dtype == torch.bfloat16)
        launch(kernel, a, b, c, out, alpha, beta, cfg.BM, cfg.BN)

    def blas_gemm(a3, b3, c3, out, alpha, beta, bias, activation):
        run(a3[0], b3[0], None if c3 is None else c3[0], out[0], alpha, beta)

    return kernel_for, run, blas_gemm
