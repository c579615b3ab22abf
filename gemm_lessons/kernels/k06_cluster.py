"""Lesson 06, step 10: clusters of two blocks along N, which load their shared A tile once.

In ``k06_tma_store`` two blocks whose tiles lie side by side in N read the same row panel of
A: each loads every k-tile of it through L2. Hopper runs a *cluster* of blocks at once on
neighbouring SMs, and a TMA load can *multicast*: one instruction, one read of L2, the box
written into the same offset of every block of the cluster, its bytes completed on each
block's own mbarrier (``ptx_cluster``). This kernel launches clusters of ``CLUSTER`` blocks
along N; cluster ``c`` walks the tiles of ``BM x CLUSTER * BN`` (in the grouped order), and
its block of rank ``r`` computes columns ``r * BN`` onwards of each. Against step 8:

* the block of rank 0 loads A's box for the whole cluster (``tma_load_2d_multicast`` with
  every block's bit in the mask); every block loads its own B and announces the whole
  stage's bytes on its own ``full`` barrier, as before;
* a stage may be refilled only once it is read in *every* block (rank 0 writes into all of
  them): each consumer thread releases the stage on the ``empty`` barrier of every block of
  the cluster, so ``empty`` counts the consumers of the whole cluster, and every producer
  waits for all of them. The release is at CTA scope (``mbarrier_arrive_cluster``, as
  CUTLASS's ``ClusterBarrier::arrive`` emits): a consumer that frees a stage publishes no
  data (its ``wgmma`` reads are complete), so it needs no fence. ``RELEASE='cluster'``
  builds the same kernel with releases at cluster scope
  (``mbarrier_arrive_cluster_release``), which ptxas compiles with a ``MEMBAR.ALL.GPU``
  before every arrival: lesson 06 times what that fence costs;
* the blocks meet at the cluster barrier (``barrier_cluster_arrive`` / ``_wait``) where
  step 8 had its ``syncthreads``, after the barriers are initialized and before another
  block may signal them, and again before they exit, so that no block leaves while another
  may still write into its shared memory or arrive on its barriers.

The launcher (``k06_tma_store.launch``, with ``cluster``) launches whole clusters through
``ptx_cluster.launch_cluster``: numba's own launch has no cluster shape.

The simulator runs the blocks of a grid one after another, so it runs this kernel with
clusters of one block (``SIM_CONFIG``: ``CLUSTER = 1``), where the ring, the multicast to
one block and the cluster barriers keep their meaning; what a second block adds (its
arrivals, the copy that lands in both) is checked on a GPU only.
"""
from dataclasses import asdict, dataclass
from functools import lru_cache

from numba import cuda, float32, int16, int64
from numba.types import float16

from ..ptx_cluster import (MAX_PORTABLE_CLUSTER, barrier_cluster_arrive,
                           barrier_cluster_wait, cluster_ctarank, mbarrier_arrive_cluster,
                           mbarrier_arrive_cluster_release, tma_load_2d_multicast)
from ..ptx_hopper import (SWIZZLE_SMEM_ALIGN, setmaxnreg_dec, setmaxnreg_inc,
                          wgmma_commit_group, wgmma_fence, wgmma_mma, wgmma_store_d_swizzled,
                          wgmma_wait_group)
from ..ptx_mbarrier import (fence_mbarrier_init, mbarrier_arrive_expect_tx, mbarrier_init,
                            mbarrier_wait, named_barrier_sync)
from ..ptx_simt import launch_bounds
from ..ptx_tma import (bulk_commit_group, bulk_wait_group_read, fence_proxy_async,
                       tma_load_2d, tma_store_2d)
from . import FP16_BF16, Kernel
from .k06_producer_consumer import BK, registers
from .k06_tma_store import BUGS as TMA_STORE_BUGS
from .k06_tma_store import OUT_BOX, TmaStoreConfig, launch, smem_bytes
from .tc_common import engine_config, grouped_block

__all__ = ["ClusterConfig", "GPU_CONFIG", "SIM_CONFIG", "BUGS", "make_kernel", "kernel_for",
           "run", "cluster", "KERNELS"]


