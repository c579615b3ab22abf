"""Lesson 02: tiles of A and B staged in shared memory, so each value read from global
memory is used many times.

In lesson 01 every thread reads its own row of A and column of B from global memory:
``2 K`` loads for one element of C, ``2 M N K`` loads in all. Here a block of TILE x TILE
threads computes a TILE x TILE tile of C. The K dimension is walked a tile at a time:

    for each k0 = 0, TILE, 2*TILE, ... < K:
        every thread loads ONE element of the A tile and ONE of the B tile into shared memory
        syncthreads()                    # the tiles are complete before anyone reads them
        acc += sA[ty, k] * sB[k, tx]     for k in 0..TILE-1 (shared-memory reads only)
        syncthreads()                    # everyone is done before the tiles are overwritten

Each element loaded from global memory is now read TILE times from shared memory, so
global loads per element of C drop from ``2 K`` to ``2 K / TILE``.

Boundaries (any M, N, K): a thread whose element of C lies outside C still loads its share
of the tiles and takes part in every ``syncthreads`` (only its final store is skipped);
tile elements outside A or B are stored as 0, so a partial last K tile adds nothing. Any
strides: the loads index A and B through numba's strided arrays, no copy.
"""
from functools import lru_cache

from numba import cuda, float32

from .. import engines
from ..common import cdiv
from ..ptx_simt import launch_bounds
from . import FP32, Kernel

SIM_CONFIG = dict(TILE=16)    # 256 threads per block: few blocks in numba's simulator
GPU_CONFIG = dict(TILE=32)    # 1024 threads per block, one warp per row of the tile


def config():
    """The tile size used here: large on a GPU, small in the simulator."""
    return GPU_CONFIG if engines.on_gpu() else SIM_CONFIG


@lru_cache(maxsize=None)
def make_kernel(TILE=32):
    """The shared-memory tiled kernel for TILE x TILE blocks (TILE is a compile-time constant)."""

    @cuda.jit(**launch_bounds(TILE * TILE))   # 32 x 32 = 1024 threads: <= 64 registers each
    def smem_tiling(A, B, C):
        sA = cuda.shared.array((TILE, TILE), float32)  # (rows of C, k) tile of A
        sB = cuda.shared.array((TILE, TILE), float32)  # (k, columns of C) tile of B
        M, K = A.shape
        N = B.shape[1]
        tx = cuda.threadIdx.x                          # column within the tile (lanes of a warp)
        ty = cuda.threadIdx.y                          # row within the tile
        row = cuda.blockIdx.y * TILE + ty
        col = cuda.blockIdx.x * TILE + tx
        acc = float32(0.0)
        for k0 in range(0, K, TILE):
            # 1. each thread loads one element of each tile (0 outside A or B)
            if row < M and k0 + tx < K:
                sA[ty, tx] = A[row, k0 + tx]
            else:
                sA[ty, tx] = 0.0
            if k0 + ty < K and col < N:
                sB[ty, tx] = B[k0 + ty, col]
            else:
                sB[ty, tx] = 0.0
            cuda.syncthreads()            # 2. wait until both tiles are complete
            for k in range(TILE):         # 3. TILE multiply-adds from shared memory
                acc += sA[ty, k] * sB[k, tx]
            cuda.syncthreads()            # 4. wait before the next loads overwrite the tiles
        if row < M and col < N:
            C[row, col] = acc

    return smem_tiling



def smem_tiling(a, b, c, TILE=None):
    """C = A @ B with TILE x TILE shared-memory tiles (default: :func:`config`).
    Any shape (masks in the kernel) and any strides (strided indexing, no copy)."""
    TILE = TILE or config()["TILE"]
    M, N = c.shape
    kernel = make_kernel(TILE)
    A, B, C = engines.as_numba(a), engines.as_numba(b), engines.as_numba(c)
    kernel[(cdiv(N, TILE), cdiv(M, TILE)), (TILE, TILE), engines.numba_stream()](A, B, C)


_SIG = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"

KERNELS = [
    Kernel("k02_smem_tiling", 2, "numba", FP32,
           "TILE x TILE tiles of A and B staged in shared memory; one element of C per thread",
           launch=smem_tiling, source=make_kernel,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG},
           ptx=lambda cc: (make_kernel(**GPU_CONFIG).py_func, _SIG,
                           {"launch_bounds": (GPU_CONFIG["TILE"] ** 2, 1)})),
]
