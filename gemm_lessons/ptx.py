"""Tensor cores and asynchronous copies from numba: inline-PTX intrinsics, and their emulation.

numba has no API for tensor cores (WMMA) or ``cp.async``. This module adds them. On a GPU
(and when compiling PTX) each function below is a numba *intrinsic*: a call in a kernel
becomes the one PTX instruction its docstring names, written with ``llvmlite.ir.InlineAsm``.
In numba's CUDA simulator the same names are plain Python with the same meaning, so a
lesson runs unchanged on a laptop.

The module reads one instruction at a time: each section below holds an instruction's
documentation, its GPU code generation and its emulation, side by side.

* **WMMA** (``wmma.load`` / ``wmma.mma`` / ``wmma.store``, m16n16k16, compute capability
  7.0+, bf16 8.0+). A *fragment* is the part of a 16x16 tile one lane of the warp holds in
  registers; which elements a lane holds is not specified (it differs between GPUs).
  Declare fragments with the sizes :data:`FRAG_AB` and :data:`FRAG_C` (per lane), in the
  dtype of the data: ``float16`` for fp16, ``int16`` for bf16 (numba has no bf16 type: bf16
  travels as its raw 16 bits, see ``engines.as_numba``), ``float32`` for the accumulator.
  In the simulator fragments are opaque too, but bigger: each lane keeps the whole tile (so
  ``FRAG_AB = FRAG_C = 256`` there), loads copy it in memory order, and ``wmma_mma`` is a
  numpy product in float32.
* **cp.async** (compute capability 8.0+): a copy from global to shared memory that the
  thread issues and does not wait for. ``cp_async_commit_group()`` closes the copies issued
  since the last commit into a *group*; ``cp_async_wait_group(N)`` waits until at most the
  N newest groups are still in flight. The simulator queues each thread's copies. By
  default it lands them at the latest moment PTX allows (at the wait that covers them): a
  kernel that forgets to wait reads stale shared memory on a laptop, as it may on a GPU.
  :func:`cp_async_landing` ``("random", seed)`` lands each copy at a random moment between
  its issue and that wait instead: a kernel that overwrites a buffer still in flight, or
  still being read, then computes a wrong answer on a laptop too.

Indices: every ``arr, idx`` pair names one element, ``idx`` an integer for a 1-D array or a
tuple with one integer per dimension; the instruction starts at that element's address.
Shared arrays that ``cp.async`` or WMMA touch must be aligned: declare them with
``cuda.shared.array(shape, dtype, alignment=WMMA_SMEM_ALIGN)`` (the simulator takes no
alignment, so the constant is None there).

Every layout and count argument is a compile-time constant (a literal, or a constant the
kernel factory closes over): PTX has no run-time form of them.
"""
from __future__ import annotations

import contextlib
import os
import random
import threading

import numpy as np

from . import _ptx_plumbing as pl
from ._ptx_plumbing import PTXUsageError, msg_literal, set_doc

__all__ = ["SIMULATED", "FRAG_AB", "FRAG_C", "WMMA_SMEM_ALIGN", "SMEM_ALIGN", "PTXUsageError",
           "wmma_load_a", "wmma_load_b", "wmma_mma", "wmma_store_d",
           "cp_async16", "cp_async16_zfill", "cp_async_ca", "cp_async_commit_group",
           "cp_async_wait_group", "cp_async_landing", "cp_async_landing_mode",
           "CP_ASYNC_LANDING_ENV",
           "bf16_to_f32", "f32_to_bf16", "f16_to_f32", "f32_to_f16",
           "MIN_CC", "INSTRUCTIONS"]

#: True where the functions are Python emulations (numba's simulator).
SIMULATED = pl.SIMULATED

#: Elements per lane of an A or B fragment (fp16: 8 registers of two halves; bf16 uses 8
#: of the 16), and of the float32 accumulator (8 registers). The simulator keeps the tile.
FRAG_AB = 256 if SIMULATED else 16
FRAG_C = 256 if SIMULATED else 8

#: ``alignment=`` for shared arrays that cp.async (16 bytes) and wmma (32 bytes) touch:
#: 128 bytes covers both, and keeps a tile row at the start of a bank row.
WMMA_SMEM_ALIGN = None if SIMULATED else 128
#: The name lessons 05 and 06 import (the same value as :data:`WMMA_SMEM_ALIGN`).
SMEM_ALIGN = WMMA_SMEM_ALIGN

#: Minimum compute capability of each instruction family.
MIN_CC = {"wmma": (7, 0), "wmma_bf16": (8, 0), "cp.async": (8, 0)}

