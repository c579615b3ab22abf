"""Lesson 06, step 9: ping-pong consumers, one writing a tile out while the other multiplies.

In ``k06_tma_store`` both consumers work on the same tile, 64 rows each: they run their K
loops together and reach the epilogue together, and while they write the tile into the
scratch, nobody issues ``wgmma``. The TMA store took the global writes off them, but the
accumulators still have to be scaled, rounded and written to shared memory, and the
barriers around that, once per tile.

Here each consumer takes a **whole tile** (64 x BN) and the two take turns: consumer 0 walks
the block's tiles 0, 2, 4, ..., consumer 1 the tiles 1, 3, 5, ..., and their K loops
alternate on the tensor cores:

* a pair of mbarriers, ``turn[0]`` and ``turn[1]`` (128 arrivals: every thread of the
  consumer whose turn ends), orders them. Consumer ``c`` waits on ``turn[c]`` before its K
  loop and arrives on ``turn[1 - c]`` once its last ``wgmma`` of the tile is issued; the
  other consumer's K loop starts then, while this one finishes its tile and runs its
  epilogue. Consumer ``c``'s ``n``-th tile waits with parity ``(n & 1) ^ (1 - c)``: consumer
  0's first wait is for the phase before the first (parity 1: it passes at once);
* the ring is the same ring, one k-tile per stage, in the order the producer loads them:
  tile ``i`` of the block has its k-tiles at ring positions ``i * k_tiles, ...``, so each
  consumer finds its stage and parity from its tile's index; a stage is released by the 128
  threads of the consumer that read it;
* the epilogue is ``k06_tma_store``'s, each consumer with its own 64 x BN scratch.

A tile of 64 x 256 needs A tiles of 64 rows: a stage holds 64 x 64 of A and 64 x 256 of B,
and four stages and the two scratches fit in shared memory (:func:`smem_bytes`).
``k06_tma_store``'s launcher rules apply: ``beta != 0`` and outputs TMA cannot address run
``k06_wide_stores``, operands TMA cannot address ``k06_wgmma``.
"""
from dataclasses import dataclass
from functools import lru_cache

from numba import cuda, float32, int16, int64
from numba.types import float16

from ..ptx_hopper import (SWIZZLE_SMEM_ALIGN, setmaxnreg_dec, setmaxnreg_inc,
                          wgmma_commit_group, wgmma_fence, wgmma_mma, wgmma_store_d_swizzled,
                          wgmma_wait_group)
from ..ptx_mbarrier import (fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx,
                            mbarrier_init, mbarrier_wait, named_barrier_sync)
from ..ptx_simt import launch_bounds
from ..ptx_tma import (bulk_commit_group, bulk_wait_group_read, fence_proxy_async,
                       tma_load_2d, tma_store_2d)
from . import FP16_BF16, Kernel
from .k06_persistent import SMEM_LIMIT
from .k06_producer_consumer import BK, ProducerConsumerConfig, registers
from .k06_tma_store import OUT_BOX, launch
from .tc_common import TileConfig, engine_config, grouped_block

__all__ = ["PingpongConfig", "GPU_CONFIG", "SIM_CONFIG", "BUGS", "smem_bytes", "make_kernel",
           "kernel_for", "run", "pingpong", "KERNELS"]

#: the broken variants :func:`make_kernel` builds
BUGS = (None, "parity", "no_release", "no_store_wait", "turn_parity")
#: the register split of three warpgroups (one producer, two consumers), as in step 5
THREE_WARPGROUPS = ProducerConsumerConfig(BM=128)


def smem_bytes(cfg):
    """Shared memory of one block: the ring (STAGES x (64 + BN) x 64 fp16) and two tile
    scratches (64 x BN 16-bit outputs each)."""
    return cfg.STAGES * (cfg.BM + cfg.BN) * BK * 2 + 2 * cfg.BM * cfg.BN * 2


@dataclass(frozen=True)
class PingpongConfig(TileConfig):
    """Tiles of the ping-pong kernel: BM = 64 rows per tile (one consumer warpgroup's), BN
    the N of each wgmma, STAGES k-tiles in the ring, GROUP_M tile rows walk across N
    together. Threads: 384 (a producer and two consumer warpgroups)."""
    BM: int = 64
    BN: int = 256
    STAGES: int = 4
    GROUP_M: int = 8

    def rules(self):
        return [(self.BM == 64, "BM 64 (one consumer warpgroup per tile)"),
                (self.BN in (64, 128, 192, 256), "BN 64, 128, 192 or 256 (a wgmma's N)"),
                (self.STAGES >= 2, "STAGES >= 2 (a stage filled while another is read)"),
                (smem_bytes(self) <= SMEM_LIMIT,
                 f"the ring and the two scratches within {SMEM_LIMIT} bytes of shared memory "
                 f"({smem_bytes(self)}: fewer STAGES or a smaller BN)")]


