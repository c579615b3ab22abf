"""Lesson 05, step 3: tensor cores through WMMA, the finished kernel: ``k05_wmma_block`` with
its tiles copied in 16-byte chunks by ``cp.async`` and launch bounds for two blocks per SM.

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

Each step of K: (1) copy the A and B tiles into shared memory in 16-byte chunks (8 halves
per copy instruction, one ``cp.async`` each: global to shared with no register in between),
(2) wait for the copies and for every thread (``cp_async_wait_group(0)``, ``syncthreads``),
(3) the tensor-core math, (4) ``syncthreads`` before the next copies overwrite the tiles.
Nothing overlaps: while the tiles travel the tensor cores idle. Lesson 06 keeps several
tiles in flight instead.

Shared-memory layout matched to the fragments: ``sA`` holds the A tile row-major
(BM x BK) and is read with ``wmma_load_a(..., "row")``, ``sB`` holds B row-major (BK x BN)
and is read with ``wmma_load_b(..., "row")``; the layout named in the load must be the one
the data has, and ``wmma_mma`` must be told the same layouts. Each row is padded by 8
elements (16 bytes): the row stride stays a multiple of 16 bytes (every chunk aligned) and
the 8 rows one ``ldmatrix`` phase reads fall in different banks (stride 80 bytes for
BK = 32: banks 0, 20, 8, 28, ... never twice).

Shapes and strides: a chunk is 8 consecutive elements of a row, so a row must start
16-byte aligned. The launcher passes an operand as it is when it is row-major with a row
stride that is a multiple of 8 elements and an aligned start, and otherwise (transposed,
sliced, a width that is not a multiple of 8) copies it into a zero-padded aligned buffer.
In the kernel a chunk is then either wholly inside the operand or wholly outside it: one
test per chunk, and a chunk outside is written as zeros by the copy itself (its source
size is 0 bytes). Stores to C are masked element by element. Output in the input dtype,
rounded from the fp32 accumulator, which leaves the tensor core through shared memory
(``wmma_store_d``): which lane holds which element of a fragment is not specified.

Inputs: fp16 (``float16``) or bf16 (raw ``int16`` bits, see ``engines.as_numba``).
Needs compute capability 8.0 (cp.async; bf16 tensor cores).
"""
from functools import lru_cache

import torch
from numba import cuda, float32, int16
from numba.types import float16

from .. import engines
from .. import ptx
from ..common import cdiv
from ..ptx import (FRAG_AB, FRAG_C, SMEM_ALIGN, cp_async16_zfill, cp_async_commit_group,
                   cp_async_wait_group, wmma_load_a, wmma_load_b, wmma_mma, wmma_store_d)
from ..ptx_simt import launch_bounds
from . import FP16_BF16, Kernel
from .k05_wmma_block import GPU_CONFIG, PAD, SIM_CONFIG  # the tiles of k05_wmma_block
from .tc_common import check_bf16

