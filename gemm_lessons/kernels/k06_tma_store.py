"""Lesson 06, step 8: the tile stored by TMA, while the consumers go on to the next tile.

``k06_wide_stores`` writes a tile out with 16-byte stores, but its consumer threads still
do the writing: per tile and thread, 16 stores, and the loads from the scratch, the scaling
and the index arithmetic around them, and only then do they return to ``wgmma``. The copy
engine that loads the ring can also store: one instruction issued by one thread writes a
whole box of shared memory to global memory (``ptx_tma.tma_store_2d``, PTX
``cp.async.bulk.tensor.2d.global.shared::cta.bulk_group``), asynchronously.

This kernel changes the epilogue. Each consumer:

1. waits, in its thread 0, until the store of its previous tile has *read* its scratch
   (``bulk_wait_group_read(0)``, PTX ``cp.async.bulk.wait_group.read 0``), and meets its
   warpgroup at a named barrier: the scratch may be written again;
2. writes its 64 x BN accumulators, times alpha and rounded to fp16/bf16, into its scratch
   in 64 x 64 boxes of the 128-byte swizzle, the layout the output's tensor map names
   (``ptx_hopper.wgmma_store_d_swizzled``: two outputs per 4-byte store, no bank
   conflicts);
3. makes those writes visible to the copy engine (``fence_proxy_async``: the engine reads
   shared memory through the *async proxy*, which does not see the threads' ordinary
   writes without the fence) and meets its warpgroup again: every thread's part is there;
4. in thread 0, issues one TMA store per 64 x 64 box and closes them into a bulk group
   (``bulk_commit_group``), and goes back to the next tile's K loop at once.

The store of tile t then runs during tile t + 1's K loop; the wait of step 1 comes only at
tile t + 1's epilogue. TMA leaves out the parts of a box past M or N itself: no masks. The
scratch is a whole tile of 16-bit values (BM x BN x 2 bytes) after the ring: with three
stages of 128 x 256 x 64 that is 147456 + 65536 bytes of shared memory.

The output needs a tensor map, so the same rules as A and B: rows contiguous, a row stride
that is a multiple of 16 bytes, a 16-byte-aligned start (``ptx_tma.tma_addressable``).
Where the output does not qualify, and where ``beta != 0`` (C is read), ``run`` hands the
product to ``k06_wide_stores``; where A or B does not, to ``k06_wgmma``.

Everything else is ``k06_wide_stores``'s. ``gl.show_diff("k06_wide_stores",
"k06_tma_store")`` shows the lines this step changes.
"""
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np
import torch
from numba import cuda, float32, int16, int64
from numba.types import float16

from .. import engines
from ..common import cdiv, sm_count
from ..ptx_hopper import (SWIZZLE_SMEM_ALIGN, setmaxnreg_dec, setmaxnreg_inc,
                          wgmma_commit_group, wgmma_fence, wgmma_mma, wgmma_store_d_swizzled,
                          wgmma_wait_group)
from ..ptx_mbarrier import (fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx,
                            mbarrier_init, mbarrier_wait, named_barrier_sync)
from ..ptx_cluster import launch_cluster
from ..ptx_simt import launch_bounds
from ..ptx_tma import (bulk_commit_group, bulk_wait_group_read, fence_proxy_async,
                       tma_addressable, tma_load_2d, tma_store_2d)
from . import FP16_BF16, Kernel
from . import k06_wgmma, k06_wide_stores
from .k06_persistent import SMEM_LIMIT, grid_size
from .k06_producer_consumer import (BK, ProducerConsumerConfig, registers, tensor_map,
                                    will_use_tma)
from .tc_common import allow_smem, check_bf16, check_hopper, engine_config, grouped_block

__all__ = ["TmaStoreConfig", "GPU_CONFIG", "SIM_CONFIG", "BUGS", "OUT_BOX", "smem_bytes",
           "will_store_with_tma", "make_kernel", "kernel_for", "run", "launch", "tma_store",
           "KERNELS"]

#: the broken variants :func:`make_kernel` builds: the ring's two, and ``'no_store_wait'``
BUGS = (None, "parity", "no_release", "no_store_wait")
#: rows and columns of one box of the output's tensor map (a consumer's 64 rows, 128 bytes)
OUT_BOX = 64


