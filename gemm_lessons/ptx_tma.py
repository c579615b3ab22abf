"""Hopper's tensor memory accelerator (TMA) from numba: a 2-D tile copy from global to shared
memory that one thread issues and an mbarrier counts in bytes, and the reverse, a tile stored
from shared to global memory.

``cp.async`` (lessons 05-06) needs every thread of the block to compute an address and
issue 16 bytes; a 128 x 64 fp16 tile takes 1024 such copies. A **TMA copy** moves the whole
tile with *one* instruction issued by *one* thread: the copy engine reads a *tensor map*
built on the host (the operand's base address, sizes, row stride, the box it copies and
the shared-memory swizzle) and the tile's coordinates, and writes the box to shared memory
in the layout the map names. This module uses the **128-byte swizzle**, so the box lands
exactly as ``ptx_hopper.wgmma_mma`` reads it (``ptx_hopper.swizzled_offset``): a box 64
elements (128 bytes) wide and up to 256 rows tall. Parts of the box outside the operand
(past its last row or column, or before the first) are filled with zeros: no masks, no
ragged-edge code. When the copy is done, its bytes are *completed* on an mbarrier
(:mod:`gemm_lessons.ptx_mbarrier`): the producer announces them first with
``mbarrier_arrive_expect_tx``; consumers wait for the phase.

Host side: :func:`tensor_map_2d` describes a 2-D fp16/bf16 torch tensor (unit stride along
its rows, row stride a multiple of 16 bytes, base 16-byte aligned: :func:`tma_addressable`
says whether an operand qualifies). On a GPU the driver encodes the map
(``cuTensorMapEncodeTiled`` through ``cuda.bindings.driver``, the bindings numba-cuda uses)
and the 128 bytes are stored in a 64-byte-aligned device array that the kernel takes as an
argument (PTX allows a tensor map in global memory). In the simulator the same array holds
the fields the emulation reads.

The **store** goes the other way (:func:`tma_store_2d`): one thread hands a box of shared
memory, in the map's layout, to the copy engine, which writes it to the operand at
(``row``, ``col``), leaving out the parts of the box outside the operand (no masks for
ragged edges). Nothing counts its bytes on an mbarrier; instead the issuing thread closes
its stores into a *bulk group* (:func:`bulk_commit_group`) and later waits for its groups:
:func:`bulk_wait_group_read` until the engine has *read* the shared memory (so it may be
written again), :func:`bulk_wait_group` until the writes to global memory are done. The
threads' writes to the box must be made visible to the engine first:
``fence_proxy_async()`` (``fence.proxy.async.shared::cta``: the engine reads through the
*async proxy*, not through the threads' view of shared memory), then a barrier, then one
thread issues.

Emulation of the load: at issue the destination box is poisoned (every byte 0xFF: NaN in fp16 and
bf16), the box is read from the operand and queued; it lands, and its bytes complete on
the mbarrier, at the latest moment the hardware allows: when every thread of the block
waits. With ``ptx.cp_async_landing("random", seed)`` each queued copy instead lands at a
random mbarrier operation after its issue. A consumer that reads a stage before waiting for
its phase reads NaN, or the tile of an older phase.

Emulation of the store: at issue the box's shared bytes are noted; the copy engine reads
them, and writes the operand, at the wait that covers its group (the latest moment PTX
allows). If they changed between issue and that wait, the kernel wrote shared memory the
engine was allowed to be reading, a race on the GPU: the wait raises
:class:`BulkStoreRace` naming the store. A block that ends with stores never waited for
raises it too (the block's shared memory may be handed to the next block while the engine
reads it). The simulator cannot see a missing ``fence_proxy_async`` (it has one view of
shared memory).
"""
from __future__ import annotations

import random
import threading

import numpy as np

from . import _ptx_plumbing as pl
from . import ptx_mbarrier as mb
from ._ptx_plumbing import PTXUsageError, set_doc
from .ptx_hopper import fence_proxy_async, swizzled_offset

