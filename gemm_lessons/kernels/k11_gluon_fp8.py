"""Lesson 11, block scales with two consumer warpgroups out of step (Hopper; Gluon).

``k11_fp8_blockwise`` promotes each K-step's product on the CUDA cores, and it must wait
for the tensor core first (``wgmma.wait_group 0``): while a warpgroup multiplies and adds
the K-step's ``sa * sb`` into its fp32 sum, its tensor core has nothing to do. In Triton's
``tl`` the program's warpgroups wait together (every K-step ends in a barrier of all the
program's warps before the slot is refilled), so they all promote at the same time too.

Here the program's warps are given roles, as in ``k09_fused_ws`` (lesson 09), and the two
halves of the 128-row tile belong to two **consumer warpgroups that do not wait for each
other at each K-step** (the faster may run up to the ring's depth ahead):

- the **producer**, one warp, copies each K-step's A tile (128 x 128) and B tile (128 x 128,
  from B's transpose: an FP8 ``wgmma`` reads both operands K-major) into a ring of
  ``NUM_STAGES`` slots by TMA, each slot waiting for its ``empty`` barrier; it also loads
  the K-step's scales (one ``sa * sb`` per row of the tile) and stores them in the slot,
  whose ``ready`` barrier then counts two arrivals: the copies' and the scales';
- each **consumer** (four warps: one warpgroup), rows ``64 * HALF`` to ``64 * HALF + 63`` of
  the tile, waits for the slot's ``ready`` barrier, reads its 64 scales from the slot,
  multiplies its 64 rows of A by B from zero (``use_acc=False``), waits for that ``wgmma``
  alone, releases the slot (``empty`` counts two arrivals, one a consumer) and promotes: one
  fp32 multiply-add per element by the K-step's scales.

While one consumer promotes, the other's ``wgmma`` keeps the tensor core busy: DeepGEMM's
schedule, from Python. Where a consumer loads its K-step's scales from global memory itself,
the compiled code multiplies them (``sa * sb``) before it issues the ``wgmma``, so that each
K-step's ``wgmma`` waits for those loads: tens of cycles from L1, hundreds from L2, against
about 256 cycles for the ``wgmma`` (64 x 128 x 128 at the tensor core's FP8 rate). The
producer loads them while it waits for a free slot, so they are in shared memory when the
slot is ready, a few cycles from the consumers.

The grid is **persistent**: one program per multiprocessor, each taking tiles
``program_id``, ``program_id + programs``, ... in lesson 07's grouped order, the ring's
position (and its barriers' phases) running on from tile to tile. While the consumers store
a tile's rows (masked at M and N), the producer is already filling the ring with the next
tile's K-steps.

``WsConfig``'s ``scale_ring=False`` (each consumer loads its scales in the K-step) and
``persistent=False`` (one program per tile) keep the two alternatives to time against.

Shapes: any M, N, K; TMA fills zeros outside the operands, and an operand it cannot address
in place is copied into a padded buffer (``k08_triton_tma.tma_view``). Gluon compiles for
the GPU only (Triton's interpreter cannot run it): off a Hopper GPU the API refuses this
kernel and names ``k11_fp8_blockwise_tma``, which computes the same product there.
"""
from __future__ import annotations

from collections import namedtuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ..common import cdiv
from ..fp8 import SCALE_BLOCK
from . import Kernel
from .k07_triton_swizzle import TileConfig, check_offsets, grouped_pid
from .k08_triton_tma import persistent_programs, tma_view
from .k11_triton_fp8 import FP8, GROUP_SIZE_M, plain, scaled

__all__ = ["block_ws_kernel", "producer", "consumer", "tile_offsets", "WsConfig", "WS_CONFIG",
           "launch_ws", "asm_job"]

tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

# A tile configuration and the kernel's two options: ``scale_ring``, the producer brings each
# K-step's scales into a ring of shared memory beside the tiles (else each consumer loads
# them from global memory in the K-step), and ``persistent``, a grid of one program per
# multiprocessor, each walking several tiles (else one program a tile)
WsConfig = namedtuple("WsConfig", TileConfig._fields + ("scale_ring", "persistent"),
                      defaults=(True, True))
# 128 x 128 tiles 128 deep (a K-step is one scale block): two consumer warpgroups of 64 rows,
# five slots of (16 + 16) KB and 512 bytes of scales
WS_CONFIG = WsConfig(128, 128, 128, 4, 5)