#: Each function: the PTX instruction it becomes, the minimum compute capability, and the
#: SASS it turns into on sm_80 and later (what ptxas emits; see the lessons). Filled in by
#: the sections below.
INSTRUCTIONS: dict[str, tuple] = {}

if not SIMULATED:
    from llvmlite import ir
    from numba.cuda import types

    from ._ptx_plumbing import F32, I32, I64, intrinsic, intrinsic_literal


# ========================================================== wmma.load.{a,b}: tile -> fragment
INSTRUCTIONS["wmma_load_a"] = ("wmma.load.a.sync.aligned.{row|col}.m16n16k16.shared.{f16|bf16}",
                               (7, 0), "LDSM.16.M88.4 (ldmatrix)")
INSTRUCTIONS["wmma_load_b"] = ("wmma.load.b.sync.aligned.{row|col}.m16n16k16.shared.{f16|bf16}",
                               (7, 0), "LDSM.16.MT88.4 (ldmatrix .trans)")
_WMMA_LOAD_DOC = """wmma_load_{x}(frag, arr, idx, ldm, layout): load the 16x16 {X} tile at
    ``arr[idx]`` (shared memory, ``ldm`` elements between rows if ``layout == 'row'``,
    between columns if ``'col'``) into this lane's fragment ``frag``. Warp-wide: all 32 lanes
    call it with the same arguments.

    PTX: ``wmma.load.{x}.sync.aligned.{{row|col}}.m16n16k16.shared.{{f16|bf16}}``; compute
    capability 7.0 (fp16), 8.0 (bf16). The tile must start 32-byte aligned and ``ldm`` be a
    multiple of 8 elements. ``arr`` holds float16, or int16 for bf16 bits; ``frag`` is
    ``cuda.local.array(FRAG_AB, same dtype)``."""

if SIMULATED:
    # Fragments are opaque: a simulated fragment holds the whole 16x16 tile in the order it
    # lay in memory; wmma_mma reads it with the layout it is given, so a layout that does not
    # match the load gives a wrong product here as it does on the GPU.
    def _fragment(f, fn, what, dtypes):
        f = np.asarray(f)
        if f.ndim != 1 or f.size < 256:
            raise PTXUsageError(f"{fn}: {what} must be a 1-D local array of FRAG_AB (or "
                                f"FRAG_C) elements, got shape {f.shape}")
        if f.dtype not in dtypes:
            raise PTXUsageError(f"{fn}: {what} has dtype {f.dtype}; it must be "
                                f"{' or '.join(str(np.dtype(d)) for d in dtypes)}")
        return f

    def _tile(fn, a, idx, ldm, what, writeable=False):
        """The 16x16 tile at a[idx] with leading dimension ldm, as memory holds it:
        tile[r, c] = element (r * ldm + c) after the start."""
        isz = a.dtype.itemsize
        if not pl.is_int(ldm) or ldm < 16 or (ldm * isz) % 16:
            raise PTXUsageError(f"{fn}: ldm must be an integer >= 16 whose rows are a "
                                f"multiple of 16 bytes, got {ldm}")
        ldm = int(ldm)
        off = pl.byte_offset(a, idx, fn, what)
        if off % 32:
            raise PTXUsageError(f"{fn}: the tile must start 32-byte aligned within the "
                                f"array (byte offset {off})")
        start, span = pl.address(a) + off, (15 * ldm + 16) * isz
        pl.check_span(a, start, span, fn, what)
        return pl.raw_view(start, span, a.dtype, (16, 16), (ldm * isz, isz), writeable)

    def _wmma_load(which):
        fn = f"wmma_load_{which}"

        def load(frag, arr, idx, ldm, layout):
            pl.layout(fn, "layout", layout)
            a = pl.as_numpy(arr, fn, "the shared array")
            kind = pl.half_kind(fn, a.dtype, "the shared array")
            if pl.is_global(arr):
                raise PTXUsageError(f"{fn}: loads fragments from shared memory; pass a "
                                    "cuda.shared.array")
            f = _fragment(frag, fn, "the fragment",
                          (np.float16,) if kind == "f16" else (np.int16, np.uint16))
            f[:256] = _tile(fn, a, idx, ldm, "the shared array").reshape(-1)
        load.__name__ = fn
        return load
