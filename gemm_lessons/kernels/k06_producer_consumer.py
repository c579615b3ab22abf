"""Lesson 06, after wgmma: warp specialization. One warpgroup copies, two multiply.

In ``k06_wgmma`` every thread does everything: it issues its share of each tile's
``cp.async`` copies, waits for them, meets every other thread at a ``syncthreads``, then
issues wgmma. The copies cost instructions and registers on the threads that do the math,
and the ``syncthreads`` makes the slowest warp set the pace of all of them.

This kernel gives each warpgroup one job:

* the **producer** (warpgroup 0; one of its threads does the work) copies the tiles with
  **TMA** (:mod:`gemm_lessons.ptx_tma`): one instruction per box, addresses computed by
  the copy engine from a tensor map, zeros outside the operand. Per k-tile: one BM x 64
  box of A and BN / 64 boxes (64 x 64) of B, into a ring of STAGES stages in shared memory;
* the **consumers** (warpgroups 1 and 2, 64 rows of the BM x BN tile each) issue wgmma on
  the stages and keep the accumulators, BN / 2 floats per thread.

The producer needs few registers and the consumers many: every thread starts with the
block's even share (168 with 384 threads), then the producer warpgroup lowers its limit to
40 (``setmaxnreg_dec``) and the consumers raise theirs (``setmaxnreg_inc``) by what it gave
up (:func:`registers`).

Two sets of mbarriers (:mod:`gemm_lessons.ptx_mbarrier`), one of each per stage, replace
the ``syncthreads``:

* ``full[s]``: stage s holds its tile. The producer announces the stage's bytes
  (``mbarrier_arrive_expect_tx``: one arrival, ``STAGE_BYTES`` to come); the TMA copies
  complete them. Consumers wait on it;
* ``empty[s]``: every consumer has finished reading stage s. Every consumer thread
  arrives after ``wgmma_wait_group(1)`` says the wgmma of that stage are done (128
  arrivals per consumer warpgroup: one instruction per warp, as for one lane's). The
  producer waits on it before it overwrites the stage.

k-tile ``kt`` uses stage ``s = kt % STAGES`` in round ``r = kt // STAGES``; a wait for the
phase of round r passes parity ``r & 1``. The producer waits on ``empty`` with parity
``(r & 1) ^ 1``: in round 0 that is parity 1 of a fresh barrier, the phase before its
first, which counts as complete, so the ring starts empty without any arrival.

Epilogue: ``Out = alpha * A @ B + beta * C``. When both consumers are done with the ring
(a *named barrier* over their 256 threads, ``bar.sync 1, 256``: the producer takes no
part), the ring becomes scratch: each consumer stores its accumulators there
(``wgmma_store_d``), meets its own 128 threads at a named barrier, and writes its 64 rows
out along rows (coalesced). ``beta == 0`` never reads C, ``alpha == 0`` never reads A or B. Every shape: TMA fills the parts of a box past
M, N and K with zeros. What TMA cannot address (a row stride that is not a multiple of 16
bytes, such as an odd K or N of a contiguous operand; rows that are not contiguous, such
as a transposed view; a base that is not 16-byte aligned) runs ``k06_wgmma`` instead
(:func:`will_use_tma` says which).
"""
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from numba import cuda, float32, int16, int64
from numba.types import float16

from .. import engines, fastpath
from .. import ptx
from ..common import cdiv
from ..ptx_hopper import (SWIZZLE_SMEM_ALIGN, setmaxnreg_dec, setmaxnreg_inc,
                          wgmma_commit_group, wgmma_fence, wgmma_mma, wgmma_store_d,
                          wgmma_wait_group)
from ..ptx_mbarrier import (fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx,
                            mbarrier_init, mbarrier_wait, named_barrier_sync)
from ..ptx_simt import launch_bounds
from ..ptx_tma import tensor_map_2d, tma_addressable, tma_load_2d
from . import FP16_BF16, Kernel
from . import k06_wgmma
from .tc_common import (TileConfig, allow_smem, check_bf16, check_hopper, engine_config,
                        grouped_block)

BK = 64              # one 128-byte swizzle row of fp16: the k-depth of a tile (a TMA box width)
BUGS = (None, "parity", "no_release")