@gluon.jit
def tile_offsets(tile_id, M, N, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr,
                 GROUP_SIZE_M: gl.constexpr):
    """Tile number -> its first row and column of C, in lesson 07's grouped order."""
    pid_m, pid_n = grouped_pid(tile_id, gl.cdiv(M, BLOCK_SIZE_M), gl.cdiv(N, BLOCK_SIZE_N),
                               GROUP_SIZE_M)
    return pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N


@gluon.jit
def producer(a_desc, bt_desc, a_ring, b_ring, s_ring, ready, empty, scale_a_ptr, scale_b_ptr,
             M, N, k_tiles, first_tile, num_tiles, tile_step,
             stride_sam, stride_sak, stride_sbk, stride_sbn,
             BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr, BLOCK_SIZE_K: gl.constexpr,
             GROUP_SIZE_M: gl.constexpr, NUM_STAGES: gl.constexpr, SCALE_BLOCK: gl.constexpr,
             SCALE_RING: gl.constexpr):
    """One warp: each K-step's A and B tiles (and its scales) into the ring's slots, tile
    after tile: it runs into the next tile's K-steps while the consumers store this one."""
    ROWS: gl.constexpr = gl.BlockedLayout([BLOCK_SIZE_M // 32], [32], [1], [0])
    it = 0                                   # K-steps so far, over all tiles: the ring's position
    for tile_id in range(first_tile, num_tiles, tile_step):
        off_m, off_n = tile_offsets(tile_id, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
        rows = off_m + gl.arange(0, BLOCK_SIZE_M, layout=ROWS)
        sa_ptrs = scale_a_ptr + (rows % M) * stride_sam      # rows past M: any row's scales
        sb_ptr = scale_b_ptr + (off_n // SCALE_BLOCK) * stride_sbn
        for ki in range(k_tiles):
            s = it % NUM_STAGES
            if SCALE_RING:
                # the K-step's scales, one per row of the tile (sa * sb), loaded from global
                # memory while the warp waits for the slot below
                sa = gl.load(sa_ptrs + ki * stride_sak)
                sb = gl.load(sb_ptr + ki * stride_sbk)
            # wait until both consumers have released the slot (the first pass waits on the
            # phase before the first, which counts as complete)
            mbarrier.wait(empty.index(s), ((it // NUM_STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s),
                            a_desc.block_type.nbytes + bt_desc.block_type.nbytes)
            tma_load(a_desc, [off_m, ki * BLOCK_SIZE_K], ready.index(s), a_ring.index(s))
            tma_load(bt_desc, [off_n, ki * BLOCK_SIZE_K], ready.index(s), b_ring.index(s))
            if SCALE_RING:
                s_ring.index(s).store(sa * sb)
                mbarrier.arrive(ready.index(s))          # the slot's second arrival
            it += 1


@gluon.jit
def consumer(a_ring, b_ring, s_ring, ready, empty, scale_a_ptr, scale_b_ptr, c_ptr,
             M, N, k_tiles, first_tile, num_tiles, tile_step,
             stride_sam, stride_sak, stride_sbk, stride_sbn, stride_cm, stride_cn,
             HALF: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr,
             GROUP_SIZE_M: gl.constexpr, NUM_STAGES: gl.constexpr,
             SCALE_BLOCK: gl.constexpr, SCALE_RING: gl.constexpr):
    """One warpgroup: 64 rows of each of its tiles, promoted every K-step, then stored."""
    ACC: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_SIZE_N, 32])
    zero = gl.zeros((64, BLOCK_SIZE_N), gl.float32, ACC)
    it = 0                                   # K-steps so far, over all tiles: the ring's position
    for tile_id in range(first_tile, num_tiles, tile_step):
        off_m, off_n = tile_offsets(tile_id, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
        rows = off_m + HALF * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, ACC))
        cols = off_n + gl.arange(0, BLOCK_SIZE_N, layout=gl.SliceLayout(0, ACC))
        sa_ptrs = scale_a_ptr + (rows % M) * stride_sam      # rows past M: any row's scales
        sb_ptr = scale_b_ptr + (off_n // SCALE_BLOCK) * stride_sbn
        acc = gl.zeros((64, BLOCK_SIZE_N), gl.float32, ACC)
        for ki in range(k_tiles):
            s = it % NUM_STAGES
            if not SCALE_RING:
                # the K-step's scales from global memory, loaded while the copies land (the
                # compiled code multiplies them before issuing the wgmma, which so waits for
                # the loads)
                scale = gl.load(sa_ptrs + ki * stride_sak) * gl.load(sb_ptr + ki * stride_sbk)
            mbarrier.wait(ready.index(s), (it // NUM_STAGES) & 1)
            if SCALE_RING:
                # the K-step's scales, from the slot: this warpgroup's 64 rows
                scale = s_ring.index(s).slice(HALF * 64, 64).load(gl.SliceLayout(1, ACC))
            a = a_ring.index(s).slice(HALF * 64, 64)           # this warpgroup's 64 rows
            b = b_ring.index(s).permute((1, 0))                # (BK, BN), K-major
            part = warpgroup_mma(a, b, zero, use_acc=False, is_async=True)
            part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
            mbarrier.arrive(empty.index(s))                    # this half is done with the slot
            acc += part * scale[:, None]                       # the promotion
            it += 1
        # the tile's 64 rows, while the producer fills the ring with the next tile's K-steps
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        gl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
                 acc.to(c_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def block_ws_kernel(
        a_desc, bt_desc, c_ptr, scale_a_ptr, scale_b_ptr,
        M, N, K,
        stride_sam, stride_sak, stride_sbk, stride_sbn,
        stride_cm, stride_cn,
        BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr, BLOCK_SIZE_K: gl.constexpr,
        GROUP_SIZE_M: gl.constexpr, NUM_STAGES: gl.constexpr, SCALE_BLOCK: gl.constexpr,
        SCALE_RING: gl.constexpr):
    # this program's tiles: first_tile, first_tile + tile_step, ... (the grid's size is the
    # step: one tile a program on a grid of every tile, several on a persistent grid)
    first_tile = gl.program_id(axis=0)
    tile_step = gl.num_programs(axis=0)
    num_tiles = gl.cdiv(M, BLOCK_SIZE_M) * gl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = gl.cdiv(K, BLOCK_SIZE_K)
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape,
                                       a_desc.layout)
    b_ring = gl.allocate_shared_memory(bt_desc.dtype, [NUM_STAGES] + bt_desc.block_type.shape,
                                       bt_desc.layout)
    # each slot's scales: BLOCK_SIZE_M floats in a row (the barriers' layout: no swizzle)
    s_ring = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_SIZE_M],
                                       gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                                               order=[0]))
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_STAGES):
        # a slot is ready when its copies have landed (and its scales are stored)
        mbarrier.init(ready.index(s), count=2 if SCALE_RING else 1)
        mbarrier.init(empty.index(s), count=2)      # released when both halves have read it
    fence_async_shared()
    gl.warp_specialize([
        (consumer, (a_ring, b_ring, s_ring, ready, empty, scale_a_ptr, scale_b_ptr, c_ptr, M,
                    N, k_tiles, first_tile, num_tiles, tile_step, stride_sam, stride_sak,
                    stride_sbk, stride_sbn, stride_cm, stride_cn, 0, BLOCK_SIZE_M,
                    BLOCK_SIZE_N, GROUP_SIZE_M, NUM_STAGES, SCALE_BLOCK, SCALE_RING)),
        (consumer, (a_ring, b_ring, s_ring, ready, empty, scale_a_ptr, scale_b_ptr, c_ptr, M,
                    N, k_tiles, first_tile, num_tiles, tile_step, stride_sam, stride_sak,
                    stride_sbk, stride_sbn, stride_cm, stride_cn, 1, BLOCK_SIZE_M,
                    BLOCK_SIZE_N, GROUP_SIZE_M, NUM_STAGES, SCALE_BLOCK, SCALE_RING)),
        (producer, (a_desc, bt_desc, a_ring, b_ring, s_ring, ready, empty, scale_a_ptr,
                    scale_b_ptr, M, N, k_tiles, first_tile, num_tiles, tile_step, stride_sam,
                    stride_sak, stride_sbk, stride_sbn, BLOCK_SIZE_M, BLOCK_SIZE_N,
                    BLOCK_SIZE_K, GROUP_SIZE_M, NUM_STAGES, SCALE_BLOCK, SCALE_RING)),
    ], [4, 1], [232, 40])     # registers a thread: the second consumer 232, the producer 40
    for s in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


_GL_DTYPE = {torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5}


def _descriptor(t, rows, cols):
    """A Gluon TMA descriptor of the 2-D row-major ``t`` in (rows, cols) blocks."""
    layout = gl.NVMMASharedLayout.get_default_for([rows, cols], _GL_DTYPE[t.dtype])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, cols], layout)


