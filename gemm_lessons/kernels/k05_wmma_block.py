"""Lesson 05, step 2: a block of warps sharing shared-memory tiles.

``k05_wmma_block`` is ``k05_wmma_warp`` tiled twice more: a block of WARPS_M x WARPS_N warps
shares a BM x BK tile of A and a BK x BN tile of B in shared memory, and each warp computes a
WM x WN warp tile of C, FM x FN fragments, so each fragment it loads serves FN (or FM)
products. The rows of the shared tiles are padded by 8 elements (16 bytes): rows stay
16-byte aligned, and the rows one ``ldmatrix`` phase reads fall in different banks. The
tiles are still copied element by element through registers; ``k05_wmma`` copies 16-byte
chunks with ``cp.async`` instead.

Shapes and strides: any (masks in the kernel; A and B read through their strides). Inputs:
fp16, or bf16 as raw ``int16`` bits (see ``engines.as_numba``).
"""
from functools import lru_cache

import torch
from numba import cuda, float32, int16
from numba.types import float16

from .. import engines
from .. import ptx
from ..common import cdiv
from ..ptx import FRAG_AB, FRAG_C, SMEM_ALIGN, wmma_load_a, wmma_load_b, wmma_mma, wmma_store_d
from . import FP16_BF16, Kernel
from .tc_common import check_bf16

PAD = 8                      # elements of padding per shared row (16 bytes)
GPU_CONFIG = dict(BM=128, BN=128, BK=32, WM=64, WN=32)   # 8 warps, 4 x 2 fragments each
SIM_CONFIG = dict(BM=32, BN=32, BK=16, WM=16, WN=16)     # 4 warps, 1 fragment each


@lru_cache(maxsize=None)
def make_block_kernel(BM=128, BN=128, BK=32, WM=64, WN=32, bf16=False):
    """A block of (BM/WM) x (BN/WN) warps sharing padded A and B tiles in shared memory;
    each warp a WM x WN tile of C, FM x FN fragments."""
    dt = int16 if bf16 else float16                  # bf16 travels as its 16 bits
    to_out = ptx.f32_to_bf16 if bf16 else ptx.f32_to_f16
    WARPS_M, WARPS_N = BM // WM, BN // WN
    NWARPS = WARPS_M * WARPS_N
    NT = 32 * NWARPS                                 # threads per block
    FM, FN = WM // 16, WN // 16                      # fragments per warp, down and across
    LDA, LDB = BK + PAD, BN + PAD                    # padded row strides of sA, sB
    if BM % WM or BN % WN or WM % 16 or WN % 16 or BK % 16:
        raise ValueError(f"k05_wmma_block tiles: BM ({BM}) and BN ({BN}) must be multiples of the "
                         f"warp tile WM x WN ({WM} x {WN}), which must be multiples of 16, "
                         f"as must BK ({BK})")

    @cuda.jit
    def wmma_block(A, B, C, K):
        # -- shared tiles, laid out as the fragments are loaded: row-major, padded
        sA = cuda.shared.array((BM, LDA), dt, alignment=SMEM_ALIGN)        # (BM, BK)
        sB = cuda.shared.array((BK, LDB), dt, alignment=SMEM_ALIGN)        # (BK, BN)
        sC = cuda.shared.array((NWARPS, 16, 16), float32, alignment=SMEM_ALIGN)
        # -- fragments: this lane's share of 16x16 tiles (opaque), in registers
        rA = cuda.local.array((FM, FRAG_AB), dt)
        rB = cuda.local.array((FN, FRAG_AB), dt)
        acc = cuda.local.array((FM, FN, FRAG_C), float32)

        M, N = C.shape
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        wm, wn = warp // WARPS_N, warp % WARPS_N     # this warp's tile in the block tile
        bm, bn = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        for i in range(FM):
            for j in range(FN):
                for r in range(FRAG_C):
                    acc[i, j, r] = 0.0

        for k0 in range(0, K, BK):
            # -- global -> shared, element by element; outside A or B: zeros
            for e in range(tid, BM * BK, NT):
                r, c = e // BK, e % BK
                if bm + r < M and k0 + c < K:
                    sA[r, c] = A[bm + r, k0 + c]
                else:
                    sA[r, c] = 0
            for e in range(tid, BK * BN, NT):
                r, c = e // BN, e % BN
                if k0 + r < K and bn + c < N:
                    sB[r, c] = B[k0 + r, bn + c]
                else:
                    sB[r, c] = 0
            cuda.syncthreads()
            # -- the warp tile: FM x FN fragments of C, 16 deep at a time
            for kk in range(0, BK, 16):
                for i in range(FM):
                    wmma_load_a(rA[i], sA, (wm * WM + i * 16, kk), LDA, "row")
                for j in range(FN):
                    wmma_load_b(rB[j], sB, (kk, wn * WN + j * 16), LDB, "row")
                for i in range(FM):
                    for j in range(FN):
                        wmma_mma(acc[i, j], rA[i], rB[j], "row", "row")
            cuda.syncthreads()                       # all reads done before the next copy

        # -- epilogue: each fragment through this warp's 16x16 scratch tile, masked stores
        for i in range(FM):
            for j in range(FN):
                wmma_store_d(sC, (warp, 0, 0), 16, acc[i, j], "row")
                cuda.syncthreads()
                for t in range(8):                    # 256 elements, 8 per lane
                    r, c = t * 2 + lane // 16, lane % 16
                    gr = bm + wm * WM + i * 16 + r
                    gc = bn + wn * WN + j * 16 + c
                    if gr < M and gc < N:
                        C[gr, gc] = to_out(sC[warp, r, c])
                cuda.syncthreads()

    wmma_block.threads = NT
    return wmma_block


def wmma_block(a, b, c, config=None):
    """C = A @ B, a block of warps sharing shared-memory tiles. Any shape (masks), any
    strides (no copy); ``config`` overrides the tile configuration."""
    check_bf16(a.dtype)
    cfg = dict(GPU_CONFIG if engines.on_gpu() else SIM_CONFIG, **(config or {}))
    kernel = make_block_kernel(**cfg, bf16=a.dtype == torch.bfloat16)
    M, N = c.shape
    grid = (cdiv(N, cfg["BN"]), cdiv(M, cfg["BM"]))
    A, B, C = engines.as_numba(a), engines.as_numba(b), engines.as_numba(c)
    kernel[grid, kernel.threads, engines.numba_stream()](A, B, C, a.shape[1])


def _ptx(cc, bf16=False):
    dt = "int16" if bf16 else "float16"
    return (make_block_kernel(**GPU_CONFIG, bf16=bf16).py_func,
            f"void({dt}[:, :], {dt}[:, :], {dt}[:, ::1], int64)")


KERNELS = [
    Kernel("k05_wmma_block", 5, "numba", FP16_BF16,
           "WMMA, a block of warps: padded shared tiles, FM x FN fragments per warp",
           launch=wmma_block, min_cc=(8, 0), ptx=_ptx, source=make_block_kernel, step=2,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
