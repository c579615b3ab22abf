"""Lesson 05, step 1: one warp, one 16x16 tile of C, K in steps of 16.

``k05_wmma_warp`` runs one warp per block. For each 16-deep step of K the warp copies a
16x16 tile of A and one of B into shared memory, element by element (zeros outside A and B),
loads them into fragments and does one ``wmma_mma``. The result leaves the tensor core
through a 16x16 tile in shared memory (``wmma_store_d``: which lane holds which element of a
fragment is not specified), and the lanes store that tile to C, masked.

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


@lru_cache(maxsize=None)
def make_warp_kernel(bf16=False):
    """One warp per block, one 16x16 tile of C: K in steps of 16, one ``wmma_mma`` each."""
    dt = int16 if bf16 else float16                  # bf16 travels as its 16 bits
    to_out = ptx.f32_to_bf16 if bf16 else ptx.f32_to_f16

    @cuda.jit
    def wmma_warp(A, B, C, K):
        # -- shared tiles: one 16x16 tile of A and one of B, row-major
        sA = cuda.shared.array((16, 16), dt, alignment=SMEM_ALIGN)
        sB = cuda.shared.array((16, 16), dt, alignment=SMEM_ALIGN)
        sC = cuda.shared.array((16, 16), float32, alignment=SMEM_ALIGN)
        # -- fragments: this lane's share of 16x16 tiles (opaque), in registers
        rA = cuda.local.array(FRAG_AB, dt)
        rB = cuda.local.array(FRAG_AB, dt)
        acc = cuda.local.array(FRAG_C, float32)

        M, N = C.shape
        lane = cuda.threadIdx.x
        bm, bn = cuda.blockIdx.y * 16, cuda.blockIdx.x * 16
        for r in range(FRAG_C):
            acc[r] = 0.0

        for k0 in range(0, K, 16):
            # -- global -> shared, 8 elements per lane; outside A or B: zeros
            for e in range(lane, 256, 32):
                r, c = e // 16, e % 16
                if bm + r < M and k0 + c < K:
                    sA[r, c] = A[bm + r, k0 + c]
                else:
                    sA[r, c] = 0
                if k0 + r < K and bn + c < N:
                    sB[r, c] = B[k0 + r, bn + c]
                else:
                    sB[r, c] = 0
            cuda.syncthreads()
            # -- the tensor core: acc += the A tile @ the B tile
            wmma_load_a(rA, sA, (0, 0), 16, "row")
            wmma_load_b(rB, sB, (0, 0), 16, "row")
            wmma_mma(acc, rA, rB, "row", "row")
            cuda.syncthreads()                       # all reads done before the next copy

        # -- epilogue: the fragment through a 16x16 scratch tile, masked stores
        wmma_store_d(sC, (0, 0), 16, acc, "row")
        cuda.syncthreads()
        for t in range(8):                            # 256 elements, 8 per lane
            r, c = t * 2 + lane // 16, lane % 16
            if bm + r < M and bn + c < N:
                C[bm + r, bn + c] = to_out(sC[r, c])

    wmma_warp.threads = 32
    return wmma_warp


def wmma_warp(a, b, c):
    """C = A @ B, one warp and one 16x16 tile of C per block. Any shape (masks), any
    strides (no copy)."""
    check_bf16(a.dtype)
    kernel = make_warp_kernel(bf16=a.dtype == torch.bfloat16)
    M, N = c.shape
    A, B, C = engines.as_numba(a), engines.as_numba(b), engines.as_numba(c)
    kernel[(cdiv(N, 16), cdiv(M, 16)), 32, engines.numba_stream()](A, B, C, a.shape[1])


def _ptx(cc, bf16=False):
    dt = "int16" if bf16 else "float16"
    return (make_warp_kernel(bf16=bf16).py_func,
            f"void({dt}[:, :], {dt}[:, :], {dt}[:, ::1], int64)")


KERNELS = [
    Kernel("k05_wmma_warp", 5, "numba", FP16_BF16,
           "WMMA, one warp per block: a 16x16 tile of C, one wmma_mma per 16 of K",
           launch=wmma_warp, min_cc=(8, 0), ptx=_ptx, source=make_warp_kernel, step=1),
]
