"""Lesson 05: tensor cores through WMMA: fp16/bf16 in, fp32 accumulation, fragments.

A tensor core multiplies small tiles in one warp-wide instruction: ``wmma.mma`` computes a
16x16x16 product (4096 multiply-adds) for the whole warp, where a SIMT kernel needs 4096
FMAs spread over 32 lanes. The kernel is tiled three times:

====================  ==============================  ==================================
level                 tile                            who
====================  ==============================  ==================================
block tile            BM x BN of C, K in steps of BK  one thread block (WARPS_M x WARPS_N
                                                      warps); A and B tiles in shared
warp tile             WM x WN of C                    one warp: FM x FN fragments
fragment              16 x 16 (x 16 deep)             one ``wmma_mma`` of the warp
====================  ==============================  ==================================

Shared-memory layout matched to the fragments: ``sA`` holds the A tile row-major
(BM x BK) and is read with ``wmma_load_a(..., "row")``, ``sB`` holds B row-major (BK x BN)
and is read with ``wmma_load_b(..., "row")``; the layout named in the load must be the
one the data has, and ``wmma_mma`` must be told the same layouts. Each row is padded by 8
elements (16 bytes) so that the 8 rows one ``ldmatrix`` phase reads fall in different
banks (row stride 80 bytes for BK = 32: banks 0, 20, 8, 28, ... never twice).

Inputs: fp16 (``float16``) or bf16 (raw ``int16`` bits, see ``engines.as_numba``), any
shape, any strides: the loads into shared memory are element-wise with masks (zeros outside
A and B), the stores to C are masked, so no padding or copy is needed. Output in the input
dtype, rounded from the fp32 accumulator. The accumulator leaves the tensor core through
shared memory (``wmma_store_d``), because which lane holds which element of a fragment is
not specified.
"""
from functools import lru_cache

from numba import cuda, float32, int16
from numba.types import float16

from .. import engines
from .. import ptx
from ..ptx import (FRAG_AB, FRAG_C, SMEM_ALIGN, wmma_load_a, wmma_load_b, wmma_mma,
                   wmma_store_d)
from . import FP16_BF16, Kernel

PAD = 8                      # elements of padding per shared row (16 bytes)
GPU_CONFIG = dict(BM=128, BN=128, BK=32, WM=64, WN=32)   # 8 warps, 4 x 2 fragments each
SIM_CONFIG = dict(BM=32, BN=32, BK=16, WM=16, WN=16)     # 4 warps, 1 fragment each


@lru_cache(maxsize=None)
def make_kernel(BM=128, BN=128, BK=32, WM=64, WN=32, bf16=False, b_layout="row"):
    """The WMMA kernel for one tile configuration (fp16, or bf16 with ``bf16=True``).

    ``b_layout`` is the layout the kernel *tells* the tensor core sB has. sB is stored
    row-major, so "row" is right; "col" builds the broken variant lesson 05 shows (the
    fragments then hold B transposed, tile by tile)."""
    dt = int16 if bf16 else float16                  # bf16 travels as its 16 bits
    to_out = ptx.f32_to_bf16 if bf16 else ptx.f32_to_f16
    WARPS_M, WARPS_N = BM // WM, BN // WN
    NWARPS = WARPS_M * WARPS_N
    NT = 32 * NWARPS                                 # threads per block
    FM, FN = WM // 16, WN // 16                      # fragments per warp, down and across
    LDA, LDB = BK + PAD, BN + PAD                    # padded row strides of sA, sB
    assert BM % WM == 0 and BN % WN == 0 and WM % 16 == 0 and WN % 16 == 0 and BK % 16 == 0

    @cuda.jit
    def wmma_gemm(A, B, C):
        # -- shared tiles, laid out as the fragments are loaded: row-major, padded
        sA = cuda.shared.array((BM, LDA), dt, alignment=SMEM_ALIGN)        # (BM, BK)
        sB = cuda.shared.array((BK, LDB), dt, alignment=SMEM_ALIGN)        # (BK, BN)
        sC = cuda.shared.array((NWARPS, 16, 16), float32, alignment=SMEM_ALIGN)
        # -- fragments: this lane's share of 16x16 tiles (opaque), in registers
        rA = cuda.local.array((FM, FRAG_AB), dt)
        rB = cuda.local.array((FN, FRAG_AB), dt)
        acc = cuda.local.array((FM, FN, FRAG_C), float32)

        M, K = A.shape
        N = B.shape[1]
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        wm, wn = warp // WARPS_N, warp % WARPS_N     # this warp's tile in the block tile
        bm, bn = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        for i in range(FM):
            for j in range(FN):
                for r in range(FRAG_C):
                    acc[i, j, r] = 0.0

        for k0 in range(0, K, BK):
            # -- global -> shared, element by element, zeros outside A and B
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
                    wmma_load_b(rB[j], sB, (kk, wn * WN + j * 16), LDB, b_layout)
                for i in range(FM):
                    for j in range(FN):
                        wmma_mma(acc[i, j], rA[i], rB[j], "row", b_layout)
            cuda.syncthreads()

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

    wmma_gemm.threads = NT
    return wmma_gemm


def _config():
    return GPU_CONFIG if engines.on_gpu() else SIM_CONFIG


def _check_bf16(dtype):
    import torch
    eng = engines.engine()
    if dtype == torch.bfloat16 and eng.kind == "cuda" and eng.capability < (8, 0):
        raise ValueError(f"bf16 tensor cores need compute capability 8.0; {eng.device_name} "
                         "has " + ".".join(map(str, eng.capability)) + ": use float16")


def wmma(a, b, c, config=None, b_layout="row"):
    """C = A @ B on tensor cores (WMMA m16n16k16, fp32 accumulation), fp16 or bf16.

    Any shape and strides: the kernel masks its loads (zeros outside A and B) and its stores.
    ``config`` overrides the tile configuration (BM, BN, BK, WM, WN).
    """
    import torch
    _check_bf16(a.dtype)
    cfg = dict(_config(), **(config or {}))
    kernel = make_kernel(**cfg, bf16=a.dtype == torch.bfloat16, b_layout=b_layout)
    M, N = c.shape
    grid = ((N + cfg["BN"] - 1) // cfg["BN"], (M + cfg["BM"] - 1) // cfg["BM"])
    A, B, C = engines.as_numba(a), engines.as_numba(b), engines.as_numba(c)
    kernel[grid, kernel.threads, engines.numba_stream()](A, B, C)


def _ptx(cc, bf16=False):
    dt = "int16" if bf16 else "float16"
    return (make_kernel(**GPU_CONFIG, bf16=bf16).py_func,
            f"void({dt}[:, :], {dt}[:, :], {dt}[:, ::1])")


KERNELS = [
    Kernel("k05_wmma", 5, "numba", FP16_BF16,
           "tensor cores via WMMA 16x16x16: block, warp and fragment tiles, padded shared",
           launch=wmma, min_cc=(7, 0), ptx=_ptx, source=make_kernel),
]
