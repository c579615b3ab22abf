"""Lesson 04, steps 1 and 2: more than one output per thread, operands reused from registers.

Lesson 02's kernel does one multiply-add per two shared-memory loads: its inner loop is
limited by loads, not arithmetic. The cure is to make each thread compute *several*
outputs, keeping the operands it reuses in registers:

* ``k04_1d_tiling`` - each thread computes TM outputs down a column of C. One value of B,
  loaded once into a register, serves TM multiply-adds.
* ``k04_2d_tiling`` - each thread computes a TM x TN tile: per k it loads TM values of A and
  TN of B into registers (``rA``, ``rB``) and does TM * TN multiply-adds, their outer
  product.

Loops and registers: numba has no ``#pragma unroll``. A ``cuda.local.array`` indexed only by
constants after LLVM unrolls the small ``for i in range(TM)`` loops lives in registers
(check: no ``ld.local`` in the PTX).

Shapes and strides: both index A and B through their strides and mask at every boundary.
"""
from functools import lru_cache

from numba import cuda, float32

from .. import engines
from ..common import cdiv
from .k04_tiles import Tiles, config


# ----------------------------------------------------------------------- step 1: 1-D tiles
@lru_cache(maxsize=None)
def make_1d_tiling(BM, BN, BK, TM):
    """Each thread computes TM consecutive rows of one column of C (BM/TM x BN threads)."""
    tiles = Tiles(BM=BM, BN=BN, BK=BK, TM=TM)
    NT = tiles.threads                # threads per block: (BM/TM) x BN
    _, _, A_ROWS, B_ROWS = tiles.loads()  # tile rows the whole block loads per step

    @cuda.jit
    def tiling_1d(A, B, C):
        sA = cuda.shared.array((BM, BK), float32)   # (m, k)
        sB = cuda.shared.array((BK, BN), float32)   # (k, n)
        acc = cuda.local.array(TM, float32)         # TM outputs, in registers
        M, K = A.shape
        N = B.shape[1]
        t = cuda.threadIdx.x
        tn = t % BN                 # the thread's column in the block tile (lanes along n)
        tm = t // BN                # its group of TM rows
        ar, ac = t // BK, t % BK    # its elements of the tiles: sA[ar + i*A_ROWS, ac] and
        br, bc = t // BN, t % BN    # sB[br + i*B_ROWS, bc] (k, then n, fastest: coalesced)
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        for i in range(TM):
            acc[i] = 0.0
        for k0 in range(0, K, BK):
            for i in range(BM // A_ROWS):         # the A tile (0 outside A)
                r = ar + i * A_ROWS
                if m0 + r < M and k0 + ac < K:
                    sA[r, ac] = A[m0 + r, k0 + ac]
                else:
                    sA[r, ac] = 0.0
            for i in range(BK // B_ROWS):         # the B tile (0 outside B)
                r = br + i * B_ROWS
                if k0 + r < K and n0 + bc < N:
                    sB[r, bc] = B[k0 + r, n0 + bc]
                else:
                    sB[r, bc] = 0.0
            cuda.syncthreads()
            k = 0
            while k < BK:           # (a while loop: numba's range() adds bookkeeping here)
                b = sB[k, tn]                     # one load from shared memory...
                for i in range(TM):               # ...used by TM multiply-adds
                    acc[i] += sA[tm * TM + i, k] * b
                k += 1
            cuda.syncthreads()
        for i in range(TM):
            if m0 + tm * TM + i < M and n0 + tn < N:
                C[m0 + tm * TM + i, n0 + tn] = acc[i]

    return tiling_1d


def tiling_1d(a, b, c, **cfg):
    """C = A @ B, TM outputs per thread. Any shape (masks), any strides (no copy)."""
    cfg = cfg or config("k04_1d_tiling")
    BM, BN, TM = cfg["BM"], cfg["BN"], cfg["TM"]
    M, N = c.shape
    kernel = make_1d_tiling(**cfg)
    A, B, C = engines.as_numba(a), engines.as_numba(b), engines.as_numba(c)
    kernel[(cdiv(N, BN), cdiv(M, BM)), (BM // TM) * BN, engines.numba_stream()](A, B, C)


# ----------------------------------------------------------------------- step 2: 2-D tiles
@lru_cache(maxsize=None)
def make_2d_tiling(BM, BN, BK, TM, TN):
    """Each thread computes a TM x TN tile of C from register fragments rA, rB."""
    tiles = Tiles(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN)
    TCOLS = BN // TN                  # threads across the block tile
    NT = tiles.threads                # threads per block: (BM/TM) x (BN/TN)
    _, _, A_ROWS, B_ROWS = tiles.loads()  # tile rows the whole block loads per step

    @cuda.jit
    def tiling_2d(A, B, C):
        sA = cuda.shared.array((BM, BK), float32)   # (m, k)
        sB = cuda.shared.array((BK, BN), float32)   # (k, n)
        rA = cuda.local.array(TM, float32)          # a column of A's tile, in registers
        rB = cuda.local.array(TN, float32)          # a row of B's tile, in registers
        acc = cuda.local.array((TM, TN), float32)
        M, K = A.shape
        N = B.shape[1]
        t = cuda.threadIdx.x
        tm = t // TCOLS             # the thread's tile: rows tm*TM.., columns tn*TN..
        tn = t % TCOLS
        ar, ac = t // BK, t % BK    # its elements of the tiles: sA[ar + i*A_ROWS, ac] and
        br, bc = t // BN, t % BN    # sB[br + i*B_ROWS, bc] (k, then n, fastest: coalesced)
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0
        for k0 in range(0, K, BK):
            for i in range(BM // A_ROWS):         # the A tile (0 outside A)
                r = ar + i * A_ROWS
                if m0 + r < M and k0 + ac < K:
                    sA[r, ac] = A[m0 + r, k0 + ac]
                else:
                    sA[r, ac] = 0.0
            for i in range(BK // B_ROWS):         # the B tile (0 outside B)
                r = br + i * B_ROWS
                if k0 + r < K and n0 + bc < N:
                    sB[r, bc] = B[k0 + r, n0 + bc]
                else:
                    sB[r, bc] = 0.0
            cuda.syncthreads()
            k = 0
            while k < BK:           # (a while loop: numba's range() adds bookkeeping here)
                for i in range(TM):                 # TM + TN loads from shared memory...
                    rA[i] = sA[tm * TM + i, k]
                for j in range(TN):
                    rB[j] = sB[k, tn * TN + j]
                for i in range(TM):                 # ...feed TM * TN multiply-adds
                    for j in range(TN):
                        acc[i, j] += rA[i] * rB[j]
                k += 1
            cuda.syncthreads()
        for i in range(TM):
            for j in range(TN):
                if m0 + tm * TM + i < M and n0 + tn * TN + j < N:
                    C[m0 + tm * TM + i, n0 + tn * TN + j] = acc[i, j]

    return tiling_2d


def tiling_2d(a, b, c, **cfg):
    """C = A @ B, TM x TN outputs per thread. Any shape (masks), any strides (no copy)."""
    cfg = cfg or config("k04_2d_tiling")
    BM, BN, TM, TN = cfg["BM"], cfg["BN"], cfg["TM"], cfg["TN"]
    M, N = c.shape
    kernel = make_2d_tiling(**cfg)
    A, B, C = engines.as_numba(a), engines.as_numba(b), engines.as_numba(c)
    threads = (BM // TM) * (BN // TN)
    kernel[(cdiv(N, BN), cdiv(M, BM)), threads, engines.numba_stream()](A, B, C)


