"""Lesson 03: a shared-memory bank conflict, measured, and one padding column that removes it.

Shared memory is 32 banks of 4-byte words: word ``w`` lives in bank ``w % 32``. A warp's
32 lanes are served in one pass when they touch 32 different banks (or the same word: a
broadcast); when ``n`` different words fall in one bank, the access takes ``n`` passes (an
``n``-way conflict).

The kernel is lesson 02's tiling with one natural change: the lanes of a warp own the
*rows* of the C tile (``threadIdx.x`` walks down M, as in ``k01_naive``), so lane ``i``
walks along row ``i`` of the A tile. In the inner loop the 32 lanes read ``sA[lane, k]``:
one *column* of a 32 x 32 tile. With rows of 32 words, ``sA[i, k]`` is word ``32 i + k``,
which is in bank ``k`` for every ``i``: **all 32 lanes hit one bank, a 32-way conflict**,
on every multiply-add.

The fix: allocate each row with one extra, unused word (``PAD = 1``, rows of 33 words).
``sA[i, k]`` is then word ``33 i + k``, in bank ``(i + k) % 32``: 32 different banks,
1-way. The arithmetic, the loads from global memory and the results are identical; only
the shared array's shape changes.

    tile of A, 32 x 32:              same tile, rows padded to 33 words:
    bank of sA[i, k] = k             bank of sA[i, k] = (i + k) % 32

Both kernels: a block of 32 x BN threads computes a 32 x BN tile of C (lane = row of C,
``threadIdx.y`` = column); BK = 32. Any shape (masks, as in lesson 02), any strides.
"""
from functools import lru_cache

from numba import cuda, float32

from .. import engines
from ..common import cdiv
from ..ptx_simt import launch_bounds
from . import FP32, Kernel

BM = 32   # rows of the C tile = lanes of a warp
BK = 32   # width of the A tile: a row of 32 words spans the 32 banks once

SIM_CONFIG = dict(BN=4)       # 128 threads per block in numba's simulator
GPU_CONFIG = dict(BN=32)      # 1024 threads per block on a GPU


def config():
    return GPU_CONFIG if engines.on_gpu() else SIM_CONFIG


@lru_cache(maxsize=None)
def make_kernel(BN=32, PAD=0):
    """The column-walk kernel; ``PAD=0``: 32-way bank conflicts, ``PAD=1``: none."""
    NT = BM * BN  # threads per block
    SA = (BM, BK + PAD)
    RPT = BM // BN                    # rows of the A tile each thread loads

    @cuda.jit(**launch_bounds(NT))    # <= 64 registers per thread, or 1024 threads do not fit
    def column_walk(A, B, C):
        sA = cuda.shared.array(SA, float32)         # (m, k) tile of A, BK + PAD words per row
        sB = cuda.shared.array((BK, BN), float32)   # (k, n) tile of B
        M, K = A.shape
        N = B.shape[1]
        lane = cuda.threadIdx.x            # row of the C tile: lanes walk DOWN the tile
        ty = cuda.threadIdx.y              # column of the C tile (one per warp)
        t = ty * BM + lane                 # thread id in the block
        kb = t // BN                       # the one element of the B tile it loads
        nb = t % BN
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        acc = float32(0.0)
        for k0 in range(0, K, BK):
            for i in range(RPT):           # the A tile: lanes along k (coalesced reads)
                r = ty + i * BN
                if m0 + r < M and k0 + lane < K:
                    sA[r, lane] = A[m0 + r, k0 + lane]
                else:
                    sA[r, lane] = 0.0
            if k0 + kb < K and n0 + nb < N:    # the B tile: threads along n (coalesced)
                sB[kb, nb] = B[k0 + kb, n0 + nb]
            else:
                sB[kb, nb] = 0.0
            cuda.syncthreads()
            k = 0
            while k < BK:                  # (a while loop: LLVM unrolls it without overhead)
                # sA[lane, k]: the 32 lanes read a COLUMN of sA (bank conflict unless padded);
                # sB[k, ty]: one word for the whole warp (a broadcast)
                acc += sA[lane, k] * sB[k, ty]
                k += 1
            cuda.syncthreads()
        if m0 + lane < M and n0 + ty < N:
            C[m0 + lane, n0 + ty] = acc

    return column_walk



def _launch(a, b, c, PAD, BN=None):
    BN = BN or config()["BN"]
    M, N = c.shape
    kernel = make_kernel(BN, PAD)
    A, B, C = engines.as_numba(a), engines.as_numba(b), engines.as_numba(c)
    kernel[(cdiv(N, BN), cdiv(M, BM)), (BM, BN), engines.numba_stream()](A, B, C)


def bank_conflicts(a, b, c, BN=None):
    """C = A @ B; the inner loop reads a column of a 32 x 32 shared tile: 32-way conflicts.
    Any shape (masks), any strides (strided indexing, no copy)."""
    _launch(a, b, c, 0, BN)


def padded(a, b, c, BN=None):
    """The same kernel with the A tile's rows padded to 33 words: conflict-free.
    Any shape (masks), any strides (strided indexing, no copy)."""
    _launch(a, b, c, 1, BN)


_SIG = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"


def _ptx(PAD):
    return (make_kernel(GPU_CONFIG["BN"], PAD).py_func, _SIG,
            {"launch_bounds": (BM * GPU_CONFIG["BN"], 1)})

KERNELS = [
    Kernel("k03_bank_conflicts", 3, "numba", FP32,
           "lanes walk down a column of a 32 x 32 shared tile: 32-way bank conflicts",
           launch=bank_conflicts, source=make_kernel,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG},
           ptx=lambda cc: _ptx(0)),
    Kernel("k03_padded", 3, "numba", FP32,
           "the same column walk, tile rows padded to 33 words: 1-way (conflict-free)",
           launch=padded, source=make_kernel,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG},
           ptx=lambda cc: _ptx(1)),
]