else:
    def _wmma_load(which):
        name = f"wmma_load_{which}"

        @intrinsic_literal
        def load(typingctx, frag, arr, idx, ldm, layout):
            pl.check_index(name, arr, idx, "the shared array")
            kind = pl.half_kind(name, arr.dtype, "the shared array")
            pl.check_fragment(name, frag, kind, "the fragment")
            if not pl.is_int(ldm):
                raise PTXUsageError(f"{name}: ldm (the row stride in elements) must be an "
                                    f"integer, got {ldm}")
            lay = pl.literal_layout(name, "layout", layout)
            nreg = 8 if kind == "f16" else 4     # bf16 packs the 16 elements in 4 registers

            def codegen(context, builder, sig, args):
                fty, aty, ity, lty, _ = sig.args
                f, a, i, l, _ = args
                p = pl.elem_ptr(context, builder, aty, a, ity, i)
                regs = ",".join(f"${k}" for k in range(nreg))
                res = pl.asm_call(
                    builder, f"wmma.load.{which}.sync.aligned.{lay}.m16n16k16.shared.{kind} "
                    f"{{{regs}}}, [${nreg}], ${nreg + 1};", "=r," * nreg + "r,r,~{memory}",
                    [pl.smem_u32(builder, p), pl.as_i32(builder, l, lty)], [I32, I32],
                    ir.LiteralStructType([I32] * nreg))
                fp = pl.data_ptr(context, builder, fty, f, I32)
                for k in range(nreg):
                    builder.store(builder.extract_value(res, k),
                                  builder.gep(fp, [ir.Constant(I32, k)]))
            return types.void(frag, arr, idx, ldm, layout), codegen
        return load

wmma_load_a = set_doc(_wmma_load("a"), _WMMA_LOAD_DOC.format(x="a", X="A"))
wmma_load_b = set_doc(_wmma_load("b"), _WMMA_LOAD_DOC.format(x="b", X="B"))


# =================================================================== wmma.mma: acc += a @ b
INSTRUCTIONS["wmma_mma"] = ("wmma.mma.sync.aligned.{row|col}.{row|col}.m16n16k16.f32.f32",
                            (7, 0), "2 x HMMA.16816.F32")
_WMMA_MMA_DOC = """wmma_mma(acc, a, b, a_layout, b_layout): ``acc += a @ b`` on a 16x16x16
    tile, in float32, warp-wide. The layouts must be those ``a`` and ``b`` were loaded with.

    PTX: ``wmma.mma.sync.aligned.{al}.{bl}.m16n16k16.f32.f32`` (fp16 inputs, compute
    capability 7.0) or ``...m16n16k16.f32.bf16.bf16.f32`` (bf16, 8.0): on sm_80+ each
    becomes two ``HMMA.16816.F32`` in SASS. ``acc`` is ``cuda.local.array(FRAG_C, float32)``
    (or a slice ``acc[i, j]`` of a bigger local array)."""

if SIMULATED:
    def wmma_mma(acc, a, b, a_layout, b_layout):
        fn = "wmma_mma"
        la = pl.layout(fn, "a_layout", a_layout)
        lb = pl.layout(fn, "b_layout", b_layout)
        a, b = np.asarray(a), np.asarray(b)
        ka, kb = pl.half_kind(fn, a.dtype, "fragment a"), pl.half_kind(fn, b.dtype, "fragment b")
        if ka != kb:
            raise PTXUsageError(f"{fn}: fragments a and b differ in dtype ({a.dtype}, "
                                f"{b.dtype})")
        _fragment(a, fn, "fragment a", (a.dtype,))
        _fragment(b, fn, "fragment b", (b.dtype,))
        c = _fragment(acc, fn, "the accumulator", (np.float32,))
        # a fragment holds its tile in memory order; the layout says how to read it
        A = pl.halves_to_f32(a[:256]).reshape(16, 16)
        B = pl.halves_to_f32(b[:256]).reshape(16, 16)
        if la == "col":
            A = A.T
        if lb == "col":
            B = B.T
        C = c[:256].reshape(16, 16)
        with np.errstate(all="ignore"):      # inf/NaN inputs give inf/NaN, as on the GPU
            C += A @ B
