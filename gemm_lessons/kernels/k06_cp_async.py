"""Lesson 06, step 3: the fragments of the next k-slice loaded during the math
(``k06_cp_async``, the lesson's finished WMMA kernel).

``k06_multistage`` keeps tiles in flight, but inside a tile each warp still loads its
fragments of a k-slice from shared memory (``ldmatrix``) and only then multiplies: the
tensor cores wait for the loads, and at every tile they wait at the barrier too. As CUTLASS
does, this kernel keeps two sets of fragment registers (slots 0 and 1): while the tensor
cores work on k-slice kk from one slot, the warp loads slice kk + 1 into the other. The
wait and the barrier move to the last k-slice of a tile, whose fragments are already in
registers, so the math keeps going while the warps meet; the copies of tile
t + STAGES - 1 are spread over the slices before it. The slices go in pairs written out
(``two_slices``), so that every slice index is a constant and the fragments stay in
registers: BK is 32, 64, 96 or 128.

The pipeline, the copy plan, the edges (zero-filled copies, K walked from its ragged end,
16-byte rows from the launcher) and the BLAS epilogue (``Out = alpha * A @ B + beta * C``;
``beta == 0`` never reads C, ``alpha == 0`` never reads A or B) are ``k06_multistage``'s.
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
GPU_CONFIG = PipelineConfig(BM=128, BN=256, BK=64, WM=64, WN=64, STAGES=4)   # 204 KiB
SIM_CONFIG = PipelineConfig(BM=32, BN=32, BK=64, WM=16, WN=16, STAGES=4)     # the same loop


@lru_cache(maxsize=None)
def make_kernel(cfg, bf16=False):
    """The STAGES-deep cp.async pipeline feeding WMMA with the next k-slice's fragments
    loaded during the math, for one :class:`PipelineConfig` (fp16, or bf16 with
    ``bf16=True``); BK must be 32, 64, 96 or 128."""
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
    WAIT = STAGES - 2                                    # groups left in flight
    LDC = WN + 4                                         # epilogue scratch row (floats)
    C_WARP = 16 * LDC                                    # scratch floats per warp
    OUT_ITERS = 16 * WN // 32                            # epilogue elements per lane
    SMEM_BYTES = max(2 * STAGES * (A_STAGE + B_STAGE), 4 * C_WARP * NT // 32)
    KSTEPS = BK // 16                                    # 16-deep k-slices per tile
    NPARTS = KSTEPS - 1                                  # the copies of a tile, in parts
    if KSTEPS % 2 or KSTEPS > 8:
        raise ValueError(f"{cfg}: prefetched fragments need BK = 32, 64, 96 or 128 "
                         "(k-slices in pairs, at most four pairs)")

    @cuda.jit
    def cp_async_gemm(A, B, C, Out, M, N, K, lda, ldb, alpha, beta):
        # A: (M, K) and B: (K, N) as flat arrays with row strides lda, ldb (16-byte rows);
        # C: read when beta != 0; Out: (M, N), written; alpha, beta: float32
        smem = cuda.shared.array(0, dt, alignment=WMMA_SMEM_ALIGN)  # STAGES x (sA, sB)
        sC = cuda.shared.array(0, float32, alignment=WMMA_SMEM_ALIGN)  # epilogue, same memory
        rA = cuda.local.array((2, FM, FRAG_AB), dt)           # two slots: this k-slice
        rB = cuda.local.array((2, FN, FRAG_AB), dt)           # and the next
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

        def issue(t, ws, first, part):
            # start the copies of k-tile t (k from t * BK - shift) into stage ws; only the
            # first tile (first=True) has chunks before k = 0, copied as zeros. The copies
            # of a tile come in NPARTS parts, spread over the k-slices; the last part
            # closes the tile's group
            if t < k_tiles:
                k0 = t * BK - shift
                kb = k0 * ldb
                sa = ws * A_STAGE
                sb = B_BASE + ws * B_STAGE
                for it in range(A_ITERS):
                    if it * NPARTS // A_ITERS == part and (A_EXACT or ar + it * A_ROWS < BM):
                        nb = 16 if it * A_ROWS < a_rows else 0
                        if first and k0 + ac < 0:
                            nb = 0
                        cp_async16_zfill(smem, sa + a_dst + it * A_ROWS * LDA,
                                         A, a_src + it * a_step + k0, nb)
                for it in range(B_ITERS):
                    if it * NPARTS // B_ITERS == part and (B_EXACT or br + it * B_ROWS < BK):
                        nb = b_nb
                        if first and k0 + br + it * B_ROWS < 0:
                            nb = 0
                        cp_async16_zfill(smem, sb + b_dst + it * B_ROWS * LDB,
                                         B, b_src + it * b_step + kb, nb)
            if part == NPARTS - 1:
                cp_async_commit_group()      # one group per tile (empty past the end)

        def load_fragments(slot, rs, kk):
            # this warp's FM fragments of A and FN of B, k-slice kk of the tile in stage rs
            sa = rs * A_STAGE + wm * WM * LDA + kk * 16
            sb = B_BASE + rs * B_STAGE + kk * 16 * LDB + wn * WN
            for i in range(FM):
                wmma_load_a(rA[slot, i], smem, sa + i * 16 * LDA, LDA, "row")
            for j in range(FN):
                wmma_load_b(rB[slot, j], smem, sb + j * 16, LDB, "row")

        def tensor_cores(slot):
            for i in range(FM):
                for j in range(FN):
                    wmma_mma(acc[i, j], rA[slot, i], rB[slot, j], "row", "row")

        # -- prologue: STAGES - 1 tiles in flight (tile s in stage s)
        for s in range(STAGES - 1):
            for part in range(NPARTS):
                issue(s, int32(s), s == 0, part)
        # the stages roll: tile t is read from stage rs (= t % STAGES) and tile
        # t + STAGES - 1 written to stage ws (= (t - 1) % STAGES, the one tile t - 1 used);
        # counters, not %, because % on a signed 64-bit t costs a dozen instructions
        rs, ws = int32(0), int32(STAGES - 1)
        # -- main loop, with the fragments of the next k-slice loaded while the tensor cores
        #    work on this one (slots 0 and 1 in turn); the wait and the barrier move to the
        #    last k-slice of a tile, whose fragments are already in registers, so the math
        #    does not stop for them. In each slice the fragment loads come first (the next
        #    math waits for them), then a part of the copies of tile t + STAGES - 1
        def two_slices(t, rs, ws, nxt, kk):
            # k-slices kk (fragments in slot 0) and kk + 1 (slot 1) of tile t
            load_fragments(1, rs, kk + 1)
            issue(t + STAGES - 1, ws, False, kk)           # into tile t - 1's stage
            tensor_cores(0)
            if kk + 2 == KSTEPS:
                cp_async_wait_group(WAIT)    # tile t + 1 has landed (this thread's copies)
                cuda.syncthreads()           # ... everyone's; every warp is past tile t - 1
                load_fragments(0, nxt, 0)    # (unused after the last tile)
            else:
                load_fragments(0, rs, kk + 2)
                issue(t + STAGES - 1, ws, False, kk + 1)
            tensor_cores(1)

        cp_async_wait_group(WAIT)            # tile 0 has landed
        cuda.syncthreads()
        load_fragments(0, rs, 0)
        for t in range(k_tiles):
            nxt = rs + 1 if rs + 1 < STAGES else int32(0)     # tile t + 1's stage
            # the pairs of slices written out (BK up to 128), so that every slice index
            # is a constant: numba leaves a loop over them rolled, and then the
            # fragment registers would have to live in local memory
            two_slices(t, rs, ws, nxt, 0)
            if KSTEPS > 2:
                two_slices(t, rs, ws, nxt, 2)
            if KSTEPS > 4:
                two_slices(t, rs, ws, nxt, 4)
            if KSTEPS > 6:
                two_slices(t, rs, ws, nxt, 6)
            ws, rs = rs, nxt
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


def cp_async(a, b, c):
    """C = A @ B with a STAGES-deep cp.async pipeline feeding WMMA, the next k-slice's
    fragments loaded during the math (fp16/bf16 in, fp32 accumulation); any shape and
    strides."""
    run(a, b, None, c)



KERNELS = [
    Kernel("k06_cp_async", 6, "numba", FP16_BF16,
           "k06_multistage with the next k-slice's fragments loaded during the math",
           launch=cp_async, min_cc=(8, 0), ptx=ptx_hook(make_kernel, GPU_CONFIG),
           source=make_kernel, gemm=blas_gemm, features=frozenset({"alpha_beta"}), step=3,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