MIN_BLOCKS = 2               # blocks per SM the registers must allow (one waits, one computes)


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
    CA, CB = BK // 8, BN // 8                        # 16-byte chunks per row of sA, sB
    if BM % WM or BN % WN or WM % 16 or WN % 16 or BK % 16:
        raise ValueError(f"k05_wmma tiles: BM ({BM}) and BN ({BN}) must be multiples of the "
                         f"warp tile WM x WN ({WM} x {WN}), which must be multiples of 16, "
                         f"as must BK ({BK})")

    @cuda.jit(**launch_bounds(NT, MIN_BLOCKS))       # 2 blocks of 256 threads: <= 128 registers
    def wmma_gemm(A, B, C, K):
        # -- shared tiles, laid out as the fragments are loaded: row-major, padded
        sA = cuda.shared.array((BM, LDA), dt, alignment=SMEM_ALIGN)        # (BM, BK)
        sB = cuda.shared.array((BK, LDB), dt, alignment=SMEM_ALIGN)        # (BK, BN)
        sC = cuda.shared.array((NWARPS, 16, 16), float32, alignment=SMEM_ALIGN)
        # -- fragments: this lane's share of 16x16 tiles (opaque), in registers
        rA = cuda.local.array((FM, FRAG_AB), dt)
        rB = cuda.local.array((FN, FRAG_AB), dt)
        acc = cuda.local.array((FM, FN, FRAG_C), float32)

        M, N = C.shape
        KA, NB = A.shape[1], B.shape[1]              # widths, multiples of 8 (zero-padded)
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        wm, wn = warp // WARPS_N, warp % WARPS_N     # this warp's tile in the block tile
        bm, bn = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        for i in range(FM):
            for j in range(FN):
                for r in range(FRAG_C):
                    acc[i, j, r] = 0.0

        for k0 in range(0, K, BK):
            # -- global -> shared in 16-byte chunks; a chunk outside A or B lands as zeros
            for e in range(tid, BM * CA, NT):
                r, c = e // CA, e % CA * 8
                ok = bm + r < M and k0 + c < KA
                cp_async16_zfill(sA, (r, c), A, (bm + r if ok else 0, k0 + c if ok else 0),
                                 16 if ok else 0)
            for e in range(tid, BK * CB, NT):
                r, c = e // CB, e % CB * 8
                ok = k0 + r < K and bn + c < NB
                cp_async16_zfill(sB, (r, c), B, (k0 + r if ok else 0, bn + c if ok else 0),
                                 16 if ok else 0)
            cp_async_commit_group()
            cp_async_wait_group(0)                   # this thread's copies have landed
            cuda.syncthreads()                       # ... and every other thread's
            # -- the warp tile: FM x FN fragments of C, 16 deep at a time
            for kk in range(0, BK, 16):
                for i in range(FM):
                    wmma_load_a(rA[i], sA, (wm * WM + i * 16, kk), LDA, "row")
                for j in range(FN):
                    wmma_load_b(rB[j], sB, (kk, wn * WN + j * 16), LDB, b_layout)
                for i in range(FM):
                    for j in range(FN):
                        wmma_mma(acc[i, j], rA[i], rB[j], "row", b_layout)
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

    wmma_gemm.threads = NT
    return wmma_gemm


def _config():
    return GPU_CONFIG if engines.on_gpu() else SIM_CONFIG


def aligned_rows(t):
    """``t`` itself when each row starts 16-byte aligned and holds a multiple of 8
    elements (unit column stride, row stride a multiple of 8), else a copy whose width is
    rounded up to a multiple of 8 with zeros: what a 16-byte chunk copy needs."""
    R, W = t.shape
    if t.stride(1) == 1 and W % 8 == 0 and t.data_ptr() % 16 == 0 and \
            (R == 1 or t.stride(0) % 8 == 0):
        return t
    out = torch.zeros(R, cdiv(W, 8) * 8, dtype=t.dtype, device=t.device)
    out[:, :W] = t
    return out


def wmma(a, b, c, config=None, b_layout="row"):
    """C = A @ B on tensor cores (WMMA m16n16k16, fp32 accumulation), fp16 or bf16.

    Any shape and strides: operands whose rows are not 16-byte chunks are copied into
    zero-padded aligned buffers (:func:`aligned_rows`); the kernel zero-fills chunks outside
    A and B and masks its stores. ``config`` overrides the tile configuration."""
    check_bf16(a.dtype)
    cfg = dict(_config(), **(config or {}))
    kernel = make_kernel(**cfg, bf16=a.dtype == torch.bfloat16, b_layout=b_layout)
    M, N = c.shape
    K = a.shape[1]
    grid = (cdiv(N, cfg["BN"]), cdiv(M, cfg["BM"]))
    # the padded copies stay referenced until the launch is queued: engines.as_numba holds
    # no reference, and a freed copy's memory could be handed to the next one before the
    # kernel reads it
    a16, b16 = aligned_rows(a), aligned_rows(b)
    A, B = engines.as_numba(a16), engines.as_numba(b16)
    kernel[grid, kernel.threads, engines.numba_stream()](A, B, engines.as_numba(c), K)


def _ptx(cc, bf16=False):
    dt = "int16" if bf16 else "float16"
    threads = 32 * (GPU_CONFIG["BM"] // GPU_CONFIG["WM"]) * (GPU_CONFIG["BN"] // GPU_CONFIG["WN"])
    return (make_kernel(**GPU_CONFIG, bf16=bf16).py_func,
            f"void({dt}[:, :], {dt}[:, :], {dt}[:, ::1], int64)",
            {"launch_bounds": (threads, MIN_BLOCKS)})


KERNELS = [
    Kernel("k05_wmma", 5, "numba", FP16_BF16,
           "tensor cores via WMMA 16x16x16: 16-byte copies into padded shared tiles",
           launch=wmma, min_cc=(8, 0), ptx=_ptx, source=make_kernel, step=3,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
