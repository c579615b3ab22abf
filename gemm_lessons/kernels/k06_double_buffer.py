"""Lesson 06, step 1: double buffering with cp.async (``k06_double_buffer``).

Lesson 05 loads a tile, waits (``syncthreads``), computes, waits again: while a tile
travels from global memory nothing computes, and while the warps compute nothing travels.
``cp.async`` (compute capability 8.0) starts a 16-byte copy from global straight to shared
memory (no registers in between) and lets the thread go on. The copies a thread issues
between two ``cp_async_commit_group()`` form a *group*; ``cp_async_wait_group(N)`` waits
until at most the N newest groups of this thread are still in flight.

With two shared buffers (stages) the copy of tile t + 1 flies while the tensor cores work
on tile t. Per k-tile t:

1. ``cp_async_wait_group(0)``: this thread's copies of tile t have landed;
2. ``syncthreads``: every thread's have, and every warp has finished reading tile t - 1,
   whose buffer the next copy overwrites (one barrier does both jobs of lesson 05's two);
3. issue the copies of tile t + 1 into that buffer, ``cp_async_commit_group``;
4. the tensor-core math of tile t (WMMA, as in lesson 05).

Each thread works out once which 16-byte chunks of the A and B tiles it copies (its *copy
plan*): one column of chunks, A_ROWS (B_ROWS) rows apart. Edges: a chunk past M or N reads
fewer or no bytes and the zero-filling form of cp.async writes zeros for the rest; K is
walked from its ragged end (tile 0 starts at k = -(k_tiles * BK - K)), so only the first
tile needs a K check; the launcher copies an operand whose rows are not 16-byte aligned
(transposed, sliced, K or N not a multiple of 8) into a zero-padded buffer
(:func:`~gemm_lessons.kernels.tc_common.rows16`).

Epilogue (BLAS): ``Out = alpha * A @ B + beta * C``; ``beta == 0`` never reads C, and
``alpha == 0`` never reads A or B (the K loop runs zero times).
"""
from functools import lru_cache

from numba import cuda, float32, int16, int32
from numba.types import float16

from .. import ptx
from ..ptx import (FRAG_AB, FRAG_C, WMMA_SMEM_ALIGN, cp_async16_zfill,
                   cp_async_commit_group, cp_async_wait_group, wmma_load_a, wmma_load_b,
                   wmma_mma, wmma_store_d)
from . import FP16_BF16, Kernel
from .tc_common import PipelineConfig, grouped_block, launchers, ptx_hook

PAD = 8          # elements of padding per shared row: 16 bytes, keeps ldmatrix conflict-free
GPU_CONFIG = PipelineConfig(BM=128, BN=256, BK=64, WM=64, WN=64, STAGES=2)   # 102 KiB
SIM_CONFIG = PipelineConfig(BM=32, BN=32, BK=64, WM=16, WN=16, STAGES=2)     # the same loop