def _launch_ws(kernel, granularity, a, b, sa, sb, c, config):
    """``c = (a * sa) @ (b * sb)`` with block scales; A and B's transpose read by TMA (copied
    into padded buffers where it cannot address them in place). ``config``: a
    :data:`WsConfig`, or a ``TileConfig`` (the options at their defaults)."""
    cfg = WsConfig(*(config or WS_CONFIG))
    if ((cfg.BM, cfg.num_warps) != (128, 4) or cfg.BK != SCALE_BLOCK
            or cfg.BN not in (16, 32, 64, 128) or cfg.num_stages < 1):
        raise ValueError(f"{cfg}: two warpgroups of 64 rows (BM=128, 4 warps each), one scale "
                         f"block a K-step (BK={SCALE_BLOCK}), BN one of 16, 32, 64 or 128 (a "
                         "wgmma's N that divides the scale block), at least one slot")
    M, K = a.shape
    N = b.shape[1]
    check_offsets(c)                       # the output's 32-bit offsets (its pointer store)
    a, bt = tma_view(a), tma_view(b.t())
    tiles = cdiv(M, cfg.BM) * cdiv(N, cfg.BN)
    # persistent: one program a multiprocessor (one fits: the ring takes most of its shared
    # memory, the 12 warps' registers all of its register file), each walking tiles
    grid = (min(tiles, persistent_programs(c.device)) if cfg.persistent else tiles,)
    kernel[grid](_descriptor(a, cfg.BM, cfg.BK), _descriptor(bt, cfg.BN, cfg.BK), c, sa, sb,
                 M, N, K, sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1),
                 c.stride(0), c.stride(1),
                 BLOCK_SIZE_M=cfg.BM, BLOCK_SIZE_N=cfg.BN, BLOCK_SIZE_K=cfg.BK,
                 GROUP_SIZE_M=GROUP_SIZE_M, NUM_STAGES=cfg.num_stages,
                 SCALE_BLOCK=SCALE_BLOCK, SCALE_RING=bool(cfg.scale_ring), num_warps=4)