__all__ = ["SIMULATED", "MIN_CC", "INSTRUCTIONS", "BOX_COLS", "SWIZZLE_BYTES", "TensorMap",
           "tensor_map_2d", "tma_addressable", "tma_load_2d", "tma_store_2d",
           "bulk_commit_group", "bulk_wait_group_read", "bulk_wait_group", "fence_proxy_async",
           "BulkStoreRace"]

SIMULATED = pl.SIMULATED
MIN_CC = {"tma": (9, 0)}
#: Elements across a box: 128 bytes of fp16/bf16, the width of the 128-byte swizzle.
BOX_COLS = 64
SWIZZLE_BYTES = 128
_MAGIC = 0x544D4131           # 'TMA1': the emulated map's first word
_WORDS = 16                   # a tensor map is 128 bytes

INSTRUCTIONS = {
    "tma_load_2d": ("cp.async.bulk.tensor.2d.shared::cluster.global.tile"
                    ".mbarrier::complete_tx::bytes [dst], [map, {col, row}], [bar]", (9, 0),
                    "UTMALDG.2D"),
    "tma_store_2d": ("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [map, {col, row}], "
                     "[src]", (9, 0), "UTMASTG.2D"),
    "bulk_commit_group": ("cp.async.bulk.commit_group", (9, 0), "UTMACMDFLUSH"),
    "bulk_wait_group_read": ("cp.async.bulk.wait_group.read N", (9, 0), "DEPBAR.LE SB0, N"),
    "bulk_wait_group": ("cp.async.bulk.wait_group N", (9, 0), "DEPBAR.LE SB0, N"),
    "fence_proxy_async": ("fence.proxy.async.shared::cta", (9, 0), "FENCE.VIEW.ASYNC.S"),
}


class BulkStoreRace(RuntimeError):
    """Shared memory that a TMA store was reading was written before the wait that lets it
    be, or a block ended with stores never waited for (simulator only)."""


# ================================================================================ host side
def tma_addressable(t):
    """(True, '') if TMA can address the 2-D fp16/bf16 tensor ``t`` as it is (no copy),
    else (False, why): unit stride along a row, row stride a multiple of 16 bytes, base
    address 16-byte aligned."""
    import torch
    if t.dim() != 2 or t.dtype not in (torch.float16, torch.bfloat16):
        return False, "a TMA map here describes a 2-D fp16 or bf16 tensor"
    size = t.element_size()
    if t.stride(1) != 1 and t.shape[1] > 1:
        return False, f"its rows are not contiguous (column stride {t.stride(1)})"
    row = t.stride(0) * size
    if t.shape[0] > 1 and (row % 16 or row <= 0):
        return False, f"its row stride ({row} bytes) is not a positive multiple of 16 bytes"
    if t.data_ptr() % 16:
        return False, "its first element is not 16-byte aligned"
    return True, ""


class TensorMap:
    """A tensor map for one 2-D operand: ``array`` is the kernel argument (16 int64 words in
    device memory); the operand stays referenced while the map lives."""

    def __init__(self, array, tensor, box_rows, box_cols):
        self.array, self.tensor = array, tensor
        self.box_rows, self.box_cols = box_rows, box_cols
        self.box_bytes = box_rows * box_cols * tensor.element_size()

    def __repr__(self):
        r, c = self.tensor.shape
        return (f"TensorMap({r} x {c} {str(self.tensor.dtype).replace('torch.', '')}, box "
                f"{self.box_rows} x {self.box_cols}, 128-byte swizzle)")