@lru_cache(maxsize=None)
def make_kernel(cfg, bf16=False):
    """The double-buffered cp.async kernel feeding WMMA, for one :class:`PipelineConfig`
    with STAGES = 2 (fp16, or bf16 with ``bf16=True``)."""
    BM, BN, BK, STAGES, GROUP_M = cfg.BM, cfg.BN, cfg.BK, cfg.STAGES, cfg.GROUP_M
    WM, WN = cfg.WM, cfg.WN                              # the warp tile
    dt = int16 if bf16 else float16                      # bf16 travels as its 16 bits
    to_f32 = ptx.bf16_to_f32 if bf16 else ptx.f16_to_f32
    to_out = ptx.f32_to_bf16 if bf16 else ptx.f32_to_f16
    WARPS_M, WARPS_N = BM // WM, BN // WN
    NT = 32 * WARPS_M * WARPS_N                          # threads per block
    FM, FN = WM // 16, WN // 16                          # fragments per warp
    LDA, LDB = BK + PAD, BN + PAD                        # shared row strides (elements)
    A_STAGE, B_STAGE = BM * LDA, BK * LDB                # elements per stage
    B_BASE = STAGES * A_STAGE                            # sB follows the A stages
    A_CPR, B_CPR = BK // 8, BN // 8                      # 16-byte chunks per tile row
    A_ITERS = (BM * A_CPR + NT - 1) // NT                # chunks per thread per tile
    B_ITERS = (BK * B_CPR + NT - 1) // NT
    A_EXACT = BM * A_CPR % NT == 0                       # every thread has A_ITERS chunks
    B_EXACT = BK * B_CPR % NT == 0
    A_ROWS, B_ROWS = NT // A_CPR, NT // B_CPR            # tile rows between a thread's chunks
    LDC = WN + 4                                         # epilogue scratch row (floats)
    C_WARP = 16 * LDC                                    # scratch floats per warp
    OUT_ITERS = 16 * WN // 32                            # epilogue elements per lane
    SMEM_BYTES = max(2 * STAGES * (A_STAGE + B_STAGE), 4 * C_WARP * NT // 32)
    KSTEPS = BK // 16                                    # 16-deep k-slices per tile
    if STAGES != 2:
        raise ValueError(f"{cfg}: double buffering has STAGES = 2 (k06_multistage "
                         "takes more)")

    @cuda.jit
    def cp_async_gemm(A, B, C, Out, M, N, K, lda, ldb, alpha, beta):
        # A: (M, K) and B: (K, N) as flat arrays with row strides lda, ldb (16-byte rows);
        # C: read when beta != 0; Out: (M, N), written; alpha, beta: float32
        smem = cuda.shared.array(0, dt, alignment=WMMA_SMEM_ALIGN)  # 2 x (sA, sB)
        sC = cuda.shared.array(0, float32, alignment=WMMA_SMEM_ALIGN)  # epilogue, same memory
        rA = cuda.local.array((FM, FRAG_AB), dt)              # this warp's fragments
        rB = cuda.local.array((FN, FRAG_AB), dt)
        acc = cuda.local.array((FM, FN, FRAG_C), float32)

        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        wm, wn = warp // WARPS_N, warp % WARPS_N
        # -- block order: GROUP_M bands of blocks walk across N together (L2 reuse)
        bm, bn = grouped_block(cuda.blockIdx.x, M, N, BM, BN, GROUP_M)

        for i in range(FM):
            for j in range(FN):
                for r in range(FRAG_C):
                    acc[i, j, r] = 0.0
        k_tiles = (K + BK - 1) // BK if alpha != 0 else 0  # alpha == 0: no product
        shift = k_tiles * BK - K             # tile 0 starts at k = -shift: only it is ragged

        # -- the copy plan, computed once. A thread's 16-byte chunks of a tile lie in one
        #    column of chunks, A_ROWS (B_ROWS) rows apart: where the first goes in a stage
        #    and where it comes from (at k = 0); chunk `it` is `it` steps further. Chunks
        #    past M or N read no bytes (0 at the N edge: fewer than 16; the rest zero-filled)
        ar, ac = tid // A_CPR, (tid % A_CPR) * 8         # first chunk of A: row, column
        a_dst = ar * LDA + ac
        a_src = (bm + ar) * lda + ac                     # int64: A may pass 2**31 elements
        a_rows = M - bm - ar                             # rows of A left from the first
        a_step = A_ROWS * lda
        br, bc = tid // B_CPR, (tid % B_CPR) * 8         # first chunk of B: row, column
        b_dst = br * LDB + bc
        b_src = br * ldb + bn + bc
        b_nb = min(16, max(0, (N - bn - bc) * 2))        # the same for all of them
        b_step = B_ROWS * ldb

        def issue(t, ws, first):
            # start the copies of k-tile t (k from t * BK - shift) into stage ws; only the
            # first tile (first=True) has chunks before k = 0, copied as zeros
            if t < k_tiles:
                k0 = t * BK - shift
                kb = k0 * ldb
                sa = ws * A_STAGE
                sb = B_BASE + ws * B_STAGE
                for it in range(A_ITERS):
                    if A_EXACT or ar + it * A_ROWS < BM:
                        nb = 16 if it * A_ROWS < a_rows else 0
                        if first and k0 + ac < 0:
                            nb = 0
                        cp_async16_zfill(smem, sa + a_dst + it * A_ROWS * LDA,
                                         A, a_src + it * a_step + k0, nb)
                for it in range(B_ITERS):
                    if B_EXACT or br + it * B_ROWS < BK:
                        nb = b_nb
                        if first and k0 + br + it * B_ROWS < 0:
                            nb = 0
                        cp_async16_zfill(smem, sb + b_dst + it * B_ROWS * LDB,
                                         B, b_src + it * b_step + kb, nb)
            cp_async_commit_group()          # one group per tile (empty past the end)

        def load_fragments(rs, kk):
            # this warp's FM fragments of A and FN of B, k-slice kk of the tile in stage rs
            sa = rs * A_STAGE + wm * WM * LDA + kk * 16
            sb = B_BASE + rs * B_STAGE + kk * 16 * LDB + wn * WN
            for i in range(FM):
                wmma_load_a(rA[i], smem, sa + i * 16 * LDA, LDA, "row")
            for j in range(FN):
                wmma_load_b(rB[j], smem, sb + j * 16, LDB, "row")

        def tensor_cores():
            for i in range(FM):
                for j in range(FN):
                    wmma_mma(acc[i, j], rA[i], rB[j], "row", "row")

        # -- prologue: tile 0 in flight, into stage 0
        issue(0, int32(0), True)
        # tile t is read from stage rs and tile t + 1 written to stage ws: the other one
        rs, ws = int32(0), int32(1)
        # -- main loop
        for t in range(k_tiles):
            cp_async_wait_group(0)           # tile t has landed (this thread's copies)
            cuda.syncthreads()               # ... everyone's; stage ws (tile t-1's) is free
            issue(t + 1, ws, False)          # start tile t + 1: it lands during the math
            for kk in range(KSTEPS):
                load_fragments(rs, kk)
                tensor_cores()
            ws, rs = rs, ws
        cp_async_wait_group(0)
        cuda.syncthreads()                   # the pipeline's memory becomes the scratch

        # -- epilogue: a 16-row strip of the warp tile at a time through shared memory
        cw = warp * C_WARP
        for i in range(FM):
            for j in range(FN):
                wmma_store_d(sC, cw + j * 16, LDC, acc[i, j], "row")
            cuda.syncthreads()
            for e in range(OUT_ITERS):
                r, c = (e * 32 + lane) // WN, (e * 32 + lane) % WN  # lanes along a row
                gr, gc = bm + wm * WM + i * 16 + r, bn + wn * WN + c
                if gr < M and gc < N:
                    v = alpha * sC[cw + r * LDC + c]
                    if beta != 0:
                        v += beta * to_f32(C[gr, gc])
                    Out[gr, gc] = to_out(v)
            cuda.syncthreads()

    cp_async_gemm.threads = NT
    cp_async_gemm.smem_bytes = SMEM_BYTES
    cp_async_gemm.config = cfg
    return cp_async_gemm


# ------------------------------------------------------------------------------ launchers
# kernel_for(config, bf16), run(a, b, c, out, alpha, beta, config), and the gl.gemm hook
kernel_for, run, blas_gemm = launchers(make_kernel, GPU_CONFIG, SIM_CONFIG)


def double_buffer(a, b, c):
    """C = A @ B with two shared buffers filled by cp.async feeding WMMA (fp16/bf16 in,
    fp32 accumulation); any shape and strides."""
    run(a, b, None, c)



KERNELS = [
    Kernel("k06_double_buffer", 6, "numba", FP16_BF16,
           "WMMA fed by cp.async into two shared buffers (double buffering)",
           launch=double_buffer, min_cc=(8, 0), ptx=ptx_hook(make_kernel, GPU_CONFIG),
           source=make_kernel, gemm=blas_gemm, features=frozenset({"alpha_beta"}), step=1,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
