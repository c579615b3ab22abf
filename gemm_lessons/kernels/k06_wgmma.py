"""Lesson 06, last step: Hopper's ``wgmma``, fed by the same cp.async pipeline.

``k06_cp_async`` feeds the tensor cores through registers: every 16-deep k-slice each
warp copies its fragments from shared memory to registers (``ldmatrix``) before its
``mma.sync``, and those copies, their registers and the warp-wide instructions take issue
slots and registers that the math could use. Compute capability 9.0 adds ``wgmma.mma_async``
(:mod:`gemm_lessons.ptx_hopper`): a *warpgroup* (128 threads) multiplies a 64 x N x 16 tile
with both operands read by the tensor cores **directly from shared memory**, asynchronously.
No fragments, no ``ldmatrix``; the threads only issue copies and instructions.

The kernel: BM x BN x 64 block tiles (BM = 64 per warpgroup: 128 x 256 with two
warpgroups on a GPU), STAGES buffers in shared memory in the 128-byte-swizzle layout wgmma
reads (A K-major, B N-major: the operands as they lie in row-major memory, no transpose),
written by ``cp.async`` at swizzled addresses. Per k-tile t:

1. ``cp_async_wait_group`` (tile t has landed), ``fence_proxy_async`` (make the copies
   visible to the tensor cores' *async proxy*), ``syncthreads``;
2. ``wgmma_fence``, four ``wgmma_mma`` (k = 0, 16, 32, 48 of the tile),
   ``wgmma_commit_group``: the tensor cores start on tile t;
3. while they work, issue the copies of tile t + STAGES - 2 into the stage that tile t - 2
   used (every warpgroup finished reading it: step 4 of the previous tile, then the barrier);
4. ``wgmma_wait_group(1)``: tile t - 1's products are done, tile t's may still run.

Epilogue as ``k06_cp_async``: ``Out = alpha * A @ B + beta * C``; ``beta == 0`` never reads
C, ``alpha == 0`` never reads A or B. Every shape: copies zero-filled past M, N and before
the ragged start of K (tile 0 starts at k = -(k_tiles * 64 - K)); the launcher pads rows
that are not 16-byte aligned, as for ``k06_cp_async``.
"""
from dataclasses import dataclass
from functools import lru_cache

import torch
from numba import cuda, float32, int16
from numba.types import float16

from .. import ptx
from ..ptx import cp_async16_zfill, cp_async_commit_group, cp_async_wait_group
from ..ptx_hopper import (SWIZZLE_SMEM_ALIGN, fence_proxy_async, swizzle128,
                          wgmma_commit_group, wgmma_fence, wgmma_mma, wgmma_store_d,
                          wgmma_wait_group)
from . import FP16_BF16, Kernel
from .tc_common import (TileConfig, check_hopper, engine_config, grouped_block, launch,
                        ptx_hook)

BK = 64              # one 128-byte swizzle row of fp16: the k-depth of a tile


