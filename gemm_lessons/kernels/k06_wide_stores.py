"""Lesson 06, step 7: the persistent kernel's epilogue, 16 bytes per store.

``k06_persistent`` runs no faster than ``k06_producer_consumer`` (lesson 06 measures both),
and a sweep over K says why: at M = N = 4096 the time of both grows with K at nearly
cuBLAS's rate, but each call also pays a fixed cost that cuBLAS does not. A cost that does
not grow with K is paid once per tile, after its K loop: the epilogue. There each thread
writes 64 x BN / 128 = 128 outputs (BN = 256) one 2-byte store at a time, and ptxas turns
every store into dozens of instructions of 64-bit index arithmetic, a shared-memory load and
the store (the SASS, lesson 06), while the tensor cores wait.

This kernel changes only that loop. Each thread takes 8 neighbouring columns of a row at a
time: it reads them from the scratch, scales them and converts them, then writes all 8 in
one 16-byte store (``ptx_simt.st_global_v8``, PTX ``st.global.v4.u32``): 8 stores per
thread and half-tile pass instead of 64 (16 per tile instead of 128), and the index
arithmetic once per 8 outputs.
A 16-byte store needs 16 aligned bytes: ``run`` passes ``wide`` when the output's rows
start 16-byte aligned (on the TMA path N is a multiple of 8, so they do for a contiguous
output). Chunks past N write nothing (N is a multiple of 8 there, so no chunk straddles
it). An output that is not aligned, and ``beta != 0`` (C is read element by element), take
the one-element loop of ``k06_persistent``.

Everything else is ``k06_persistent``'s. ``gl.show_diff("k06_persistent",
"k06_wide_stores")`` shows the lines this step changes.
"""
from functools import lru_cache

from numba import cuda, float32, int16, int64
from numba.types import float16

from .. import ptx
from ..ptx_hopper import (SWIZZLE_SMEM_ALIGN, setmaxnreg_dec, setmaxnreg_inc,
                          wgmma_commit_group, wgmma_fence, wgmma_mma, wgmma_store_d,
                          wgmma_wait_group)
from ..ptx_mbarrier import (fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx,
                            mbarrier_init, mbarrier_wait, named_barrier_sync)
from ..ptx_simt import launch_bounds, st_global_v8
from ..ptx_tma import tma_load_2d
from . import FP16_BF16, Kernel
from . import k06_persistent
from .k06_persistent import GPU_CONFIG, SIM_CONFIG, smem_bytes
from .k06_producer_consumer import BK, BUGS, registers
from .tc_common import engine_config, grouped_block

__all__ = ["make_kernel", "kernel_for", "run", "wide_stores", "KERNELS"]