@dataclass(frozen=True)
class ClusterConfig(TmaStoreConfig):
    """:class:`~gemm_lessons.kernels.k06_tma_store.TmaStoreConfig`, CLUSTER, the blocks
    of a cluster along N (1 to 8: a GPU runs clusters of up to 8 blocks everywhere), and
    RELEASE, the scope at which a consumer's arrival on another block's ``empty`` barrier
    releases: ``'cta'`` (``mbarrier_arrive_cluster``, no fence; the default) or ``'cluster'``
    (``mbarrier_arrive_cluster_release``, a ``MEMBAR.ALL.GPU`` before every arrival)."""
    CLUSTER: int = 2
    RELEASE: str = "cta"

    def rules(self):
        return super().rules() + [
            (1 <= self.CLUSTER <= MAX_PORTABLE_CLUSTER,
             f"CLUSTER from 1 to {MAX_PORTABLE_CLUSTER} (a cluster every Hopper GPU runs)"),
            (self.RELEASE in ("cta", "cluster"),
             f"RELEASE 'cta' or 'cluster' (the scope of a remote release), got "
             f"{self.RELEASE!r}")]


GPU_CONFIG = ClusterConfig(BM=128, BN=256, STAGES=3, CLUSTER=2)
SIM_CONFIG = ClusterConfig(BM=128, BN=64, STAGES=3, CLUSTER=1)   # blocks run one at a time
#: step 8's broken variants, and ``'no_cluster_arrive'``: the first meeting of the cluster
#: is a ``barrier_cluster_wait`` without its ``barrier_cluster_arrive``
BUGS = TMA_STORE_BUGS + ("no_cluster_arrive",)