else:
    @intrinsic_literal
    def wmma_mma(typingctx, acc, a, b, a_layout, b_layout):
        fn = "wmma_mma"
        for what, f in (("a", a), ("b", b)):
            if not isinstance(f, types.Array):
                raise PTXUsageError(f"{fn}: fragment {what} must be a local array, got {f}")
        kind = pl.half_kind(fn, a.dtype, "fragment a")
        if pl.half_kind(fn, b.dtype, "fragment b") != kind:
            raise PTXUsageError(f"{fn}: fragments a and b differ in dtype ({a.dtype}, "
                                f"{b.dtype})")
        pl.check_fragment(fn, a, kind, "fragment a")
        pl.check_fragment(fn, b, kind, "fragment b")
        pl.check_fragment(fn, acc, "f32", "the accumulator")
        la = pl.literal_layout(fn, "a_layout", a_layout)
        lb = pl.literal_layout(fn, "b_layout", b_layout)
        nreg = 8 if kind == "f16" else 4
        types_part = "f32.f32" if kind == "f16" else "f32.bf16.bf16.f32"

        def codegen(context, builder, sig, args):
            cty, aty, bty = sig.args[:3]
            c, av, bv = args[:3]
            cp = pl.data_ptr(context, builder, cty, c, F32)
            ap = pl.data_ptr(context, builder, aty, av, I32)
            bp = pl.data_ptr(context, builder, bty, bv, I32)

            def at(p, k):
                return builder.gep(p, [ir.Constant(I32, k)])
            ins = ([builder.load(at(ap, k)) for k in range(nreg)] +
                   [builder.load(at(bp, k)) for k in range(nreg)] +
                   [builder.load(at(cp, k)) for k in range(8)])
            d = ",".join(f"${k}" for k in range(8))
            A = ",".join(f"${k}" for k in range(8, 8 + nreg))
            B = ",".join(f"${k}" for k in range(8 + nreg, 8 + 2 * nreg))
            C = ",".join(f"${k}" for k in range(8 + 2 * nreg, 16 + 2 * nreg))
            res = pl.asm_call(
                builder, f"wmma.mma.sync.aligned.{la}.{lb}.m16n16k16.{types_part} "
                f"{{{d}}}, {{{A}}}, {{{B}}}, {{{C}}};",
                "=f," * 8 + "r," * (2 * nreg) + ",".join(["f"] * 8), ins,
                [I32] * (2 * nreg) + [F32] * 8, ir.LiteralStructType([F32] * 8),
                side_effect=False)
            for k in range(8):
                builder.store(builder.extract_value(res, k), at(cp, k))
        return types.void(acc, a, b, a_layout, b_layout), codegen

set_doc(wmma_mma, _WMMA_MMA_DOC)


# ========================================================= wmma.store.d: accumulator -> tile
INSTRUCTIONS["wmma_store_d"] = ("wmma.store.d.sync.aligned.{row|col}.m16n16k16.f32", (7, 0),
                                "STS / STG")
_WMMA_STORE_DOC = """wmma_store_d(arr, idx, ldm, acc, layout): store the float32 16x16
    accumulator tile to ``arr[idx]`` (shared or global float32 memory, 32-byte aligned),
    ``ldm`` elements between rows (``'row'``) or columns (``'col'``). Warp-wide.

    PTX: ``wmma.store.d.sync.aligned.{row|col}.m16n16k16.f32``; compute capability 7.0."""

if SIMULATED:
    def wmma_store_d(arr, idx, ldm, acc, layout):
        fn = "wmma_store_d"
        lay = pl.layout(fn, "layout", layout)
        a = pl.as_numpy(arr, fn, "the destination")
        if a.dtype != np.float32:
            raise PTXUsageError(f"{fn}: the destination must be a float32 array (the "
                                f"accumulator is float32), got {a.dtype}")
        tile = _fragment(acc, fn, "the accumulator", (np.float32,))[:256].reshape(16, 16)
        _tile(fn, a, idx, ldm, "the destination", writeable=True)[...] = \
            tile if lay == "row" else tile.T
else:
    @intrinsic_literal
    def wmma_store_d(typingctx, arr, idx, ldm, acc, layout):
        fn = "wmma_store_d"
        pl.check_index(fn, arr, idx, "the destination")
        if arr.dtype != types.float32:
            raise PTXUsageError(f"{fn}: the destination must be a float32 array (the "
                                f"accumulator is float32), got {arr.dtype}")
        pl.check_fragment(fn, acc, "f32", "the accumulator")
        if not pl.is_int(ldm):
            raise PTXUsageError(f"{fn}: ldm must be an integer, got {ldm}")
        lay = pl.literal_layout(fn, "layout", layout)

        def codegen(context, builder, sig, args):
            aty, ity, lty, cty, _ = sig.args
            a, i, l, c, _ = args
            p = pl.elem_ptr(context, builder, aty, a, ity, i)
            cp = pl.data_ptr(context, builder, cty, c, F32)
            vals = [builder.load(builder.gep(cp, [ir.Constant(I32, k)])) for k in range(8)]
            regs = ",".join(f"${k}" for k in range(1, 9))
            pl.asm_call(builder, f"wmma.store.d.sync.aligned.{lay}.m16n16k16.f32 [$0], "
                        f"{{{regs}}}, $9;", "l," + "f," * 8 + "r,~{memory}",
                        [p] + vals + [pl.as_i32(builder, l, lty)], [pl.I8P] + [F32] * 8 + [I32])
        return types.void(arr, idx, ldm, acc, layout), codegen