@lru_cache(maxsize=None)
def make_kernel(cfg, bf16=False, bug=None):
    """The persistent kernel with 16-byte stores for one ``PersistentConfig`` (fp16, or bf16
    with ``bf16=True``). ``bug`` builds a deliberately broken ring from the same source, to
    see what the simulator says: ``'parity'`` (the producer's first wait on ``empty`` has
    parity 0: it waits for a phase nobody completes), ``'no_release'`` (the consumers never
    arrive on ``empty``)."""
    if bug not in BUGS:
        raise ValueError(f"bug must be one of {BUGS}, got {bug!r}")
    BM, BN, STAGES, GROUP_M = cfg.BM, cfg.BN, cfg.STAGES, cfg.GROUP_M
    dt = int16 if bf16 else float16
    to_f32 = ptx.bf16_to_f32 if bf16 else ptx.f16_to_f32
    to_out = ptx.f32_to_bf16 if bf16 else ptx.f32_to_f16
    CONSUMERS = BM // 64
    NT = 128 * (1 + CONSUMERS)                      # the producer warpgroup + consumers
    NACC = BN // 2                                  # accumulators per consumer thread
    A_STAGE, B_STAGE = BM * BK, BK * BN             # elements per stage
    STAGE = A_STAGE + B_STAGE
    STAGE_BYTES = 2 * STAGE                         # what the copies of one stage deliver
    B_BOXES = BN // 64                              # 64 x 64 TMA boxes of B per stage
    B_LBO = BK * 128                                # bytes between B's 64-column atoms
    EMPTY_ARRIVALS = 128 * CONSUMERS                # every consumer thread
    EMPTY_PARITY0 = 0 if bug == "parity" else 1     # the producer's parity in round 0
    RELEASE = bug != "no_release"
    HALF = BN // 2                                  # columns of the tile per epilogue pass
    LDC = HALF + 4                                  # epilogue scratch row (floats)
    CHUNKS = HALF // 8                              # 8-column chunks in a row of a half
    CHUNK_ITERS = 64 * CHUNKS // 128                # chunks per thread and pass
    SC = STAGES * STAGE_BYTES // 4                  # the scratch starts after the ring
    SMEM_BYTES = smem_bytes(cfg)
    REGS, PRODUCER_REGS, CONSUMER_REGS = registers(cfg)

    @cuda.jit(**launch_bounds(NT, 1))        # ptxas starts every thread at REGS registers
    def wide_stores(tA, tB, C, Out, M, N, K, alpha, beta, wide):
        # tA, tB: tensor maps of A (M, K) and B (K, N) (boxes BM x 64 and 64 x 64);
        # C: read when beta != 0; Out: (M, N); alpha, beta: float32;
        # wide: 1 if Out's rows start 16-byte aligned
        smem = cuda.shared.array(0, dt, alignment=SWIZZLE_SMEM_ALIGN)  # STAGES x (A, B)
        sC = cuda.shared.array(0, float32, alignment=SWIZZLE_SMEM_ALIGN)  # epilogue at SC
        full = cuda.shared.array(STAGES, int64)     # stage s holds its tile
        empty = cuda.shared.array(STAGES, int64)    # stage s has been read by every consumer
        tid = cuda.threadIdx.x
        wg = tid // 128
        tiles = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
        k_tiles = (K + BK - 1) // BK if alpha != 0 else 0

        if tid == 0:
            for s in range(STAGES):
                mbarrier_init(full, s, 1)
                mbarrier_init(empty, s, EMPTY_ARRIVALS)
            fence_mbarrier_init()
        cuda.syncthreads()                          # the last block-wide barrier

        if wg == 0:
            # -- the producer: one thread fills the ring; its warpgroup gives registers back
            setmaxnreg_dec(PRODUCER_REGS)
            if tid == 0:
                it = 0                              # k-tiles loaded so far, over all tiles
                for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
                    bm, bn = grouped_block(tile, M, N, BM, BN, GROUP_M)
                    for kt in range(k_tiles):
                        s = it % STAGES
                        mbarrier_wait(empty, s, ((it // STAGES) & 1) ^ EMPTY_PARITY0)
                        base = s * STAGE
                        mbarrier_arrive_expect_tx(full, s, STAGE_BYTES)
                        tma_load_2d(smem, base, tA, kt * BK, bm, full, s)
                        for j in range(B_BOXES):
                            tma_load_2d(smem, base + A_STAGE + j * 64 * BK, tB, bn + 64 * j,
                                        kt * BK, full, s)
                        it += 1
        else:
            # -- a consumer: 64 rows of each tile, with the registers the producer gave up
            setmaxnreg_inc(CONSUMER_REGS)
            acc = cuda.local.array(NACC, float32)
            a_rows = (wg - 1) * 64 * BK             # this warpgroup's rows of A in a stage
            it = 0                                  # k-tiles consumed so far, over all tiles
            for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
                bm, bn = grouped_block(tile, M, N, BM, BN, GROUP_M)
                for i in range(NACC):
                    acc[i] = float32(0.0)
                for kt in range(k_tiles):
                    s = it % STAGES
                    mbarrier_wait(full, s, (it // STAGES) & 1)
                    base = s * STAGE
                    wgmma_fence()
                    wgmma_mma(acc, smem, base + a_rows, smem, base + A_STAGE, BN, B_LBO)
                    wgmma_mma(acc, smem, base + a_rows + 16, smem, base + A_STAGE + 16 * 64, BN,
                              B_LBO)
                    wgmma_mma(acc, smem, base + a_rows + 32, smem, base + A_STAGE + 32 * 64, BN,
                              B_LBO)
                    wgmma_mma(acc, smem, base + a_rows + 48, smem, base + A_STAGE + 48 * 64, BN,
                              B_LBO)
                    wgmma_commit_group()
                    wgmma_wait_group(1, acc, NACC)  # k-tile it - 1's wgmma are done ...
                    if RELEASE and kt > 0:
                        mbarrier_arrive(empty, (it - 1) % STAGES)   # ... so its stage is free
                    it += 1
                wgmma_wait_group(0, acc, NACC)
                if RELEASE and k_tiles > 0:
                    mbarrier_arrive(empty, (it - 1) % STAGES)   # the tile's last stage too

                # -- epilogue: the ring is being refilled, so each consumer has its own
                #    scratch after it, 64 rows of BN / 2: the tile goes out in two halves
                rows = (wg - 1) * 64
                mine = SC + rows * LDC              # this consumer's scratch in sC
                t = tid % 128
                for half in range(2):
                    named_barrier_sync(1 + wg, 128)     # every thread has read the scratch
                    if half == 0:                       # columns 0 .. BN / 2 - 1 ...
                        wgmma_store_d(sC, mine, LDC, acc, HALF)
                    else:                               # ... then the rest: acc[NACC // 2:]
                        wgmma_store_d(sC, mine, LDC, acc[NACC // 2:], HALF)
                    named_barrier_sync(1 + wg, 128)     # this half of its 64 rows is in sC
                    for e in range(CHUNK_ITERS):        # 8 neighbouring columns at a time
                        r, c = (e * 128 + t) // CHUNKS, (e * 128 + t) % CHUNKS * 8
                        gr, gc = bm + rows + r, bn + half * HALF + c
                        i = mine + r * LDC + c
                        if gr < M and wide != 0 and gc + 8 <= N and beta == 0:
                            st_global_v8(Out, gr, gc, (   # one 16-byte store
                                to_out(alpha * sC[i]), to_out(alpha * sC[i + 1]),
                                to_out(alpha * sC[i + 2]), to_out(alpha * sC[i + 3]),
                                to_out(alpha * sC[i + 4]), to_out(alpha * sC[i + 5]),
                                to_out(alpha * sC[i + 6]), to_out(alpha * sC[i + 7])))
                        elif gr < M:                    # not aligned, or C to add
                            for j in range(8):
                                if gc + j < N:
                                    v = alpha * sC[i + j]
                                    if beta != 0:
                                        v += beta * to_f32(C[gr, gc + j])
                                    Out[gr, gc + j] = to_out(v)

    wide_stores.threads = NT
    wide_stores.launch_bounds = (NT, 1)
    wide_stores.smem_bytes = SMEM_BYTES
    wide_stores.config = cfg
    return wide_stores


# ------------------------------------------------------------------------------ launchers
def kernel_for(config=None, bf16=False):
    """The kernel object :func:`run` launches for ``config`` (overrides of this engine's
    configuration)."""
    return make_kernel(engine_config(GPU_CONFIG, SIM_CONFIG, config), bf16)


def run(a, b, c, out, alpha=1.0, beta=0.0, config=None, bug=None, blocks=None):
    """``out = alpha * a @ b + beta * c``; ``c`` may be None when ``beta == 0``. ``blocks``:
    the size of the persistent grid (default: one block per SM; at most one per tile).
    Operands TMA cannot address run ``k06_wgmma``. The 16-byte stores run where ``out``'s
    rows start 16-byte aligned."""
    wide = out.stride(1) == 1 and out.stride(0) % 8 == 0 and out.data_ptr() % 16 == 0
    k06_persistent.launch(KERNELS[0], make_kernel, a, b, c, out, alpha, beta, config, bug,
                          blocks, int(wide))


def wide_stores(a, b, c):
    """C = A @ B on the persistent grid, the epilogue writing 16 bytes per store."""
    run(a, b, None, c)


def blas_gemm(a3, b3, c3, out, alpha, beta, bias, activation):
    """gl.gemm hook: ``out = alpha * a @ b + beta * c`` (3-D views with one batch)."""
    run(a3[0], b3[0], None if c3 is None else c3[0], out[0], alpha, beta)


def _ptx(cc, bf16=False):
    dt = "int16" if bf16 else "float16"
    k = make_kernel(GPU_CONFIG, bf16=bf16)
    return (k.py_func, f"void(int64[::1], int64[::1], {dt}[:, :], {dt}[:, ::1], int64, int64, "
                       f"int64, float32, float32, int64)", {"launch_bounds": k.launch_bounds})


KERNELS = [
    Kernel("k06_wide_stores", 6, "numba", FP16_BF16,
           "The persistent kernel whose epilogue writes 8 outputs (16 bytes) per store",
           launch=wide_stores, min_cc=(9, 0), cc_below=(10, 0), ptx=_ptx,
           source=make_kernel, gemm=blas_gemm, features=frozenset({"alpha_beta"}), step=7,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
