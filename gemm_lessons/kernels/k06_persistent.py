"""Lesson 06, after warp specialization: a persistent grid. One block per SM walks many tiles,
and its producer runs ahead into the next tile while the consumers store the last one.

``k06_producer_consumer`` launches one block per tile. When a block has walked its K-tiles,
its consumers spend the epilogue writing the tile out while nothing loads: the producer has
nothing left to copy, and the SM's tensor cores wait until the next block has started,
initialized its barriers and filled its first stage. The shorter K is, the larger that share
of a tile's time.

This kernel keeps every block alive for the whole product:

* the **grid** is one block per SM (:func:`gemm_lessons.common.sm_count`; fewer when there
  are fewer tiles). Block ``b`` of ``G`` walks tiles ``b, b + G, b + 2 G, ...`` in the
  grouped order of lesson 07, so the blocks running at one moment still share their rows
  of A and columns of B in L2;
* the barriers are initialized once, and the ring is **one ring across tiles**: the stage and
  its phase come from a running count ``it`` of the K-tiles the block has handled over all
  its tiles (``s = it % STAGES``, parity ``(it // STAGES) & 1``), never reset per tile. Reset
  per tile, the counts would restart at stage 0 and parity 0 while the barriers are in some
  later phase;
* the **producer runs ahead**: as soon as a consumer releases a stage, the producer fills it
  with the next tile's K-tile, so when the consumers finish the epilogue, the next tile's
  first stages are already there. For that the consumers release every stage, the tile's
  last one too (after ``wgmma_wait_group(0)``);
* the epilogue gets **its own scratch**, after the ring: the ring cannot be the scratch any
  more (the producer is refilling it), and the ring and both consumers' accumulators
  (BM x BN floats) do not fit in shared memory together. So each consumer stores half of
  its 64 x BN accumulators at a time (``wgmma_store_d`` of BN / 2 columns: the first
  NACC / 2 accumulators of a thread hold the left half of the tile, the others the right
  half), writes those rows out, then does the same with the other half. Its scratch is its
  own, so only its own 128 threads meet (a named barrier), and the other consumer goes on
  at its own pace. (Writing the accumulators to global memory straight from the registers
  would need no scratch, but a loop over ``acc[i]`` that numba does not unroll keeps the
  accumulators in local memory; ``wgmma_store_d`` stores each at a constant offset.)

Everything else is ``k06_producer_consumer``'s (its configuration, with three stages instead
of four to leave room for the scratch, register split, tensor maps and fallback are imported
from it): one TMA producer thread, two wgmma consumer
warpgroups, ``Out = alpha * A @ B + beta * C``, any shape, and ``k06_wgmma`` where TMA cannot
address an operand. ``gl.show_diff("k06_producer_consumer", "k06_persistent")`` shows the
lines this step adds.
"""
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from numba import cuda, float32, int16, int64
from numba.types import float16

from .. import engines
from .. import ptx
from ..common import cdiv, sm_count
from ..ptx_hopper import (SWIZZLE_SMEM_ALIGN, setmaxnreg_dec, setmaxnreg_inc,
                          wgmma_commit_group, wgmma_fence, wgmma_mma, wgmma_store_d,
                          wgmma_wait_group)
from ..ptx_mbarrier import (fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx,
                            mbarrier_init, mbarrier_wait, named_barrier_sync)
from ..ptx_simt import launch_bounds
from ..ptx_tma import tma_load_2d
from . import FP16_BF16, Kernel
from . import k06_wgmma
from .k06_producer_consumer import (BK, BUGS, ProducerConsumerConfig, registers, tensor_map,
                                    will_use_tma)
from .tc_common import allow_smem, check_bf16, check_hopper, engine_config, grouped_block

__all__ = ["PersistentConfig", "GPU_CONFIG", "SIM_CONFIG", "SMEM_LIMIT", "smem_bytes",
           "make_kernel", "kernel_for", "grid_size", "run", "launch", "persistent", "KERNELS"]

# shared memory one block may have on Hopper (227 KiB), less the 1 KiB of static shared
# memory ptxas gives this kernel (its barriers)
SMEM_LIMIT = 227 * 1024 - 1024