@lru_cache(maxsize=None)
def make_kernel(cfg, bf16=False, bug=None):
    """The cluster kernel for one :class:`ClusterConfig` (fp16, or bf16 with ``bf16=True``).
    ``bug``: the broken variants of ``k06_tma_store`` (``'parity'``, ``'no_release'``,
    ``'no_store_wait'``) and ``'no_cluster_arrive'`` (every thread waits at the cluster's
    first meeting without arriving), from the same source."""
    if bug not in BUGS:
        raise ValueError(f"bug must be one of {BUGS}, got {bug!r}")
    BM, BN, STAGES, GROUP_M, CLUSTER = cfg.BM, cfg.BN, cfg.STAGES, cfg.GROUP_M, cfg.CLUSTER
    dt = int16 if bf16 else float16
    CONSUMERS = BM // 64
    NT = 128 * (1 + CONSUMERS)                      # the producer warpgroup + consumers
    NACC = BN // 2                                  # accumulators per consumer thread
    A_STAGE, B_STAGE = BM * BK, BK * BN             # elements per stage
    STAGE = A_STAGE + B_STAGE
    STAGE_BYTES = 2 * STAGE                         # what the copies of one stage deliver
    B_BOXES = BN // 64                              # 64 x 64 TMA boxes of B per stage
    B_LBO = BK * 128                                # bytes between B's 64-column atoms
    EMPTY_ARRIVALS = 128 * CONSUMERS * CLUSTER      # every consumer thread of the cluster
    A_MASK = (1 << CLUSTER) - 1                     # A's box lands in every block of it
    CN = CLUSTER * BN                               # a cluster's tile: BM x CLUSTER * BN
    EMPTY_PARITY0 = 0 if bug == "parity" else 1     # the producer's parity in round 0
    RELEASE = bug != "no_release"
    STORE_WAIT = bug != "no_store_wait"
    CLUSTER_ARRIVE = bug != "no_cluster_arrive"
    # a stage's release in another block: at CTA scope (no fence), or at cluster scope
    release_in = (mbarrier_arrive_cluster_release if cfg.RELEASE == "cluster"
                  else mbarrier_arrive_cluster)
    OUT_BOXES = BN // OUT_BOX                       # 64 x 64 output boxes per consumer
    SO = STAGES * STAGE                             # the scratch starts after the ring
    SMEM_BYTES = smem_bytes(cfg)
    REGS, PRODUCER_REGS, CONSUMER_REGS = registers(cfg)

    @cuda.jit(**launch_bounds(NT, 1))        # ptxas starts every thread at REGS registers
    def cluster(tA, tB, tOut, M, N, K, alpha):
        # tA, tB, tOut: tensor maps of A (M, K), B (K, N) and Out (M, N) (boxes BM x 64,
        # 64 x 64 and 64 x 64); alpha: float32
        smem = cuda.shared.array(0, dt, alignment=SWIZZLE_SMEM_ALIGN)  # ring, then scratch
        full = cuda.shared.array(STAGES, int64)     # stage s holds its tile
        empty = cuda.shared.array(STAGES, int64)    # stage s is read in every block
        tid = cuda.threadIdx.x
        wg = tid // 128
        rank = cluster_ctarank()                    # this block's place in its cluster
        first = cuda.blockIdx.x // CLUSTER          # this cluster's first tile
        clusters = cuda.gridDim.x // CLUSTER
        tiles = ((M + BM - 1) // BM) * ((N + CN - 1) // CN)     # the clusters' tiles
        k_tiles = (K + BK - 1) // BK if alpha != 0 else 0

        if tid == 0:
            for s in range(STAGES):
                mbarrier_init(full, s, 1)
                mbarrier_init(empty, s, EMPTY_ARRIVALS)
            fence_mbarrier_init()
        if CLUSTER_ARRIVE:
            barrier_cluster_arrive()                # every block's barriers are ready
        barrier_cluster_wait()                      # before any block signals another's

        if wg == 0:
            # -- the producer: one thread fills the ring; its warpgroup gives registers back
            setmaxnreg_dec(PRODUCER_REGS)
            if tid == 0:
                it = 0                              # k-tiles loaded so far, over all tiles
                for tile in range(first, tiles, clusters):
                    bm, bn = grouped_block(tile, M, N, BM, CN, GROUP_M)
                    bn += rank * BN                 # this block's columns of the tile
                    for kt in range(k_tiles):
                        s = it % STAGES             # free in every block of the cluster:
                        mbarrier_wait(empty, s, ((it // STAGES) & 1) ^ EMPTY_PARITY0)
                        base = s * STAGE
                        mbarrier_arrive_expect_tx(full, s, STAGE_BYTES)  # A from rank 0
                        if rank == 0:
                            tma_load_2d_multicast(smem, base, tA, kt * BK, bm, full, s,
                                                  A_MASK)
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
            for tile in range(first, tiles, clusters):
                bm, bn = grouped_block(tile, M, N, BM, CN, GROUP_M)
                bn += rank * BN
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
                    if RELEASE and kt > 0:          # ... so its stage is free, in each block
                        for r in range(CLUSTER):
                            release_in(empty, (it - 1) % STAGES, r)
                    it += 1
                wgmma_wait_group(0, acc, NACC)
                if RELEASE and k_tiles > 0:         # the tile's last stage too
                    for r in range(CLUSTER):
                        release_in(empty, (it - 1) % STAGES, r)

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
        barrier_cluster_arrive()                    # no block exits while another may
        barrier_cluster_wait()                      # still signal it or write its ring

    cluster.threads = NT
    cluster.launch_bounds = (NT, 1)
    cluster.smem_bytes = SMEM_BYTES
    cluster.config = cfg
    return cluster


# ------------------------------------------------------------------------------ launchers
def kernel_for(config=None, bf16=False):
    """The kernel object :func:`run` launches for ``config`` (overrides of this engine's
    configuration)."""
    return make_kernel(engine_config(GPU_CONFIG, SIM_CONFIG, config), bf16)


def run(a, b, c, out, alpha=1.0, beta=0.0, config=None, bug=None, blocks=None):
    """``out = alpha * a @ b + beta * c``; ``c`` may be None when ``beta == 0``. ``blocks``:
    at most this many blocks, in whole clusters (default: one per SM). ``k06_tma_store``'s
    launcher rules apply: ``k06_wide_stores`` where ``beta != 0`` or TMA cannot address
    ``out``, ``k06_wgmma`` where it cannot address ``a`` or ``b``."""
    cfg = engine_config(GPU_CONFIG, SIM_CONFIG, config)
    wide = {k: v for k, v in asdict(cfg).items() if k not in ("CLUSTER", "RELEASE")}
    launch(KERNELS[0], make_kernel, (GPU_CONFIG, SIM_CONFIG), a, b, c, out, alpha, beta,
           cfg, bug, blocks, wide, cfg.CLUSTER)


def cluster(a, b, c):
    """C = A @ B on a persistent grid of clusters that load their shared A tile once."""
    run(a, b, None, c)


def blas_gemm(a3, b3, c3, out, alpha, beta, bias, activation):
    """gl.gemm hook: ``out = alpha * a @ b + beta * c`` (3-D views with one batch)."""
    run(a3[0], b3[0], None if c3 is None else c3[0], out[0], alpha, beta)


def _ptx(cc, bf16=False, config=None):
    k = make_kernel(GPU_CONFIG.replace(**(config or {})), bf16=bf16)
    return (k.py_func, "void(int64[::1], int64[::1], int64[::1], int64, int64, int64, float32)",
            {"launch_bounds": k.launch_bounds})


KERNELS = [
    Kernel("k06_cluster", 6, "numba", FP16_BF16,
           "Step 8's kernel in clusters of two blocks along N: one TMA load multicasts the "
           "shared A tile into both",
           launch=cluster, min_cc=(9, 0), cc_below=(10, 0), ptx=_ptx,
           source=make_kernel, gemm=blas_gemm, features=frozenset({"alpha_beta"}), step=10,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