set_doc(wmma_store_d, _WMMA_STORE_DOC)


# ============================================ cp.async in the simulator: when a copy lands
#: The environment variable that picks the landing mode at import: ``wait`` (the default)
#: or ``random`` / ``random:SEED``.
CP_ASYNC_LANDING_ENV = "GEMM_LESSONS_CP_ASYNC_LANDING"

#: In the random mode, the chance that a copy still in flight lands at a given landing point.
_LAND_CHANCE = 0.5


def _parse_landing(text):
    mode, _, seed = (text or "wait").strip().partition(":")
    if mode not in ("wait", "random") or (seed and mode != "random"):
        raise ValueError(f"{CP_ASYNC_LANDING_ENV}={text!r}: use 'wait', 'random' or "
                         "'random:SEED' (SEED an integer)")
    try:
        return mode, int(seed) if seed else 0
    except ValueError:
        raise ValueError(f"{CP_ASYNC_LANDING_ENV}={text!r}: the seed must be an integer") \
            from None


_landing = _parse_landing(os.environ.get(CP_ASYNC_LANDING_ENV))


def cp_async_landing_mode():
    """The landing mode in force: ``("wait", 0)`` or ``("random", seed)``."""
    return _landing


@contextlib.contextmanager
def cp_async_landing(mode="random", seed=0):
    """When the simulator lands the copies of ``cp.async`` launched inside the block.

    * ``"wait"`` (the default outside this block): each copy lands at the
      ``cp_async_wait_group`` that covers it, the latest moment PTX allows.
    * ``"random"``: each copy still in flight may land at any later landing point of the
      thread that issued it (its next ``cp_async*``, ``cp_async_commit_group``,
      ``cp_async_wait_group`` or ``cuda.syncthreads``), each with an even chance, drawn from
      a generator seeded by ``seed`` and the thread's block and thread indices (so a run is
      reproducible); ``cp_async_wait_group(N)`` still lands every copy but those of the N
      newest groups. A kernel that overwrites a buffer whose copy is still in flight, or
      that another thread still reads, computes a wrong answer in this mode.

    The environment variable ``GEMM_LESSONS_CP_ASYNC_LANDING=random[:SEED]`` sets the mode for
    a whole process (child processes the package starts on the simulator inherit it). On a
    GPU the hardware decides, and this has no effect."""
    global _landing
    new = _parse_landing(f"{mode}:{int(seed)}" if mode == "random" else mode)
    old, _landing = _landing, new
    if SIMULATED and new[0] == "random":
        _land_at_barriers()
    try:
        yield
    finally:
        _landing = old