launch_ws = scaled(block_ws_kernel, "block", _launch_ws)


def asm_job(config=WS_CONFIG, dtype=torch.float8_e4m3fn, size=4096, out_dtype=torch.bfloat16,
            cc=(9, 0)):
    """The compilation of ``config`` (a :data:`WsConfig` or a ``TileConfig``) for ``cc`` on
    contiguous ``size``-cubed operands (for :func:`gemm_lessons.triton_asm.compile_kernels`);
    the grid, persistent or not, is the launch's, the same code either way."""
    config = WsConfig(*config)
    from ..common import dtype_name
    name = dtype_name(dtype)
    kb = cdiv(size, SCALE_BLOCK)
    args = {"a_desc": {"desc": name, "block": [config.BM, config.BK]},
            "bt_desc": {"desc": name, "block": [config.BN, config.BK]},
            "c_ptr": dtype_name(out_dtype), "scale_a_ptr": "float32", "scale_b_ptr": "float32",
            "M": size, "N": size, "K": size, "stride_sam": kb, "stride_sak": 1,
            "stride_sbk": kb, "stride_sbn": 1, "stride_cm": size, "stride_cn": 1}
    constants = {"BLOCK_SIZE_M": config.BM, "BLOCK_SIZE_N": config.BN,
                 "BLOCK_SIZE_K": config.BK, "GROUP_SIZE_M": GROUP_SIZE_M,
                 "NUM_STAGES": config.num_stages, "SCALE_BLOCK": SCALE_BLOCK,
                 "SCALE_RING": bool(config.scale_ring)}
    return dict(fn=block_ws_kernel, args=args, constants=constants, num_warps=4,
                num_stages=config.num_stages, cc=cc)


KERNELS = [
    Kernel("k11_fp8_blockwise_ws", 11, "triton", FP8,
           "k11_fp8_blockwise with a producer warp and two consumer warpgroups out of step, "
           "one promoting while the other's wgmma runs (Hopper, Gluon)",
           launch=plain(launch_ws, "block"), scaled=launch_ws, scales="block",
           source=block_ws_kernel, min_cc=(9, 0), cc_below=(10, 0), simulator=False,
           in_ladder=False, step=7),
]