@dataclass(frozen=True)
class ProducerConsumerConfig(TileConfig):
    """Tiles of the producer/consumer kernel: BM = 64 x (consumer warpgroups), BN the N of
    each wgmma (64, 128 or 256), STAGES >= 2 stages in the ring, GROUP_M block rows walk
    across N together. Threads: 128 x (1 + BM / 64); shared memory: STAGES x (BM + BN) x 64
    x 2 bytes."""
    BM: int = 128
    BN: int = 256
    STAGES: int = 4
    GROUP_M: int = 8

    def rules(self):
        return [(self.BM in (128, 192), "BM 128 or 192 (two or three consumer warpgroups "
                                         "of 64 rows: the configurations run on an H200)"),
                 (self.BN in (64, 128, 192, 256), "BN 64, 128, 192 or 256 (a wgmma's N)"),
                 (self.STAGES >= 2, "STAGES >= 2 (a stage filled while another is read)"),
                 (self.GROUP_M >= 1, "GROUP_M >= 1"),
                 (128 * (1 + self.BM // 64) <= 1024, "at most 1024 threads")]


GPU_CONFIG = ProducerConsumerConfig(BM=128, BN=256, STAGES=4)
SIM_CONFIG = ProducerConsumerConfig(BM=128, BN=64, STAGES=4)   # the same ring, narrower tiles


@lru_cache(maxsize=None)
def make_kernel(cfg, bf16=False, bug=None):
    """The producer/consumer kernel for one :class:`ProducerConsumerConfig` (fp16, or bf16
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
    LDC = BN + 4                                    # epilogue scratch row (floats)
    OUT_ITERS = 64 * BN // 128                      # output elements per consumer thread
    SMEM_BYTES = max(STAGES * STAGE_BYTES, BM * LDC * 4)
    REGS, PRODUCER_REGS, CONSUMER_REGS = registers(cfg)

    @cuda.jit(**launch_bounds(NT, 1))        # ptxas starts every thread at REGS registers
    def producer_consumer(tA, tB, C, Out, M, N, K, alpha, beta):
        # tA, tB: tensor maps of A (M, K) and B (K, N) (boxes BM x 64 and 64 x 64);
        # C: read when beta != 0; Out: (M, N); alpha, beta: float32
        smem = cuda.shared.array(0, dt, alignment=SWIZZLE_SMEM_ALIGN)  # STAGES x (A, B)
        sC = cuda.shared.array(0, float32, alignment=SWIZZLE_SMEM_ALIGN)  # epilogue
        full = cuda.shared.array(STAGES, int64)     # stage s holds its tile
        empty = cuda.shared.array(STAGES, int64)    # stage s has been read by every consumer
        tid = cuda.threadIdx.x
        wg = tid // 128
        bm, bn = grouped_block(cuda.blockIdx.x, M, N, BM, BN, GROUP_M)
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
                for kt in range(k_tiles):
                    s = kt % STAGES
                    mbarrier_wait(empty, s, ((kt // STAGES) & 1) ^ EMPTY_PARITY0)
                    base = s * STAGE
                    mbarrier_arrive_expect_tx(full, s, STAGE_BYTES)
                    tma_load_2d(smem, base, tA, kt * BK, bm, full, s)
                    for j in range(B_BOXES):
                        tma_load_2d(smem, base + A_STAGE + j * 64 * BK, tB, bn + 64 * j,
                                    kt * BK, full, s)
        else:
            # -- a consumer: 64 rows of the tile, with the registers the producer gave up
            setmaxnreg_inc(CONSUMER_REGS)
            acc = cuda.local.array(NACC, float32)
            for i in range(NACC):
                acc[i] = float32(0.0)
            a_rows = (wg - 1) * 64 * BK             # this warpgroup's rows of A in a stage
            for kt in range(k_tiles):
                s = kt % STAGES
                mbarrier_wait(full, s, (kt // STAGES) & 1)
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
                wgmma_wait_group(1, acc, NACC)      # tile kt - 1's wgmma are done ...
                if RELEASE and kt > 0:
                    mbarrier_arrive(empty, (kt - 1) % STAGES)   # ... so its stage is free
            wgmma_wait_group(0, acc, NACC)

            # -- epilogue: once both consumers are done with the ring, it becomes the
            #    scratch: accumulators to shared memory (fragment order), then rows out
            named_barrier_sync(1, 128 * CONSUMERS)
            rows = (wg - 1) * 64
            wgmma_store_d(sC, rows * LDC, LDC, acc, BN)
            named_barrier_sync(1 + wg, 128)         # this warpgroup's 64 rows are in sC
            t = tid % 128
            for e in range(OUT_ITERS):
                r, c = rows + (e * 128 + t) // BN, (e * 128 + t) % BN
                gr, gc = bm + r, bn + c
                if gr < M and gc < N:
                    v = alpha * sC[r * LDC + c]
                    if beta != 0:
                        v += beta * to_f32(C[gr, gc])
                    Out[gr, gc] = to_out(v)

    producer_consumer.threads = NT
    producer_consumer.launch_bounds = (NT, 1)
    producer_consumer.smem_bytes = SMEM_BYTES
    producer_consumer.config = cfg
    return producer_consumer


def registers(cfg):
    """(registers per thread at the start, the producer's after ``setmaxnreg_dec``, the
    consumers' after ``setmaxnreg_inc``): the start is what one block of 128 x (1 + BM / 64)
    threads may have (65536 registers per SM, in steps of 8); the consumers take what the
    producer warpgroup gives back, shared between them, up to 256."""
    threads = 128 * (1 + cfg.BM // 64)
    start = (65536 // threads) // 8 * 8
    producer = 40
    consumer = min(256, (start + (start - producer) // (cfg.BM // 64)) // 8 * 8)
    return start, producer, consumer


# ------------------------------------------------------------------------------ launchers
def will_use_tma(a, b):
    """Whether :func:`run` takes the TMA path for the operands ``a`` (M, K) and ``b``
    (K, N), else ``k06_wgmma``'s; and why not, where not."""
    for name, t in (("A", a), ("B", b)):
        ok, why = tma_addressable(t)
        if not ok:
            return False, f"{name}: {why}"
    return True, ""


_MAPS: "OrderedDict" = OrderedDict()


def tensor_map(t, box_rows):
    """The tensor map's device array for ``t``, cached by address, shape, strides and dtype:
    a map is a description of memory, not of its contents (building one costs a copy to the
    GPU). Public: ``k06_persistent`` launches with the same maps."""
    key = (t.device, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, box_rows)
    arr = _MAPS.get(key)
    if arr is None:
        arr = _MAPS[key] = tensor_map_2d(t, box_rows).array
        if len(_MAPS) > 64:
            _MAPS.popitem(last=False)
        # a replayed call (gemm_lessons.fastpath) asks here for its tensors' maps
        fastpath.derived(arr, t, lambda view, box_rows=box_rows: tensor_map(view, box_rows))
    else:
        _MAPS.move_to_end(key)
    return arr


def kernel_for(config=None, bf16=False):
    """The kernel object :func:`run` launches for ``config`` (overrides of this engine's
    configuration)."""
    return make_kernel(engine_config(GPU_CONFIG, SIM_CONFIG, config), bf16)


def run(a, b, c, out, alpha=1.0, beta=0.0, config=None, bug=None):
    """``out = alpha * a @ b + beta * c``; ``c`` may be None when ``beta == 0``. Operands
    TMA cannot address run ``k06_wgmma`` (:func:`will_use_tma`)."""
    check_hopper(KERNELS[0], "TMA and wgmma exist")
    check_bf16(a.dtype)
    if not will_use_tma(a, b)[0]:
        k06_wgmma.run(a, b, c, out, alpha, beta)
        return
    cfg = engine_config(GPU_CONFIG, SIM_CONFIG, config)
    kernel = make_kernel(cfg, a.dtype == torch.bfloat16, bug)
    M, K = a.shape
    N = b.shape[1]
    Cin = c if (c is not None and beta != 0) else out       # beta == 0: never read
    # the maps and the tensors stay referenced here until the launch is queued
    tA, tB = tensor_map(a, cfg.BM), tensor_map(b, BK)
    args = (engines.as_numba(tA), engines.as_numba(tB), engines.as_numba(Cin),
            engines.as_numba(out), M, N, K, np.float32(alpha), np.float32(beta))
    grid = cdiv(M, cfg.BM) * cdiv(N, cfg.BN)
    allow_smem(kernel, args, kernel.smem_bytes)
    kernel[grid, kernel.threads, engines.numba_stream(), kernel.smem_bytes](*args)


def producer_consumer(a, b, c):
    """C = A @ B with a TMA producer warpgroup and two wgmma consumer warpgroups handing a
    ring of shared-memory stages over full/empty mbarriers."""
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
    Kernel("k06_producer_consumer", 6, "numba", FP16_BF16,
           "Warp specialization: a TMA producer warpgroup and two wgmma consumers hand a ring "
           "of stages over full/empty mbarriers",
           launch=producer_consumer, min_cc=(9, 0), cc_below=(10, 0), ptx=_ptx,
           source=make_kernel, gemm=blas_gemm, features=frozenset({"alpha_beta"}), step=5,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