GPU_CONFIG = PingpongConfig(BM=64, BN=256, STAGES=4)
SIM_CONFIG = PingpongConfig(BM=64, BN=64, STAGES=4)       # the same ring, narrower tiles


@lru_cache(maxsize=None)
def make_kernel(cfg, bf16=False, bug=None):
    """The ping-pong kernel for one :class:`PingpongConfig` (fp16, or bf16 with
    ``bf16=True``). ``bug`` builds a deliberately broken kernel from the same source, to see
    what the simulator says: ``'parity'``, ``'no_release'`` and ``'no_store_wait'`` as in
    ``k06_tma_store``; ``'turn_parity'``: the first consumer's first wait for its turn has
    parity 0 (it waits for a phase only the other consumer completes, after its own turn)."""
    if bug not in BUGS:
        raise ValueError(f"bug must be one of {BUGS}, got {bug!r}")
    BM, BN, STAGES, GROUP_M = cfg.BM, cfg.BN, cfg.STAGES, cfg.GROUP_M
    dt = int16 if bf16 else float16
    NT = 128 * 3                                    # the producer warpgroup + 2 consumers
    NACC = BN // 2                                  # accumulators per consumer thread
    A_STAGE, B_STAGE = BM * BK, BK * BN             # elements per stage
    STAGE = A_STAGE + B_STAGE
    STAGE_BYTES = 2 * STAGE                         # what the copies of one stage deliver
    B_BOXES = BN // 64                              # 64 x 64 TMA boxes of B per stage
    B_LBO = BK * 128                                # bytes between B's 64-column atoms
    EMPTY_ARRIVALS = 128                            # the threads of the stage's consumer
    EMPTY_PARITY0 = 0 if bug == "parity" else 1     # the producer's parity in round 0
    RELEASE = bug != "no_release"
    STORE_WAIT = bug != "no_store_wait"
    TURN_FLIP = 1 if bug == "turn_parity" else 0    # the first consumer's parity, flipped
    OUT_BOXES = BN // OUT_BOX                       # 64 x 64 output boxes per consumer
    SO = STAGES * STAGE                             # the scratch starts after the ring
    SMEM_BYTES = smem_bytes(cfg)
    REGS, PRODUCER_REGS, CONSUMER_REGS = registers(THREE_WARPGROUPS)

    @cuda.jit(**launch_bounds(NT, 1))        # ptxas starts every thread at REGS registers
    def pingpong(tA, tB, tOut, M, N, K, alpha):
        # tA, tB, tOut: tensor maps of A (M, K), B (K, N) and Out (M, N) (boxes 64 x 64);
        # alpha: float32
        smem = cuda.shared.array(0, dt, alignment=SWIZZLE_SMEM_ALIGN)  # ring, then scratch
        full = cuda.shared.array(STAGES, int64)     # stage s holds its tile
        empty = cuda.shared.array(STAGES, int64)    # stage s has been read by its consumer
        turn = cuda.shared.array(2, int64)          # consumer c may issue its wgmma
        tid = cuda.threadIdx.x
        wg = tid // 128
        tiles = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
        k_tiles = (K + BK - 1) // BK if alpha != 0 else 0
        walks = (tiles - cuda.blockIdx.x + cuda.gridDim.x - 1) // cuda.gridDim.x   # my tiles

        if tid == 0:
            for s in range(STAGES):
                mbarrier_init(full, s, 1)
                mbarrier_init(empty, s, EMPTY_ARRIVALS)
            for c in range(2):
                mbarrier_init(turn, c, 128)
            fence_mbarrier_init()
        cuda.syncthreads()                          # the last block-wide barrier

        if wg == 0:
            # -- the producer: one thread fills the ring; its warpgroup gives registers back
            setmaxnreg_dec(PRODUCER_REGS)
            if tid == 0:
                it = 0                              # k-tiles loaded so far, over all tiles
                for i in range(walks):              # the block's tiles, both consumers'
                    bm, bn = grouped_block(cuda.blockIdx.x + i * cuda.gridDim.x, M, N, BM, BN,
                                           GROUP_M)
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
            # -- a consumer: every other tile of the block, with the registers the producer
            #    gave up, its K loop in turn with the other consumer's
            setmaxnreg_inc(CONSUMER_REGS)
            acc = cuda.local.array(NACC, float32)
            c = wg - 1                              # consumer c: the block's tiles c, c + 2, ..
            for i in range(c, walks, 2):
                bm, bn = grouped_block(cuda.blockIdx.x + i * cuda.gridDim.x, M, N, BM, BN,
                                       GROUP_M)
                for j in range(NACC):
                    acc[j] = float32(0.0)
                # my turn: the other consumer has issued its last tile's wgmma (consumer 0's
                # first turn waits for the phase before the first: parity 1)
                mbarrier_wait(turn, c, ((i // 2) & 1) ^ (1 - c) ^ (TURN_FLIP * (1 - c)))
                it = i * k_tiles                    # this tile's first k-tile in the ring
                for kt in range(k_tiles):
                    s = it % STAGES
                    mbarrier_wait(full, s, (it // STAGES) & 1)
                    base = s * STAGE
                    wgmma_fence()
                    wgmma_mma(acc, smem, base, smem, base + A_STAGE, BN, B_LBO)
                    wgmma_mma(acc, smem, base + 16, smem, base + A_STAGE + 16 * 64, BN, B_LBO)
                    wgmma_mma(acc, smem, base + 32, smem, base + A_STAGE + 32 * 64, BN, B_LBO)
                    wgmma_mma(acc, smem, base + 48, smem, base + A_STAGE + 48 * 64, BN, B_LBO)
                    wgmma_commit_group()
                    wgmma_wait_group(1, acc, NACC)  # k-tile it - 1's wgmma are done ...
                    if RELEASE and kt > 0:
                        mbarrier_arrive(empty, (it - 1) % STAGES)   # ... so its stage is free
                    it += 1
                mbarrier_arrive(turn, 1 - c)        # the other consumer's turn
                wgmma_wait_group(0, acc, NACC)
                if RELEASE and k_tiles > 0:
                    mbarrier_arrive(empty, (it - 1) % STAGES)   # the tile's last stage too

                # -- epilogue, while the other consumer's wgmma run: as in k06_tma_store,
                #    the tile into this consumer's scratch, then TMA stores it
                mine = SO + c * BM * BN             # this consumer's 64 x BN scratch
                t = tid % 128
                if t == 0 and STORE_WAIT:
                    bulk_wait_group_read(0)         # the last tile's store has read it ...
                named_barrier_sync(1 + wg, 128)     # ... before any thread writes it again
                wgmma_store_d_swizzled(smem, mine, acc, BN, alpha)   # 64 x 64 boxes
                fence_proxy_async()                 # the writes, visible to the copy engine
                named_barrier_sync(1 + wg, 128)     # every thread's part is in the scratch
                if t == 0:
                    for j in range(OUT_BOXES):      # TMA leaves out what lies past M and N
                        tma_store_2d(tOut, bn + OUT_BOX * j, bm, smem,
                                     mine + j * OUT_BOX * OUT_BOX)
                    bulk_commit_group()
            if tid % 128 == 0:
                bulk_wait_group_read(0)             # the scratch is read before the exit

    pingpong.threads = NT
    pingpong.launch_bounds = (NT, 1)
    pingpong.smem_bytes = SMEM_BYTES
    pingpong.config = cfg
    return pingpong


# ------------------------------------------------------------------------------ launchers
def kernel_for(config=None, bf16=False):
    """The kernel object :func:`run` launches for ``config`` (overrides of this engine's
    configuration)."""
    return make_kernel(engine_config(GPU_CONFIG, SIM_CONFIG, config), bf16)


def run(a, b, c, out, alpha=1.0, beta=0.0, config=None, bug=None, blocks=None):
    """``out = alpha * a @ b + beta * c``; ``c`` may be None when ``beta == 0``. ``blocks``:
    the size of the persistent grid (default: one block per SM; at most one per tile).
    ``k06_tma_store``'s launcher (:func:`k06_tma_store.launch`): ``k06_wide_stores``
    runs where ``beta != 0`` or TMA cannot address ``out``, ``k06_wgmma`` where it cannot
    address ``a`` or ``b``."""
    launch(KERNELS[0], make_kernel, (GPU_CONFIG, SIM_CONFIG), a, b, c, out, alpha, beta,
           config, bug, blocks)


def pingpong(a, b, c):
    """C = A @ B on the persistent grid, two consumers taking turns on the tensor cores."""
    run(a, b, None, c)


def blas_gemm(a3, b3, c3, out, alpha, beta, bias, activation):
    """gl.gemm hook: ``out = alpha * a @ b + beta * c`` (3-D views with one batch)."""
    run(a3[0], b3[0], None if c3 is None else c3[0], out[0], alpha, beta)


def _ptx(cc, bf16=False):
    k = make_kernel(GPU_CONFIG, bf16=bf16)
    return (k.py_func, "void(int64[::1], int64[::1], int64[::1], int64, int64, int64, float32)",
            {"launch_bounds": k.launch_bounds})


KERNELS = [
    Kernel("k06_pingpong", 6, "numba", FP16_BF16,
           "Two consumer warpgroups on two tiles, taking turns on the tensor cores: one "
           "writes its tile out while the other multiplies",
           launch=pingpong, min_cc=(9, 0), cc_below=(10, 0), ptx=_ptx,
           source=make_kernel, gemm=blas_gemm, features=frozenset({"alpha_beta"}), step=9,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