@dataclass(frozen=True)
class WgmmaConfig(TileConfig):
    """Tiles of the wgmma kernel: BM = 64 x (warpgroups), BN = the N of each wgmma (64, 128
    or 256; 192 needs BM = 192: each thread's B chunks lie a multiple of 8 rows apart),
    STAGES >= 3 shared buffers (STAGES - 2 tiles in flight while one is multiplied and the
    one before it may still be); GROUP_M block rows walk across N together. The
    accumulators take BN / 2 registers per thread: BM = 256 with BN = 256 does not fit."""
    BM: int = 128
    BN: int = 256
    STAGES: int = 4
    GROUP_M: int = 8

    def rules(self):
        BM, BN = self.BM, self.BN
        b_rows = 2 * BM // (BN // 8) if BN >= 8 else 0
        return [(BM >= 64 and BM % 64 == 0, "BM a multiple of 64 (one warpgroup per 64 rows)"),
                 (BN in (64, 128, 192, 256), "BN 64, 128, 192 or 256 (a wgmma's N)"),
                 (self.STAGES >= 3, "STAGES >= 3 (a tile in flight, one multiplied, one "
                                    "perhaps still read)"),
                 (self.GROUP_M >= 1, "GROUP_M >= 1"),
                 (BN in (64, 128, 192, 256) and b_rows % 8 == 0 and
                  (BK * BN // 8) % (2 * BM) == 0,
                  f"each thread's B chunks a multiple of 8 rows apart with {2 * BM} threads "
                  "(one swizzle for all of them)")]


GPU_CONFIG = WgmmaConfig(BM=128, BN=256, STAGES=4)
SIM_CONFIG = WgmmaConfig(BM=64, BN=64, STAGES=4)      # the same loop, one warpgroup


@lru_cache(maxsize=None)
def make_kernel(cfg, bf16=False):
    """The wgmma kernel for one :class:`WgmmaConfig` (fp16, or bf16 with ``bf16=True``)."""
    BM, BN, STAGES, GROUP_M = cfg.BM, cfg.BN, cfg.STAGES, cfg.GROUP_M
    dt = int16 if bf16 else float16
    to_f32 = ptx.bf16_to_f32 if bf16 else ptx.f16_to_f32
    to_out = ptx.f32_to_bf16 if bf16 else ptx.f32_to_f16
    NT = 2 * BM                                     # 128 threads per 64 rows
    NACC = BN // 2                                  # accumulators per thread
    A_STAGE, B_STAGE = BM * BK, BK * BN             # elements per stage
    STAGE = A_STAGE + B_STAGE
    B_LBO = BK * 128                                # bytes between B's 64-column atoms
    B_CPR = BN // 8                                 # 16-byte chunks per row of a B tile
    A_ITERS, B_ITERS = BM * 8 // NT, BK * B_CPR // NT   # chunks per thread per tile
    A_ROWS, B_ROWS = NT // 8, NT // B_CPR           # tile rows between a thread's chunks
    AHEAD = STAGES - 2                              # tiles in flight past the current
    WAIT = AHEAD - 1                                # cp.async groups left in flight
    LDC = BN + 4                                    # epilogue scratch row (floats)
    OUT_ITERS = BM * BN // NT                       # output elements per thread
    SMEM_BYTES = max(STAGES * STAGE * 2, BM * LDC * 4)

    @cuda.jit(device=True, inline="always")
    def issue(A, B, smem, t, shift, k_tiles, a_dst, a_src, a_rows, a_k, b_dst, b_src,
              b_k, b_nb, lda, ldb):
        """cp.async of tile t (if there is one) into its stage; always commits a group."""
        if t < k_tiles:
            base = (t % STAGES) * STAGE
            k0 = t * BK - shift
            for it in range(A_ITERS):
                ok = it * A_ROWS < a_rows and k0 + a_k >= 0
                cp_async16_zfill(smem, base + a_dst + it * A_ROWS * BK,
                                 A, a_src + it * A_ROWS * lda + k0 if ok else 0,
                                 16 if ok else 0)
            for it in range(B_ITERS):
                ok = k0 + b_k + it * B_ROWS >= 0 and b_nb > 0
                cp_async16_zfill(smem, base + A_STAGE + b_dst + it * B_ROWS * 64,
                                 B, b_src + (k0 + it * B_ROWS) * ldb if ok else 0,
                                 b_nb if ok else 0)
        cp_async_commit_group()

    @cuda.jit
    def wgmma_gemm(A, B, C, Out, M, N, K, lda, ldb, alpha, beta):
        # A: (M, K), B: (K, N) as flat arrays with row strides lda, ldb (16-byte rows);
        # C: read when beta != 0; Out: (M, N); alpha, beta: float32
        smem = cuda.shared.array(0, dt, alignment=SWIZZLE_SMEM_ALIGN)  # STAGES x (A, B)
        sC = cuda.shared.array(0, float32, alignment=SWIZZLE_SMEM_ALIGN)  # epilogue
        acc = cuda.local.array(NACC, float32)
        tid = cuda.threadIdx.x
        wg = tid // 128                               # this thread's warpgroup
        # -- block order: GROUP_M bands of blocks walk across N together (L2 reuse)
        bm, bn = grouped_block(cuda.blockIdx.x, M, N, BM, BN, GROUP_M)

        for i in range(NACC):
            acc[i] = float32(0.0)
        k_tiles = (K + BK - 1) // BK if alpha != 0 else 0
        shift = k_tiles * BK - K

        # -- the copy plan. A: chunk (row r, k-chunk c) of the tile goes to byte
        #    swizzle128(128 r + 16 c) of the stage; B: chunk (k-row k, column chunk q) to
        #    byte (q // 8) * B_LBO + swizzle128(128 k + 16 (q % 8)). A thread's chunks are
        #    A_ROWS (B_ROWS) rows apart, a multiple of 8: one swizzle for all of them.
        ar, ac = tid // 8, tid % 8
        a_dst = swizzle128(ar * 128 + ac * 16) // 2
        a_src = (bm + ar) * lda + ac * 8
        a_rows = M - bm - ar
        br, bq = tid // B_CPR, tid % B_CPR
        b_dst = ((bq // 8) * B_LBO + swizzle128(br * 128 + (bq % 8) * 16)) // 2
        b_src = br * ldb + bn + bq * 8
        b_nb = min(16, max(0, (N - bn - bq * 8) * 2))

        for s in range(AHEAD):
            issue(A, B, smem, s, shift, k_tiles, a_dst, a_src, a_rows, ac * 8, b_dst,
                  b_src, br, b_nb, lda, ldb)
        a_wg = wg * 64 * BK                            # this warpgroup's 64 rows of A
        for kt in range(k_tiles):
            cp_async_wait_group(WAIT)                  # tile kt has landed (these copies)
            fence_proxy_async()                        # ... and is visible to wgmma
            cuda.syncthreads()                         # ... for every thread's copies
            base = (kt % STAGES) * STAGE
            wgmma_fence()
            wgmma_mma(acc, smem, base + a_wg, smem, base + A_STAGE, BN, B_LBO)
            wgmma_mma(acc, smem, base + a_wg + 16, smem, base + A_STAGE + 16 * 64, BN, B_LBO)
            wgmma_mma(acc, smem, base + a_wg + 32, smem, base + A_STAGE + 32 * 64, BN, B_LBO)
            wgmma_mma(acc, smem, base + a_wg + 48, smem, base + A_STAGE + 48 * 64, BN, B_LBO)
            wgmma_commit_group()
            issue(A, B, smem, kt + AHEAD, shift, k_tiles, a_dst, a_src, a_rows, ac * 8,
                  b_dst, b_src, br, b_nb, lda, ldb)
            wgmma_wait_group(1, acc, NACC)             # tile kt - 1 is done
        wgmma_wait_group(0, acc, NACC)
        cp_async_wait_group(0)

        cuda.syncthreads()                            # the stages become the scratch
        # -- epilogue: accumulators to shared memory (fragment order), then rows out
        wgmma_store_d(sC, wg * 64 * LDC, LDC, acc, BN)
        cuda.syncthreads()
        for e in range(OUT_ITERS):
            r, c = (e * NT + tid) // BN, (e * NT + tid) % BN
            gr, gc = bm + r, bn + c
            if gr < M and gc < N:
                v = alpha * sC[r * LDC + c]
                if beta != 0:
                    v += beta * to_f32(C[gr, gc])
                Out[gr, gc] = to_out(v)

    wgmma_gemm.threads = NT
    wgmma_gemm.smem_bytes = SMEM_BYTES
    wgmma_gemm.config = cfg
    return wgmma_gemm


# ------------------------------------------------------------------------------ launchers
def kernel_for(config=None, bf16=False):
    """The kernel object :func:`run` launches for ``config`` (overrides of this engine's
    configuration)."""
    return make_kernel(engine_config(GPU_CONFIG, SIM_CONFIG, config), bf16)


def run(a, b, c, out, alpha=1.0, beta=0.0, config=None):
    """``out = alpha * a @ b + beta * c`` with wgmma; ``c`` may be None when ``beta == 0``."""
    check_hopper(KERNELS[0], "wgmma exists")
    cfg = engine_config(GPU_CONFIG, SIM_CONFIG, config)
    kernel = make_kernel(cfg, a.dtype == torch.bfloat16)
    launch(kernel, a, b, c, out, alpha, beta, cfg.BM, cfg.BN)


def wgmma(a, b, c):
    """C = A @ B on Hopper's warpgroup tensor-core instruction (fp16/bf16 in, fp32
    accumulation), operands read from swizzled shared memory filled by cp.async."""
    run(a, b, None, c)


def blas_gemm(a3, b3, c3, out, alpha, beta, bias, activation):
    """gl.gemm hook: ``out = alpha * a @ b + beta * c`` (3-D views with one batch)."""
    run(a3[0], b3[0], None if c3 is None else c3[0], out[0], alpha, beta)


KERNELS = [
    Kernel("k06_wgmma", 6, "numba", FP16_BF16,
           "Hopper wgmma: tensor cores read swizzled shared memory filled by cp.async",
           launch=wgmma, min_cc=(9, 0), cc_below=(10, 0), ptx=ptx_hook(make_kernel, GPU_CONFIG),
           source=make_kernel, gemm=blas_gemm, features=frozenset({"alpha_beta"}), step=4,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