if SIMULATED:
    def _state():
        """This thread's copies in flight: ``pending`` (issued since the last commit) and
        ``groups`` (oldest first), and the generator of the random mode."""
        th = threading.current_thread()
        st = getattr(th, "_gl_cp_async", None)
        if st is None or st["mode"] != _landing:
            rng = None
            if _landing[0] == "random":
                block = tuple(getattr(th, "blockIdx", (0, 0, 0)))
                thread = tuple(getattr(th, "threadIdx", (0, 0, 0)))
                rng = random.Random(f"{_landing[1]}:{block}:{thread}")
            old = st or {"pending": [], "groups": []}
            st = th._gl_cp_async = {"pending": old["pending"], "groups": old["groups"],
                                    "mode": _landing, "rng": rng}
        return st

    def _land(copy):
        _d, _s, dst_addr, src_addr, nbytes, src_bytes = copy
        if src_bytes:
            pl.memmove(dst_addr, src_addr, src_bytes)
        if src_bytes < nbytes:
            pl.memset(dst_addr + src_bytes, 0, nbytes - src_bytes)

    def _landing_point(st):
        """In the random mode: each copy still in flight lands here with even chance."""
        rng = st["rng"]
        if rng is None:
            return
        for copies in st["groups"] + [st["pending"]]:
            if copies:
                keep = []
                for copy in copies:
                    if rng.random() < _LAND_CHANCE:
                        _land(copy)
                    else:
                        keep.append(copy)
                copies[:] = keep

    _barrier_patched = False

    def _land_at_barriers():
        """Make ``cuda.syncthreads`` a landing point of the random mode (installed once; a
        flag check per barrier in the default mode)."""
        global _barrier_patched
        if _barrier_patched:
            return
        from numba.cuda.simulator.kernel import BlockThread
        arrive = BlockThread.syncthreads

        def syncthreads(self):
            st = getattr(self, "_gl_cp_async", None)
            if st is not None and _landing[0] == "random":
                _landing_point(_state())
            return arrive(self)
        BlockThread.syncthreads = syncthreads
        _barrier_patched = True

    if _landing[0] == "random":
        _land_at_barriers()

    def _issue(fn, dst, di, src, si, nbytes, src_bytes, align):
        """Check one copy as the GPU would and queue it in this thread's pending copies."""
        d = pl.as_numpy(dst, fn, "the shared destination")
        s = pl.as_numpy(src, fn, "the global source")
        if pl.is_global(dst):
            raise PTXUsageError(f"{fn}: the destination must be shared memory "
                                "(cuda.shared.array), the source global memory")
        if d.dtype.itemsize != s.dtype.itemsize:
            raise PTXUsageError(f"{fn}: source and destination differ in element size "
                                f"({s.dtype}, {d.dtype})")
        if not pl.is_int(src_bytes) or not 0 <= src_bytes <= nbytes:
            raise PTXUsageError(f"{fn}: src_bytes must be an integer from 0 to {nbytes}, "
                                f"got {src_bytes}")
        nbytes, src_bytes = int(nbytes), int(src_bytes)
        doff = pl.byte_offset(d, di, fn, "the shared destination")
        pl.check_aligned(fn, "the shared destination", "byte offset in the array", align, doff)
        dst_addr = pl.address(d) + doff
        pl.check_span(d, dst_addr, nbytes, fn, "the shared destination")
        src_addr = 0
        if src_bytes:
            src_addr = pl.address(s) + pl.byte_offset(s, si, fn, "the global source")
            pl.check_aligned(fn, "the global source", "address", align, src_addr)
            pl.check_span(s, src_addr, src_bytes, fn, "the global source")
        st = _state()
        # the arrays travel with the copy, so they stay alive until it lands
        st["pending"].append((d, s, dst_addr, src_addr, nbytes, src_bytes))
        _landing_point(st)


# ======================================================== cp.async.{cg,ca}: start a copy
INSTRUCTIONS["cp_async16"] = ("cp.async.cg.shared.global [dst], [src], 16", (8, 0),
                              "LDGSTS.E.BYPASS.128")
INSTRUCTIONS["cp_async16_zfill"] = ("cp.async.cg.shared.global [dst], [src], 16, src_bytes",
                                    (8, 0), "LDGSTS.E.BYPASS.128.ZFILL")
INSTRUCTIONS["cp_async_ca"] = ("cp.async.ca.shared.global [dst], [src], {4|8|16}", (8, 0),
                               "LDGSTS.E")
_CP_ASYNC16_DOC = """cp_async16(dst, di, src, si): start copying 16 bytes from global
    ``src[si]`` to shared ``dst[di]`` without waiting (both 16-byte aligned). The copy belongs
    to the next ``cp_async_commit_group()``; read ``dst`` only after a
    ``cp_async_wait_group`` that covers it and a ``cuda.syncthreads()``.

    PTX: ``cp.async.cg.shared.global [dst], [src], 16;`` (``.cg``: cached in L2 only, skips
    L1); SASS ``LDGSTS.E.BYPASS.128``. Compute capability 8.0."""
_CP_ASYNC16_ZFILL_DOC = """cp_async16_zfill(dst, di, src, si, src_bytes): as
    :func:`cp_async16`, but reads only the first ``src_bytes`` (0 to 16) bytes of the source
    and writes zeros to the rest of the 16: the way to load the ragged edge of a tile (with
    ``src_bytes = 0`` nothing is read, so an out-of-range tile costs no access).

    PTX: ``cp.async.cg.shared.global [dst], [src], 16, src_bytes;``. Compute capability 8.0."""
_CP_ASYNC_CA_DOC = """cp_async_ca(dst, di, src, si, nbytes): start an asynchronous copy of
    ``nbytes`` (a constant: 4, 8 or 16) bytes, both addresses aligned to ``nbytes``: for
    operands whose rows are not 16-byte aligned.

    PTX: ``cp.async.ca.shared.global [dst], [src], nbytes;`` (``.ca``: cached in L1 too).
    Compute capability 8.0."""

