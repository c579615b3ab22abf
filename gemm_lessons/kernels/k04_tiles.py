"""Lesson 04's tile sizes: one checked configuration type, the sizes each kernel runs with,
and the plumbing its 128-bit kernels share (operands for float4 loads, the launch, a loop
unrolled while the kernel is built).

Names follow the course: BM x BN block tile, BK deep; TM x TN outputs per thread; WM x WN per
warp. Each kernel has a GPU configuration and a smaller simulator one (each CUDA thread is a
Python thread there); the two differ only in sizes, never in the code they run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from numba import cuda

from .. import engines
from ..common import cdiv

SIM_CONFIGS = {
    "k04_1d_tiling": dict(BM=32, BN=32, BK=8, TM=8),
    "k04_2d_tiling": dict(BM=32, BN=32, BK=4, TM=4, TN=4),
    "k04_vectorized": dict(BM=32, BN=32, BK=8, TM=4, TN=4),
    "k04_warp_tiling": dict(BM=64, BN=64, BK=8, WM=64, WN=32, TM=8, TN=8),
    "k04_thread_tile": dict(BM=64, BN=128, BK=8, WM=64, WN=64, TM=8, TN=16),
    "k04_prefetch": dict(BM=64, BN=128, BK=8, WM=64, WN=64, TM=8, TN=16),
    "k04_double_buffer": dict(BM=64, BN=128, BK=8, WM=64, WN=64, TM=8, TN=16),
    "k04_register_tiling": dict(BM=64, BN=128, BK=8, WM=64, WN=64, TM=8, TN=16),
}
GPU_CONFIGS = {
    "k04_1d_tiling": dict(BM=64, BN=64, BK=8, TM=8),
    "k04_2d_tiling": dict(BM=128, BN=128, BK=8, TM=8, TN=8),
    "k04_vectorized": dict(BM=128, BN=128, BK=8, TM=8, TN=8),
    # 8 warps of 64 x 32, 8 x 8 outputs per thread (256 threads)
    "k04_warp_tiling": dict(BM=128, BN=128, BK=8, WM=64, WN=32, TM=8, TN=8),
    # 8 warps of 64 x 64, 8 x 16 outputs per thread (256 threads, one block per SM)
    "k04_thread_tile": dict(BM=128, BN=256, BK=8, WM=64, WN=64, TM=8, TN=16),
    "k04_prefetch": dict(BM=128, BN=256, BK=8, WM=64, WN=64, TM=8, TN=16),
    "k04_double_buffer": dict(BM=128, BN=256, BK=8, WM=64, WN=64, TM=8, TN=16),
    "k04_register_tiling": dict(BM=128, BN=256, BK=8, WM=64, WN=64, TM=8, TN=16),
}


def config(name):
    """The tile sizes kernel ``name`` runs with here (GPU or simulator)."""
    return dict((GPU_CONFIGS if engines.on_gpu() else SIM_CONFIGS)[name])


@dataclass(frozen=True)
class Tiles:
    """Tile sizes of a lesson-04 kernel; building one checks them and raises ValueError
    naming the rule a size breaks. Without WM, WN: a block of (BM/TM) x (BN/TN) threads.
    With them: warps of WM x WN, each lane a TM x TN tile made of 4 x 4 blocks."""
    BM: int
    BN: int
    BK: int
    TM: int
    TN: int = 1
    WM: Optional[int] = None
    WN: Optional[int] = None

    def __post_init__(self):
        for key, v in vars(self).items():
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{key}={v!r}: tile sizes are positive integers")
        if self.BM % self.TM or self.BN % self.TN:
            raise ValueError(f"TM={self.TM} must divide BM={self.BM} and TN={self.TN} "
                             f"BN={self.BN}")
        if (self.WM is None) != (self.WN is None):
            raise ValueError("WM and WN go together (a warp tile has both)")
        if self.WM is not None:
            if self.BM % self.WM or self.BN % self.WN:
                raise ValueError(f"warp tiles of {self.WM}x{self.WN} must divide the "
                                 f"{self.BM}x{self.BN} block tile")
            if self.TM % 4 or self.TN % 4 or self.WM % self.TM or self.WN % self.TN:
                raise ValueError(f"a {self.TM}x{self.TN} thread tile is made of 4 x 4 "
                                 f"blocks and divides the {self.WM}x{self.WN} warp tile")
            lanes = (self.WM // self.TM) * (self.WN // self.TN)
            if lanes != 32:
                raise ValueError(f"a warp tile of {self.WM}x{self.WN} with {self.TM}x"
                                 f"{self.TN} per thread needs {lanes} lanes, not 32")

    @property
    def threads(self):
        if self.WM is None:
            return (self.BM // self.TM) * (self.BN // self.TN)
        return (self.BM // self.WM) * (self.BN // self.WN) * 32

    def loads(self, vec=1):
        """(A elements per thread, B elements per thread, A tile rows loaded by the whole
        block at once, B tile rows likewise), in units of ``vec`` floats; ValueError unless
        every thread loads the same number of each tile at fixed offsets."""
        NT, BM, BN, BK = self.threads, self.BM, self.BN, self.BK
        if BK % vec or BN % vec:
            raise ValueError(f"BK={BK} and BN={BN} must be multiples of {vec} "
                             f"({vec}-float loads)")
        if vec == 4 and (self.TM % 4 or self.TN % 4):
            raise ValueError(f"TM={self.TM} and TN={self.TN} must be multiples of 4 "
                             "(float4 fragments)")
        KQ, NQ = BK // vec, BN // vec
        if NT % KQ or NT % NQ or BM % (NT // KQ) or BK % (NT // NQ):
            raise ValueError(f"tiles BM={BM}, BN={BN}, BK={BK} do not split evenly into "
                             f"{vec}-float loads over {NT} threads")
        return BM * KQ // NT, BK * NQ // NT, NT // KQ, NT // NQ


# ------------------------------------------------------ operands for 128-bit (float4) loads
def float4_ready(t):
    """Rows contiguous and 16-byte aligned, width a multiple of 4: float4 loads work."""
    return (t.stride(1) == 1 and t.stride(0) % 4 == 0 and t.shape[1] % 4 == 0
            and t.data_ptr() % 16 == 0)


def padded4(t):
    """``t`` as is if float4 loads work on it, else a copy with its width rounded up to a
    multiple of 4 (zeros in the new columns), contiguous and aligned."""
    if float4_ready(t):
        return t
    rows, cols = t.shape
    out = torch.zeros(rows, cdiv(cols, 4) * 4, dtype=t.dtype, device=t.device)
    out[:, :cols] = t
    return out


def vector_launch(kernel, a, b, c, BM, BN, threads):
    """Launch a float4 kernel: pad A (width K) and B (width N) if needed, then go."""
    M, N = c.shape
    a4, b4 = padded4(a), padded4(b)
    vec_c = int(N % 4 == 0 and c.data_ptr() % 16 == 0)   # float4 stores into C allowed
    A, B, C = engines.as_numba(a4), engines.as_numba(b4), engines.as_numba(c)
    kernel[(cdiv(N, BN), cdiv(M, BM)), threads, engines.numba_stream()](A, B, C, vec_c)


def unrolled(step, n):
    """A device function ``run(j, args)`` that calls ``step(j, args)``, then
    ``step(j + 1, args)``, ... ``step(j + n - 1, args)`` (``args``: a tuple): a loop unrolled
    while the kernel is built (numba has no "#pragma unroll"). Every call is inlined, so in
    ``step`` the index is a constant: ``rA[j % 2, i]`` is a register, ``buf + j`` an address
    offset, no loop counter."""
    if n == 1:
        return step
    first, rest = unrolled(step, n // 2), unrolled(step, n - n // 2)
    half = n // 2

    @cuda.jit(device=True, inline="always")
    def run(j, args):
        first(j, args)
        rest(j + half, args)
    return run


SIG = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"
SIG_VEC = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1], int64)"  # vec_c: an int