def smem_bytes(cfg):
    """Shared memory of one block: the ring (STAGES x (BM + BN) x 64 fp16) and the tile's
    scratch (BM x BN 16-bit outputs: 64 rows for each consumer)."""
    return cfg.STAGES * (cfg.BM + cfg.BN) * BK * 2 + cfg.BM * cfg.BN * 2


@dataclass(frozen=True)
class TmaStoreConfig(ProducerConsumerConfig):
    """:class:`ProducerConsumerConfig` whose ring and 16-bit tile scratch fit in one SM's
    shared memory (:func:`smem_bytes`): with BM 128, three stages of BN 256."""

    def rules(self):
        return super().rules() + [
            (smem_bytes(self) <= SMEM_LIMIT,
             f"the ring and the tile's scratch within {SMEM_LIMIT} bytes of shared memory "
             f"({smem_bytes(self)}: fewer STAGES or a smaller BN)")]


GPU_CONFIG = TmaStoreConfig(BM=128, BN=256, STAGES=3)
SIM_CONFIG = TmaStoreConfig(BM=128, BN=64, STAGES=3)     # the same ring, narrower tiles


@lru_cache(maxsize=None)
def make_kernel(cfg, bf16=False, bug=None):
    """The persistent kernel whose tiles TMA stores, for one :class:`TmaStoreConfig` (fp16,
    or bf16 with ``bf16=True``). ``bug`` builds a deliberately broken kernel from the same
    source, to see what the simulator says: ``'parity'`` and ``'no_release'`` break the ring
    (as in ``k06_producer_consumer``); ``'no_store_wait'`` drops the wait for the last
    tile's store before the scratch is written again."""
    if bug not in BUGS:
        raise ValueError(f"bug must be one of {BUGS}, got {bug!r}")
    BM, BN, STAGES, GROUP_M = cfg.BM, cfg.BN, cfg.STAGES, cfg.GROUP_M
    dt = int16 if bf16 else float16
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
    STORE_WAIT = bug != "no_store_wait"
    OUT_BOXES = BN // OUT_BOX                       # 64 x 64 output boxes per consumer
    SO = STAGES * STAGE                             # the scratch starts after the ring
    SMEM_BYTES = smem_bytes(cfg)
    REGS, PRODUCER_REGS, CONSUMER_REGS = registers(cfg)

    @cuda.jit(**launch_bounds(NT, 1))        # ptxas starts every thread at REGS registers
    def tma_store(tA, tB, tOut, M, N, K, alpha):
        # tA, tB, tOut: tensor maps of A (M, K), B (K, N) and Out (M, N) (boxes BM x 64,
        # 64 x 64 and 64 x 64); alpha: float32
        smem = cuda.shared.array(0, dt, alignment=SWIZZLE_SMEM_ALIGN)  # ring, then scratch
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

                # -- epilogue: the tile, scaled and rounded, into this consumer's scratch
                #    after the ring; one thread hands it to TMA, and all go on to the next
                #    tile while the copy engine stores it
                rows = (wg - 1) * 64
                mine = SO + rows * BN               # this consumer's 64 x BN scratch
                t = tid % 128
                if t == 0 and STORE_WAIT:
                    bulk_wait_group_read(0)         # the last tile's store has read it ...
                named_barrier_sync(1 + wg, 128)     # ... before any thread writes it again
                wgmma_store_d_swizzled(smem, mine, acc, BN, alpha)   # 64 x 64 boxes
                fence_proxy_async()                 # the writes, visible to the copy engine
                named_barrier_sync(1 + wg, 128)     # every thread's part is in the scratch
                if t == 0:
                    for j in range(OUT_BOXES):      # TMA leaves out what lies past M and N
                        tma_store_2d(tOut, bn + OUT_BOX * j, bm + rows, smem,
                                     mine + j * OUT_BOX * OUT_BOX)
                    bulk_commit_group()
            if tid % 128 == 0:
                bulk_wait_group_read(0)             # the scratch is read before the exit

    tma_store.threads = NT
    tma_store.launch_bounds = (NT, 1)
    tma_store.smem_bytes = SMEM_BYTES
    tma_store.config = cfg
    return tma_store


# ------------------------------------------------------------------------------ launchers
def kernel_for(config=None, bf16=False):
    """The kernel object :func:`run` launches for ``config`` (overrides of this engine's
    configuration)."""
    return make_kernel(engine_config(GPU_CONFIG, SIM_CONFIG, config), bf16)