if SIMULATED:
    def cp_async16(dst, di, src, si):
        _issue("cp_async16", dst, di, src, si, 16, 16, 16)

    def cp_async16_zfill(dst, di, src, si, src_bytes):
        _issue("cp_async16_zfill", dst, di, src, si, 16, src_bytes, 16)

    def cp_async_ca(dst, di, src, si, nbytes):
        if nbytes not in (4, 8, 16) or not pl.is_int(nbytes):
            raise PTXUsageError(msg_literal("cp_async_ca", "nbytes (4, 8 or 16)", nbytes))
        _issue("cp_async_ca", dst, di, src, si, nbytes, nbytes, nbytes)
else:
    def _check_copy(fn, dst, di, src, si):
        pl.check_index(fn, dst, di, "the shared destination")
        pl.check_index(fn, src, si, "the global source")
        if dst.dtype.bitwidth != src.dtype.bitwidth:
            raise PTXUsageError(f"{fn}: source and destination differ in element size "
                                f"({src.dtype}, {dst.dtype})")

    def _emit_copy(context, builder, sig, args, text, src_size=None):
        """cp.async with the shared address as a 32-bit register, the global one as 64."""
        dty, dity, sty, sity = sig.args[:4]
        d, dix, s, six = args[:4]
        ops = [pl.smem_u32(builder, pl.elem_ptr(context, builder, dty, d, dity, dix)),
               pl.gmem_u64(builder, pl.elem_ptr(context, builder, sty, s, sity, six))]
        tys, cons = [I32, I64], "r,l"
        if src_size is not None:
            ops.append(pl.as_i32(builder, args[4], sig.args[4]))
            tys, cons = tys + [I32], cons + ",r"
        pl.asm_call(builder, text, cons + ",~{memory}", ops, tys)

    @intrinsic
    def cp_async16(typingctx, dst, di, src, si):
        _check_copy("cp_async16", dst, di, src, si)

        def codegen(context, builder, sig, args):
            _emit_copy(context, builder, sig, args, "cp.async.cg.shared.global [$0], [$1], 16;")
        return types.void(dst, di, src, si), codegen

    @intrinsic
    def cp_async16_zfill(typingctx, dst, di, src, si, src_bytes):
        _check_copy("cp_async16_zfill", dst, di, src, si)
        if not pl.is_int(src_bytes):
            raise PTXUsageError(f"cp_async16_zfill: src_bytes must be an integer (0 to 16), "
                                f"got {src_bytes}")

        def codegen(context, builder, sig, args):
            _emit_copy(context, builder, sig, args,
                       "cp.async.cg.shared.global [$0], [$1], 16, $2;", src_size=True)
        return types.void(dst, di, src, si, src_bytes), codegen

    @intrinsic_literal
    def cp_async_ca(typingctx, dst, di, src, si, nbytes):
        fn = "cp_async_ca"
        _check_copy(fn, dst, di, src, si)
        if not isinstance(nbytes, types.IntegerLiteral) or \
                nbytes.literal_value not in (4, 8, 16):
            got = nbytes.literal_value if isinstance(nbytes, types.IntegerLiteral) else nbytes
            raise PTXUsageError(msg_literal(fn, "nbytes (4, 8 or 16)", got))
        n = nbytes.literal_value

        def codegen(context, builder, sig, args):
            _emit_copy(context, builder, sig, args,
                       f"cp.async.ca.shared.global [$0], [$1], {n};")
        return types.void(dst, di, src, si, nbytes), codegen

set_doc(cp_async16, _CP_ASYNC16_DOC)
set_doc(cp_async16_zfill, _CP_ASYNC16_ZFILL_DOC)
set_doc(cp_async_ca, _CP_ASYNC_CA_DOC)


# ================================================= cp.async.commit_group: close a group
INSTRUCTIONS["cp_async_commit_group"] = ("cp.async.commit_group", (8, 0), "LDGDEPBAR")
_COMMIT_DOC = """cp_async_commit_group(): close the copies this thread issued since the
    last commit into one group.

    PTX: ``cp.async.commit_group;`` (SASS ``LDGDEPBAR``). Compute capability 8.0."""

if SIMULATED:
    def cp_async_commit_group():
        st = _state()
        st["groups"].append(st["pending"])
        st["pending"] = []
        _landing_point(st)
else:
    cp_async_commit_group = pl.barrier_op("cp_async_commit_group", "cp.async.commit_group;")