def tensor_map_2d(t, box_rows, box_cols=BOX_COLS):
    """A TMA map of the 2-D fp16/bf16 tensor ``t`` (rows, cols) that copies ``box_rows`` x
    ``box_cols`` boxes (``box_cols * 2 == 128`` bytes: the 128-byte swizzle; ``box_rows``
    1..256) into shared memory with the 128-byte swizzle, zero-filling out of bounds.
    A ValueError where TMA cannot address ``t`` (:func:`tma_addressable`)."""
    import torch

    from . import engines
    ok, why = tma_addressable(t)
    if not ok:
        raise ValueError(f"TMA cannot address this operand: {why}")
    if box_cols * t.element_size() != SWIZZLE_BYTES:
        raise ValueError(f"box_cols must span the 128-byte swizzle: {SWIZZLE_BYTES // 2} "
                         f"elements of {t.dtype}, got {box_cols}")
    if not 1 <= box_rows <= 256:
        raise ValueError(f"box_rows must be from 1 to 256, got {box_rows}")
    rows, cols = t.shape
    row_bytes = max(t.stride(0), 1) * t.element_size()
    if rows == 1:     # one row: its stride is never used, but the driver wants a multiple
        row_bytes = -(-max(row_bytes, cols * t.element_size()) // 16) * 16   # of 16 bytes
    if SIMULATED or not engines.on_gpu():
        words = [_MAGIC, t.data_ptr(), t.element_size(), cols, rows, row_bytes, box_cols,
                 box_rows, SWIZZLE_BYTES] + [0] * (_WORDS - 9)
        arr = torch.tensor(words, dtype=torch.int64, device=t.device)
    else:
        arr = torch.tensor(_encode(t, rows, cols, row_bytes, box_rows, box_cols),
                           dtype=torch.int64, device=t.device)
        if arr.data_ptr() % 64:
            raise RuntimeError("the tensor map's device array is not 64-byte aligned")
    return TensorMap(arr, t, box_rows, box_cols)


def _encode(t, rows, cols, row_bytes, box_rows, box_cols):
    """The driver's 128-byte encoding (cuTensorMapEncodeTiled), as 16 signed int64 words."""
    import torch
    from cuda.bindings import driver as d
    u32, u64 = d.cuuint32_t, d.cuuint64_t
    dtype = (d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16 if t.dtype == torch.float16
             else d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16)
    err, tmap = d.cuTensorMapEncodeTiled(
        dtype, u32(2), t.data_ptr(), [u64(cols), u64(rows)], [u64(row_bytes)],
        [u32(box_cols), u32(box_rows)], [u32(1), u32(1)],
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed: {err}")
    words = [int(w) for w in tmap.opaque]
    return [w - (1 << 64) if w >= 1 << 63 else w for w in words]


# =============================================================================== the GPU
if not SIMULATED:
    from numba.cuda import types

    from ._ptx_plumbing import I32, I64, intrinsic

    @intrinsic
    def tma_load_2d(typingctx, dst, di, tmap, col, row, bars, bi):
        fn = "tma_load_2d"
        pl.check_index(fn, dst, di, "the shared destination")
        pl.half_kind(fn, dst.dtype, "the shared destination")
        if not (isinstance(tmap, types.Array) and tmap.ndim == 1
                and tmap.dtype in (types.int64, types.uint64)):
            raise PTXUsageError(f"{fn}: tmap must be a tensor map's array (16 int64 words, "
                                f"TensorMap.array), got {tmap}")
        pl.check_index(fn, bars, bi, "the barrier array")
        if not (pl.is_int(col) and pl.is_int(row)):
            raise PTXUsageError(f"{fn}: col and row must be integers, got {col}, {row}")

        def codegen(context, builder, sig, args):
            dty, dity, mty, cty, rty, bty, bity = sig.args
            d, dix, m, c, r, b, bix = args
            ary = context.make_array(mty)(context, builder, value=m)
            pl.asm_call(
                builder, "cp.async.bulk.tensor.2d.shared::cluster.global.tile"
                ".mbarrier::complete_tx::bytes [$0], [$1, {$2, $3}], [$4];",
                "r,l,r,r,r,~{memory}",
                [pl.smem_u32(builder, pl.elem_ptr(context, builder, dty, d, dity, dix)),
                 builder.ptrtoint(ary.data, I64), pl.as_i32(builder, c, cty),
                 pl.as_i32(builder, r, rty),
                 pl.smem_u32(builder, pl.elem_ptr(context, builder, bty, b, bity, bix))],
                [I32, I64, I32, I32, I32])
        return types.void(dst, di, tmap, col, row, bars, bi), codegen

    def _check_map(fn, tmap):
        if not (isinstance(tmap, types.Array) and tmap.ndim == 1
                and tmap.dtype in (types.int64, types.uint64)):
            raise PTXUsageError(f"{fn}: tmap must be a tensor map's array (16 int64 words, "
                                f"TensorMap.array), got {tmap}")

    @intrinsic
    def tma_store_2d(typingctx, tmap, col, row, src, si):
        fn = "tma_store_2d"
        _check_map(fn, tmap)
        pl.check_index(fn, src, si, "the shared source")
        pl.half_kind(fn, src.dtype, "the shared source")
        if not (pl.is_int(col) and pl.is_int(row)):
            raise PTXUsageError(f"{fn}: col and row must be integers, got {col}, {row}")

        def codegen(context, builder, sig, args):
            mty, cty, rty, sty, sity = sig.args
            m, c, r, src_, six = args
            ary = context.make_array(mty)(context, builder, value=m)
            pl.asm_call(
                builder, "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group "
                "[$0, {$1, $2}], [$3];", "l,r,r,r,~{memory}",
                [builder.ptrtoint(ary.data, I64), pl.as_i32(builder, c, cty),
                 pl.as_i32(builder, r, rty),
                 pl.smem_u32(builder, pl.elem_ptr(context, builder, sty, src_, sity, six))],
                [I64, I32, I32, I32])
        return types.void(tmap, col, row, src, si), codegen

    bulk_commit_group = pl.barrier_op("bulk_commit_group", "cp.async.bulk.commit_group;")

    def _bulk_wait(kind):
        fn = "bulk_wait_group" + ("_read" if kind else "")

        @pl.intrinsic_literal
        def op(typingctx, n):
            N = pl.literal_int(fn, "N", n)
            if not 0 <= N <= 63:
                raise PTXUsageError(f"{fn}: N must be from 0 to 63, got {N}")

            def codegen(context, builder, sig, args):
                pl.asm_call(builder, f"cp.async.bulk.wait_group{kind} {N};", "~{memory}")
            return types.void(n), codegen
        op.__name__ = fn
        return op

    bulk_wait_group_read = _bulk_wait(".read")
    bulk_wait_group = _bulk_wait("")


# ========================================================================= the simulator
else:
    from . import ptx, sim_scheduler

    _queue_lock = threading.Lock()
    _inflight = []                 # [(dst bytes view, positions, data, bars, bi, nbytes, origin)]
    _rng = [None, None]            # (mode, random.Random) of the random landing mode

    def _decode(tmap, fn):
        w = pl.as_numpy(tmap, fn, "tmap")
        if w.dtype.itemsize != 8 or w.size < _WORDS or int(w[0]) != _MAGIC:
            raise PTXUsageError(f"{fn}: tmap is not a tensor map (pass TensorMap.array from "
                                f"tensor_map_2d)")
        return [int(v) for v in w[1:9]]

    def _land(copy):
        view, pos, data, bars, bi, nbytes, origin = copy
        view[pos] = data
        mb.complete_tx(bars, bi, nbytes, origin)

    def _land_inflight(final):
        """Land every copy in flight (``final``), or in the random mode each with even
        chance; True if any landed."""
        mode = ptx.cp_async_landing_mode()
        if not final and mode[0] != "random":
            return False
        with _queue_lock:
            if not _inflight:
                return False
            if final:
                now, keep = list(_inflight), []
            else:
                if _rng[0] != mode:
                    _rng[:] = [mode, random.Random(f"tma:{mode[1]}")]
                now, keep = [], []
                for c in _inflight:
                    (now if _rng[1].random() < 0.5 else keep).append(c)
            _inflight[:] = keep
        for c in now:
            _land(c)
        return bool(now)

    def _block_started():
        with _queue_lock:
            _inflight.clear()        # a block that failed may have left copies behind
            _rng[:] = [None, None]

    mb.add_stall_hook(_land_inflight)
    sim_scheduler.add_hooks(_block_started, lambda live: None)

    def tma_load_2d(dst, di, tmap, col, row, bars, bi):
        fn = "tma_load_2d"
        addr, size, cols, rows, row_bytes, box_cols, box_rows, swz = _decode(tmap, fn)
        d = pl.as_numpy(dst, fn, "the shared destination")
        if pl.is_global(dst) or d.ndim != 1:
            raise PTXUsageError(f"{fn}: the destination must be a 1-D shared array")
        if d.dtype.itemsize != size:
            raise PTXUsageError(f"{fn}: the destination holds {d.dtype}, the map "
                                f"{size}-byte elements")
        if not (pl.is_int(col) and pl.is_int(row)):
            raise PTXUsageError(f"{fn}: col and row must be integers, got {col!r}, {row!r}")
        col, row = int(col), int(row)
        if not (-2**31 <= col < 2**31 and -2**31 <= row < 2**31):
            raise PTXUsageError(f"{fn}: coordinates are 32-bit integers, got {col}, {row}")
        if (col * size) % 16:
            raise PTXUsageError(f"{fn}: the box's first column must start on a 16-byte "
                                f"boundary of the row (col x {size} bytes a multiple of 16), "
                                f"got col = {col}; an H200 stops such a kernel with an "
                                f"illegal-instruction error")
        off = pl.byte_offset(d, di, fn, "the shared destination")
        pl.check_aligned(fn, "the shared destination", "byte offset in the array", 128, off)
        nbytes = box_rows * box_cols * size
        if off + nbytes > d.nbytes:
            raise IndexError(f"{fn}: the {box_rows} x {box_cols} box at byte {off} runs past "
                             f"the end of the shared array ({d.nbytes} bytes)")
        # the box, zero outside the operand, read from global memory at issue
        box = np.zeros((box_rows, box_cols * size), np.uint8)
        r0, r1 = max(row, 0), min(row + box_rows, rows)
        c0, c1 = max(col, 0), min(col + box_cols, cols)
        if r0 < r1 and c0 < c1:
            span = (r1 - 1) * row_bytes + c1 * size
            g = pl.raw_view(addr, span, np.uint8, (span,), (1,), writeable=False)
            for r in range(r0, r1):
                box[r - row, (c0 - col) * size:(c1 - col) * size] = \
                    g[r * row_bytes + c0 * size:r * row_bytes + c1 * size]
        pos = off + np.arange(nbytes)
        if swz == SWIZZLE_BYTES:
            pos = swizzled_offset(pos)
        view = d.view(np.uint8)
        origin = mb.note_copy(bars, bi, nbytes)              # (an initialized barrier)
        view[pos] = 0xFF                                     # poison until it lands
        copy = (view, pos, box.reshape(-1), bars, bi, nbytes, origin)
        with _queue_lock:
            _inflight.append(copy)
        _land_inflight(False)

    # ------------------------------------------------------------------ the store
    _bulk = {}         # issuing thread -> {"open": [stores], "groups": [[stores], ...]}

    def _bulk_state():
        th = threading.current_thread()
        with _queue_lock:
            return _bulk.setdefault(th, {"open": [], "groups": [],
                                         "thread": int(getattr(th, "thread_id", -1))})

    def _describe(st):
        return (f"the TMA store of the {st['box_rows']} x {st['box_cols']} box at (row "
                f"{st['row']}, col {st['col']}) issued by thread {st['thread']} from shared "
                f"byte {st['off']}")

    def _store_now(st):
        """The copy engine reads the box from shared memory and writes the operand's part of
        it; a BulkStoreRace if the box changed since the store was issued."""
        now = st["view"][st["pos"]]
        if not np.array_equal(now, st["data"]):
            changed = int(np.count_nonzero(now != st["data"]))
            raise BulkStoreRace(
                f"{_describe(st)}: {changed} of its {now.size} shared bytes were written "
                f"after the store was issued and before cp.async.bulk.wait_group.read let "
                f"them be (bulk_wait_group_read before the scratch is written again, and a "
                f"barrier after every thread's writes, before the store is issued)")
        box = now.reshape(st["box_rows"], -1)
        size, row, col = st["size"], st["row"], st["col"]
        r0, r1 = max(row, 0), min(row + st["box_rows"], st["rows"])
        c0, c1 = max(col, 0), min(col + st["box_cols"], st["cols"])
        if r0 < r1 and c0 < c1:                 # the part inside the operand; none else
            rb = st["row_bytes"]
            span = (r1 - 1) * rb + c1 * size
            g = pl.raw_view(st["addr"], span, np.uint8, (span,), (1,))
            for r in range(r0, r1):
                g[r * rb + c0 * size:r * rb + c1 * size] = \
                    box[r - row, (c0 - col) * size:(c1 - col) * size]

    def tma_store_2d(tmap, col, row, src, si):
        fn = "tma_store_2d"
        addr, size, cols, rows, row_bytes, box_cols, box_rows, swz = _decode(tmap, fn)
        d = pl.as_numpy(src, fn, "the shared source")
        if pl.is_global(src) or d.ndim != 1:
            raise PTXUsageError(f"{fn}: the source must be a 1-D shared array")
        if d.dtype.itemsize != size:
            raise PTXUsageError(f"{fn}: the source holds {d.dtype}, the map "
                                f"{size}-byte elements")
        if not (pl.is_int(col) and pl.is_int(row)):
            raise PTXUsageError(f"{fn}: col and row must be integers, got {col!r}, {row!r}")
        col, row = int(col), int(row)
        if col < 0 or row < 0:      # a load may start outside (zero fill); a store may not
            raise PTXUsageError(f"{fn}: a store's box must start inside the tensor, got row "
                                f"{row}, col {col} (an H200 stops with an illegal instruction)")
        if (col * size) % 16:
            raise PTXUsageError(f"{fn}: the box's first column must start on a 16-byte "
                                f"boundary of the row (col x {size} bytes a multiple of 16), "
                                f"got col = {col}")
        off = pl.byte_offset(d, si, fn, "the shared source")
        pl.check_aligned(fn, "the shared source", "byte offset in the array", 128, off)
        nbytes = box_rows * box_cols * size
        if off + nbytes > d.nbytes:
            raise IndexError(f"{fn}: the {box_rows} x {box_cols} box at byte {off} runs past "
                             f"the end of the shared array ({d.nbytes} bytes)")
        pos = off + np.arange(nbytes)
        if swz == SWIZZLE_BYTES:
            pos = swizzled_offset(pos)
        view = d.view(np.uint8)
        state = _bulk_state()
        state["open"].append(dict(view=view, pos=pos, data=view[pos].copy(), addr=addr,
                                  size=size, rows=rows, cols=cols, row_bytes=row_bytes,
                                  row=row, col=col, box_rows=box_rows, box_cols=box_cols,
                                  off=off, thread=state["thread"]))

    def bulk_commit_group():
        state = _bulk_state()
        state["groups"].append(state["open"])
        state["open"] = []

    def _wait(fn, n):
        if not pl.is_int(n):
            raise PTXUsageError(pl.msg_literal(fn, "N", repr(n)))
        if not 0 <= n <= 63:
            raise PTXUsageError(f"{fn}: N must be from 0 to 63, got {n}")
        state = _bulk_state()
        done = state["groups"][:len(state["groups"]) - n] if n else state["groups"]
        state["groups"] = state["groups"][len(done):]
        for group in done:
            for st in group:
                _store_now(st)

    def bulk_wait_group_read(n):
        _wait("bulk_wait_group_read", n)

    def bulk_wait_group(n):
        _wait("bulk_wait_group", n)

    def _bulk_block_started():
        with _queue_lock:
            _bulk.clear()

    def _bulk_block_finished():
        with _queue_lock:
            left = [(st, committed) for state in _bulk.values()
                    for committed, stores in ((True, [s for g in state["groups"] for s in g]),
                                              (False, state["open"]))
                    for st in stores]
            _bulk.clear()
        if left:
            st, committed = left[0]
            how = ("never waited for (bulk_wait_group_read(0) before the block exits)"
                   if committed else "never committed (bulk_commit_group) nor waited for")
            raise BulkStoreRace(f"the block ended with {len(left)} TMA store(s) {how}: "
                                f"{_describe(st)}; its shared memory may go to the next "
                                f"block while the copy engine reads it")

    sim_scheduler.add_hooks(_bulk_block_started, lambda live: None, _bulk_block_finished)

set_doc(tma_load_2d, """tma_load_2d(dst, di, tmap, col, row, bars, bi): one thread starts
    copying the box of ``tmap`` (a :func:`tensor_map_2d` map's ``array``) whose first element
    is (``row``, ``col``) of the operand into shared ``dst[di]`` onwards (128-byte aligned;
    1024-byte aligned for the swizzle pattern wgmma reads), zero-filled outside the operand,
    in the map's 128-byte-swizzled layout; when the bytes have landed they complete on the
    mbarrier ``bars[bi]`` (box rows x 128 bytes, announced before with
    ``mbarrier_arrive_expect_tx``).

    PTX: ``cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
    [dst], [tmap, {col, row}], [bar]`` (SASS ``UTMALDG.2D``); compute capability 9.0.""")

set_doc(tma_store_2d, """tma_store_2d(tmap, col, row, src, si): one thread starts copying the
    box of ``tmap`` (a :func:`tensor_map_2d` map's ``array``) from shared ``src[si]`` onwards
    (128-byte aligned; 1024-byte aligned for the 128-byte swizzle, in whose layout the box
    lies there, as a load would have left it) to the operand at (``row``, ``col``). The parts
    of the box outside the operand are not written. Before it: every thread's writes to the
    box made visible to the copy engine (``fence_proxy_async()``, then a barrier). After it:
    :func:`bulk_commit_group`, then :func:`bulk_wait_group_read` before ``src`` is written
    again.

    PTX: ``cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [tmap, {col, row}], [src]``
    (SASS ``UTMASTG.2D``); compute capability 9.0.""")
set_doc(bulk_commit_group, """bulk_commit_group(): close this thread's TMA stores issued
    since its last commit into one *bulk group*. PTX ``cp.async.bulk.commit_group``;
    compute capability 9.0.""")
set_doc(bulk_wait_group_read, """bulk_wait_group_read(N): wait until at most the ``N``
    newest bulk groups of this thread still read their shared memory (``N`` a constant,
    0 to 63): the shared memory of the older ones may be written again. Their writes to
    global memory may still be under way. PTX ``cp.async.bulk.wait_group.read N``; compute
    capability 9.0.""")
set_doc(bulk_wait_group, """bulk_wait_group(N): wait until at most the ``N`` newest bulk
    groups of this thread are incomplete (``N`` a constant, 0 to 63): the older ones have
    read their shared memory and written global memory. PTX ``cp.async.bulk.wait_group N``;
    compute capability 9.0.""")
