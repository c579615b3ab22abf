"""Hopper's tensor memory accelerator (TMA) from numba: a 2-D tile copy from global to shared
memory that one thread issues and an mbarrier counts in bytes.

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

Emulation: at issue the destination box is poisoned (every byte 0xFF: NaN in fp16 and
bf16), the box is read from the operand and queued; it lands, and its bytes complete on
the mbarrier, at the latest moment the hardware allows: when every thread of the block
waits. With ``ptx.cp_async_landing("random", seed)`` each queued copy instead lands at a
random mbarrier operation after its issue. A consumer that reads a stage before waiting for
its phase reads NaN, or the tile of an older phase.
"""
from __future__ import annotations

import random
import threading

import numpy as np

from . import _ptx_plumbing as pl
from . import ptx_mbarrier as mb
from ._ptx_plumbing import PTXUsageError, set_doc
from .ptx_hopper import swizzled_offset

__all__ = ["SIMULATED", "MIN_CC", "INSTRUCTIONS", "BOX_COLS", "SWIZZLE_BYTES", "TensorMap",
           "tensor_map_2d", "tma_addressable", "tma_load_2d"]

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
}


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

set_doc(tma_load_2d, """tma_load_2d(dst, di, tmap, col, row, bars, bi): one thread starts
    copying the box of ``tmap`` (a :func:`tensor_map_2d` map's ``array``) whose first element
    is (``row``, ``col``) of the operand into shared ``dst[di]`` onwards (128-byte aligned;
    1024-byte aligned for the swizzle pattern wgmma reads), zero-filled outside the operand,
    in the map's 128-byte-swizzled layout; when the bytes have landed they complete on the
    mbarrier ``bars[bi]`` (box rows x 128 bytes, announced before with
    ``mbarrier_arrive_expect_tx``).

    PTX: ``cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
    [dst], [tmap, {col, row}], [bar]`` (SASS ``UTMALDG.2D``); compute capability 9.0.""")