def smem_bytes(cfg):
    """Shared memory of one block: the ring (STAGES x (BM + BN) x 64 fp16) and the
    epilogue's scratch (BM rows of BN / 2 + 4 floats: 64 rows for each consumer)."""
    return cfg.STAGES * (cfg.BM + cfg.BN) * BK * 2 + cfg.BM * (cfg.BN // 2 + 4) * 4


@dataclass(frozen=True)
class PersistentConfig(ProducerConsumerConfig):
    """:class:`ProducerConsumerConfig` whose ring and epilogue scratch fit in one SM's
    shared memory (:func:`smem_bytes`): with BM 128, three stages of BN 256, or four of
    BN 192."""

    def rules(self):
        return super().rules() + [
            (smem_bytes(self) <= SMEM_LIMIT,
             f"the ring and the epilogue's scratch within {SMEM_LIMIT} bytes of shared memory "
             f"({smem_bytes(self)}: fewer STAGES or a smaller BN)")]


GPU_CONFIG = PersistentConfig(BM=128, BN=256, STAGES=3)
SIM_CONFIG = PersistentConfig(BM=128, BN=64, STAGES=3)     # the same ring, narrower tiles


@lru_cache(maxsize=None)
def make_kernel(cfg, bf16=False, bug=None):
    """The persistent kernel for one :class:`PersistentConfig` (fp16, or bf16
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
    OUT_ITERS = 64 * HALF // 128                    # output elements per thread and pass
    SC = STAGES * STAGE_BYTES // 4                  # the scratch starts after the ring
    SMEM_BYTES = smem_bytes(cfg)
    REGS, PRODUCER_REGS, CONSUMER_REGS = registers(cfg)

    @cuda.jit(**launch_bounds(NT, 1))        # ptxas starts every thread at REGS registers
    def persistent(tA, tB, C, Out, M, N, K, alpha, beta):
        # tA, tB: tensor maps of A (M, K) and B (K, N) (boxes BM x 64 and 64 x 64);
        # C: read when beta != 0; Out: (M, N); alpha, beta: float32
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
                    for e in range(OUT_ITERS):
                        r, c = (e * 128 + t) // HALF, (e * 128 + t) % HALF
                        gr, gc = bm + rows + r, bn + half * HALF + c
                        if gr < M and gc < N:
                            v = alpha * sC[mine + r * LDC + c]
                            if beta != 0:
                                v += beta * to_f32(C[gr, gc])
                            Out[gr, gc] = to_out(v)

    persistent.threads = NT
    persistent.launch_bounds = (NT, 1)
    persistent.smem_bytes = SMEM_BYTES
    persistent.config = cfg
    return persistent


# ------------------------------------------------------------------------------ launchers
def kernel_for(config=None, bf16=False):
    """The kernel object :func:`run` launches for ``config`` (overrides of this engine's
    configuration)."""
    return make_kernel(engine_config(GPU_CONFIG, SIM_CONFIG, config), bf16)


def grid_size(M, N, cfg, blocks=None):
    """Blocks of the persistent grid for an M x N output in ``cfg``'s tiles: ``blocks``
    (default: one per SM), never more than there are tiles."""
    tiles = cdiv(M, cfg.BM) * cdiv(N, cfg.BN)
    if blocks is None:
        blocks = sm_count()
    if isinstance(blocks, bool) or not isinstance(blocks, (int, np.integer)) or blocks < 1:
        raise ValueError(f"blocks must be a positive integer, got {blocks!r}")
    return min(int(blocks), tiles)


def run(a, b, c, out, alpha=1.0, beta=0.0, config=None, bug=None, blocks=None):
    """``out = alpha * a @ b + beta * c``; ``c`` may be None when ``beta == 0``. ``blocks``:
    the size of the persistent grid (default: one block per SM; at most one per tile).
    Operands TMA cannot address run ``k06_wgmma`` (``will_use_tma``)."""
    launch(KERNELS[0], make_kernel, a, b, c, out, alpha, beta, config, bug, blocks)


def launch(entry, make, a, b, c, out, alpha, beta, config, bug, blocks, *extra):
    """:func:`run` for the kernel ``make(cfg, bf16, bug)`` builds (this one, or step 7's,
    which passes its own arguments after beta as ``extra``)."""
    check_hopper(entry, "TMA and wgmma exist")
    check_bf16(a.dtype)
    if not will_use_tma(a, b)[0]:
        k06_wgmma.run(a, b, c, out, alpha, beta)
        return
    cfg = engine_config(GPU_CONFIG, SIM_CONFIG, config)
    kernel = make(cfg, a.dtype == torch.bfloat16, bug)
    M, K = a.shape
    N = b.shape[1]
    grid = grid_size(M, N, cfg, blocks)
    Cin = c if (c is not None and beta != 0) else out       # beta == 0: never read
    # the maps and the tensors stay referenced here until the launch is queued
    tA, tB = tensor_map(a, cfg.BM), tensor_map(b, BK)
    args = (engines.as_numba(tA), engines.as_numba(tB), engines.as_numba(Cin),
            engines.as_numba(out), M, N, K, np.float32(alpha), np.float32(beta)) + extra
    allow_smem(kernel, args, kernel.smem_bytes)
    kernel[grid, kernel.threads, engines.numba_stream(), kernel.smem_bytes](*args)


def persistent(a, b, c):
    """C = A @ B on a persistent grid (one block per SM walking many tiles) whose TMA
    producer runs into the next tile while the wgmma consumers store the last one."""
    run(a, b, None, c)


def blas_gemm(a3, b3, c3, out, alpha, beta, bias, activation):
    """gl.gemm hook: ``out = alpha * a @ b + beta * c`` (3-D views with one batch)."""
    run(a3[0], b3[0], None if c3 is None else c3[0], out[0], alpha, beta)


def _ptx(cc, bf16=False):
    dt = "int16" if bf16 else "float16"
    k = make_kernel(GPU_CONFIG, bf16=bf16)
    return (k.py_func, f"void(int64[::1], int64[::1], {dt}[:, :], {dt}[:, ::1], int64, int64, "
                       f"int64, float32, float32)", {"launch_bounds": k.launch_bounds})


KERNELS = [
    Kernel("k06_persistent", 6, "numba", FP16_BF16,
           "A persistent grid: one block per SM walks many tiles, its TMA producer loading "
           "the next tile while the wgmma consumers store the last one",
           launch=persistent, min_cc=(9, 0), cc_below=(10, 0), ptx=_ptx,
           source=make_kernel, gemm=blas_gemm, features=frozenset({"alpha_beta"}), step=6,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