def will_store_with_tma(out, beta=0.0):
    """Whether :func:`run` stores ``out`` with TMA (else ``k06_wide_stores`` runs), and why
    not, where not."""
    if beta != 0:
        return False, "beta != 0: C is read, element by element"
    ok, why = tma_addressable(out)
    return ok, "" if ok else f"Out: {why}"


def run(a, b, c, out, alpha=1.0, beta=0.0, config=None, bug=None, blocks=None):
    """``out = alpha * a @ b + beta * c``; ``c`` may be None when ``beta == 0``. ``blocks``:
    the size of the persistent grid (default: one block per SM; at most one per tile).
    ``k06_wide_stores`` runs where ``beta != 0`` or TMA cannot address ``out``
    (:func:`will_store_with_tma`), with this ``config``; ``k06_wgmma`` where it cannot
    address ``a`` or ``b``."""
    wide = asdict(config) if config is not None and not isinstance(config, dict) else config
    launch(KERNELS[0], make_kernel, (GPU_CONFIG, SIM_CONFIG), a, b, c, out, alpha, beta,
           config, bug, blocks, wide)


def launch(entry, make, configs, a, b, c, out, alpha, beta, config, bug, blocks,
           wide_config=None, cluster=1):
    """:func:`run` for the kernel ``make(cfg, bf16, bug)`` builds, ``cfg`` the GPU or the
    simulator's configuration of ``configs`` with ``config``'s changes (this kernel, or
    step 9's, or ``k06_cluster``'s, launched in clusters of ``cluster`` blocks along N).
    Where TMA cannot store ``out`` or ``beta != 0``, ``k06_wide_stores`` runs with
    ``wide_config`` (None: its own); where it cannot load ``a`` or ``b``, ``k06_wgmma``."""
    check_hopper(entry, "TMA and wgmma exist")
    check_bf16(a.dtype)
    if not will_store_with_tma(out, beta)[0]:
        k06_wide_stores.run(a, b, c, out, alpha, beta, wide_config, None, blocks)
        return
    if not will_use_tma(a, b)[0]:
        k06_wgmma.run(a, b, c, out, alpha, beta)
        return
    cfg = engine_config(*configs, config)
    kernel = make(cfg, a.dtype == torch.bfloat16, bug)
    M, K = a.shape
    N = b.shape[1]
    grid = grid_size(M, N, cfg, blocks)
    if cluster > 1:             # whole clusters, each on a cluster's tile of BM x cluster * BN
        grid = cluster * min(max(1, (blocks or sm_count()) // cluster),
                             cdiv(M, cfg.BM) * cdiv(N, cluster * cfg.BN))
    # the maps (cached by address, shape and strides) and the tensors stay referenced here
    # until the launch is queued
    tA, tB, tOut = tensor_map(a, cfg.BM), tensor_map(b, BK), tensor_map(out, OUT_BOX)
    args = (engines.as_numba(tA), engines.as_numba(tB), engines.as_numba(tOut), M, N, K,
            np.float32(alpha))
    allow_smem(kernel, args, kernel.smem_bytes)
    if cluster > 1:
        launch_cluster(kernel, grid, cluster, kernel.threads, engines.numba_stream(),
                       kernel.smem_bytes, *args)
    else:
        kernel[grid, kernel.threads, engines.numba_stream(), kernel.smem_bytes](*args)


def tma_store(a, b, c):
    """C = A @ B on the persistent grid, each tile stored by TMA during the next one."""
    run(a, b, None, c)


def blas_gemm(a3, b3, c3, out, alpha, beta, bias, activation):
    """gl.gemm hook: ``out = alpha * a @ b + beta * c`` (3-D views with one batch)."""
    run(a3[0], b3[0], None if c3 is None else c3[0], out[0], alpha, beta)


def _ptx(cc, bf16=False):
    k = make_kernel(GPU_CONFIG, bf16=bf16)
    return (k.py_func, "void(int64[::1], int64[::1], int64[::1], int64, int64, int64, float32)",
            {"launch_bounds": k.launch_bounds})


KERNELS = [
    Kernel("k06_tma_store", 6, "numba", FP16_BF16,
           "The persistent kernel whose tiles TMA stores from shared memory, each store "
           "running during the next tile's K loop",
           launch=tma_store, min_cc=(9, 0), cc_below=(10, 0), ptx=_ptx,
           source=make_kernel, gemm=blas_gemm, features=frozenset({"alpha_beta"}), step=8,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