set_doc(cp_async_commit_group, _COMMIT_DOC)


# ============================================ cp.async.wait_group N: wait for old groups
INSTRUCTIONS["cp_async_wait_group"] = ("cp.async.wait_group N", (8, 0), "DEPBAR.LE SB0, N")
_WAIT_DOC = """cp_async_wait_group(N): wait until at most the ``N`` newest groups of this
    thread are still in flight (``N`` a compile-time constant; 0 waits for all). It waits for
    this thread's copies only: follow it with ``cuda.syncthreads()`` before reading what
    other threads copied.

    PTX: ``cp.async.wait_group N;`` (SASS ``DEPBAR.LE SB0, N``). Compute capability 8.0."""

if SIMULATED:
    def cp_async_wait_group(n):
        if not pl.is_int(n):
            raise PTXUsageError(msg_literal("cp_async_wait_group", "N", repr(n)))
        if n < 0:
            raise PTXUsageError(f"cp_async_wait_group: N must be >= 0, got {n}")
        st = _state()
        _landing_point(st)
        groups = st["groups"]
        while len(groups) > n:
            for copy in groups.pop(0):
                _land(copy)
else:
    @intrinsic_literal
    def cp_async_wait_group(typingctx, n):
        N = pl.literal_int("cp_async_wait_group", "N", n)
        if N < 0:
            raise PTXUsageError(f"cp_async_wait_group: N must be >= 0, got {N}")

        def codegen(context, builder, sig, args):
            pl.asm_call(builder, f"cp.async.wait_group {N};", "~{memory}")
        return types.void(n), codegen

set_doc(cp_async_wait_group, _WAIT_DOC)


# ============================================== conversions: bf16 and fp16 <-> float32
if SIMULATED:
    def bf16_to_f32(bits):
        return np.float32(pl.halves_to_f32(np.int16(bits)))

    def f32_to_bf16(x):
        u = np.array(x, dtype=np.float32).view(np.uint32)
        if np.isnan(np.float32(x)):
            return np.int16(0x7FC0)
        r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        return np.uint16(r).view(np.int16)

    def f32_to_f16(x):
        with np.errstate(over="ignore"):     # as cvt.rn.f16.f32: too large -> inf
            return np.float16(x)

    def f16_to_f32(x):
        return np.float32(x)
else:
    @intrinsic
    def bf16_to_f32(typingctx, bits):
        if not (pl.is_int(bits) and bits.bitwidth == 16):
            raise PTXUsageError(f"bf16_to_f32: takes the raw 16 bits (int16), got {bits}")

        def codegen(context, builder, sig, args):
            w = builder.shl(builder.zext(args[0], I32), ir.Constant(I32, 16))
            return builder.bitcast(w, F32)
        return types.float32(bits), codegen

    @intrinsic
    def f32_to_bf16(typingctx, x):
        if not isinstance(x, types.Float):
            raise PTXUsageError(f"f32_to_bf16: takes a float, got {x}")

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.float32)
            return pl.asm_call(builder, "cvt.rn.bf16.f32 $0, $1;", "=h,f", [v], [F32],
                               ir.IntType(16), side_effect=False)
        return types.int16(x), codegen

    @intrinsic
    def f32_to_f16(typingctx, x):
        if not isinstance(x, types.Float):
            raise PTXUsageError(f"f32_to_f16: takes a float, got {x}")

        def codegen(context, builder, sig, args):
            return context.cast(builder, args[0], sig.args[0], types.float16)
        return types.float16(x), codegen

    @intrinsic
    def f16_to_f32(typingctx, x):
        if x != types.float16:
            raise PTXUsageError(f"f16_to_f32: takes a float16, got {x}")

        def codegen(context, builder, sig, args):
            return context.cast(builder, args[0], types.float16, types.float32)
        return types.float32(x), codegen

set_doc(bf16_to_f32, """bf16_to_f32(bits): the float32 value of bf16 raw bits (int16): the
    bits shifted into the high half of a float32 word. Exact.""")
set_doc(f32_to_bf16, """f32_to_bf16(x): the bf16 raw bits (int16) of float32 ``x``, rounded
    to nearest even. PTX: ``cvt.rn.bf16.f32``; compute capability 8.0.""")
set_doc(f32_to_f16, """f32_to_f16(x): float32 to float16, rounded to nearest even
    (``cvt.rn.f16.f32``).""")
set_doc(f16_to_f32, """f16_to_f32(x): float16 to float32, exact (``cvt.f32.f16``).""")
