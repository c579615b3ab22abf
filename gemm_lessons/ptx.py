"""Tensor cores and asynchronous copies from numba: inline-PTX intrinsics, and their emulation.

numba has no API for tensor cores (WMMA) or ``cp.async``. This module adds them. On a GPU
(and when compiling PTX) each function below is a numba *intrinsic*: a call in a kernel
becomes the one PTX instruction its docstring names, written with ``llvmlite.ir.InlineAsm``.
In numba's CUDA simulator the same names are plain Python with the same meaning, so a
lesson runs unchanged on a laptop:

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
  N newest groups are still in flight. The simulator queues each thread's copies and lands
  them at the latest moment PTX allows (at the wait that covers them): a kernel that forgets
  to wait reads stale shared memory on a laptop, as it may on a GPU.

Indices: every ``arr, idx`` pair names one element, ``idx`` an integer for a 1-D array or a
tuple with one integer per dimension; the instruction starts at that element's address.
Shared arrays that ``cp.async`` or WMMA touch must be aligned: declare them with
``cuda.shared.array(shape, dtype, alignment=SMEM_ALIGN)`` (the simulator takes no alignment,
so :data:`SMEM_ALIGN` is None there).

Every layout and count argument is a compile-time constant (a literal, or a constant the
kernel factory closes over): PTX has no run-time form of them.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from . import counters, engines

__all__ = ["SIMULATED", "FRAG_AB", "FRAG_C", "SMEM_ALIGN",
           "wmma_load_a", "wmma_load_b", "wmma_mma", "wmma_store_d",
           "cp_async16", "cp_async16_zfill", "cp_async_ca", "cp_async_commit_group",
           "cp_async_wait_group", "bf16_to_f32", "f32_to_bf16", "f16_to_f32", "f32_to_f16",
           "MIN_CC", "INSTRUCTIONS"]

#: True where the functions are Python emulations (numba's simulator).
SIMULATED = engines.engine().kind == "simulator"

#: Elements per lane of an A or B fragment (fp16: 8 registers of two halves; bf16 uses 8
#: of the 16), and of the float32 accumulator (8 registers). The simulator keeps the tile.
FRAG_AB = 256 if SIMULATED else 16
FRAG_C = 256 if SIMULATED else 8

#: ``alignment=`` for shared arrays that cp.async (16 bytes) and wmma (32 bytes) touch.
SMEM_ALIGN = None if SIMULATED else 128

#: Minimum compute capability of each instruction family.
MIN_CC = {"wmma": (7, 0), "wmma_bf16": (8, 0), "cp.async": (8, 0)}

#: Each function: the PTX instruction it becomes, the minimum compute capability, and the
#: SASS it turns into on sm_80 and later (what ptxas emits; see the lessons).
INSTRUCTIONS = {
    "wmma_load_a": ("wmma.load.a.sync.aligned.{row|col}.m16n16k16.shared.{f16|bf16}",
                    (7, 0), "LDSM.16.M88.4 (ldmatrix)"),
    "wmma_load_b": ("wmma.load.b.sync.aligned.{row|col}.m16n16k16.shared.{f16|bf16}",
                    (7, 0), "LDSM.16.MT88.4 (ldmatrix .trans)"),
    "wmma_mma": ("wmma.mma.sync.aligned.{row|col}.{row|col}.m16n16k16.f32.f32",
                 (7, 0), "2 x HMMA.16816.F32"),
    "wmma_store_d": ("wmma.store.d.sync.aligned.{row|col}.m16n16k16.f32", (7, 0), "STS / STG"),
    "cp_async16": ("cp.async.cg.shared.global [dst], [src], 16", (8, 0), "LDGSTS.E.BYPASS.128"),
    "cp_async16_zfill": ("cp.async.cg.shared.global [dst], [src], 16, src_bytes", (8, 0),
                         "LDGSTS.E.BYPASS.128.ZFILL"),
    "cp_async_ca": ("cp.async.ca.shared.global [dst], [src], {4|8|16}", (8, 0), "LDGSTS.E"),
    "cp_async_commit_group": ("cp.async.commit_group", (8, 0), "LDGDEPBAR"),
    "cp_async_wait_group": ("cp.async.wait_group N", (8, 0), "DEPBAR.LE SB0, N"),
}

_LAYOUTS = ("row", "col")


class PTXUsageError(TypeError):
    """An intrinsic was called with arguments its PTX instruction cannot take."""


def _msg_literal(fn, what, got):
    return (f"{fn}: {what} must be a compile-time constant (a literal such as 0 or 'row', "
            f"or a constant the kernel factory closes over); got {got}")


# ====================================================================== the GPU: intrinsics
if not SIMULATED:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda import extending as _extending
    from numba.cuda.extending import intrinsic

    def _intrinsic_literal(func):
        # literal arguments (layouts, counts) are typed as literals first
        return _extending._intrinsic(target="cuda", prefer_literal=True)(func)

    _I32 = ir.IntType(32)
    _I64 = ir.IntType(64)

    def _is_int(t):
        return isinstance(t, types.Integer)

    def _check_index(fn, arrty, idxty, what):
        if not isinstance(arrty, types.Array):
            raise PTXUsageError(f"{fn}: {what} must be an array, got {arrty}")
        if _is_int(idxty):
            if arrty.ndim != 1:
                raise PTXUsageError(f"{fn}: {what} is {arrty.ndim}-D: give its index as a "
                                    f"tuple of {arrty.ndim} integers")
            return
        if isinstance(idxty, types.BaseTuple) and all(_is_int(t) for t in idxty.types):
            if len(idxty.types) != arrty.ndim:
                raise PTXUsageError(f"{fn}: {what} is {arrty.ndim}-D but its index has "
                                    f"{len(idxty.types)} entries")
            return
        raise PTXUsageError(f"{fn}: the index into {what} must be an integer or a tuple of "
                            f"integers, got {idxty}")

    def _elem_ptr(context, builder, arrty, arr, idxty, idx):
        """Generic (64-bit) pointer to ``arr[idx]`` as i8*."""
        ary = context.make_array(arrty)(context, builder, value=arr)
        if isinstance(idxty, types.BaseTuple):
            vals = cgutils.unpack_tuple(builder, idx, len(idxty.types))
            tys = idxty.types
        else:
            vals, tys = [idx], [idxty]
        inds = [context.cast(builder, v, t, types.intp) for v, t in zip(vals, tys)]
        ptr = cgutils.get_item_pointer(context, builder, arrty, ary, inds, wraparound=False)
        return builder.bitcast(ptr, ir.IntType(8).as_pointer())

    def _data_ptr(context, builder, arrty, arr, elt):
        ary = context.make_array(arrty)(context, builder, value=arr)
        return builder.bitcast(ary.data, elt.as_pointer())

    def _as_i32(builder, val, ty):
        if ty.bitwidth > 32:
            return builder.trunc(val, _I32)
        if ty.bitwidth < 32:
            return builder.sext(val, _I32) if ty.signed else builder.zext(val, _I32)
        return val

    def _literal_str(fn, what, t):
        if isinstance(t, types.StringLiteral) and t.literal_value in _LAYOUTS:
            return t.literal_value
        if isinstance(t, types.StringLiteral):
            raise PTXUsageError(f"{fn}: {what} must be 'row' or 'col', got "
                                f"{t.literal_value!r}")
        raise PTXUsageError(_msg_literal(fn, what, t))

    def _elt_kind(fn, dtype, what):
        """'f16' or 'bf16' from an array dtype (bf16 is carried as int16/uint16 bits)."""
        if dtype == types.float16:
            return "f16"
        if dtype in (types.int16, types.uint16):
            return "bf16"
        raise PTXUsageError(f"{fn}: {what} must hold float16 (fp16) or int16 (the raw bits "
                            f"of bf16), got {dtype}")

    def _check_frag(fn, fty, kind, n, what):
        if not isinstance(fty, types.Array) or fty.ndim != 1 or fty.layout != "C":
            raise PTXUsageError(f"{fn}: {what} must be a 1-D contiguous local array "
                                f"(cuda.local.array(FRAG_.., dtype)), got {fty}")
        want = {"f16": types.float16, "bf16": types.int16, "f32": types.float32}[kind]
        if fty.dtype != want and not (kind == "bf16" and fty.dtype == types.uint16):
            raise PTXUsageError(f"{fn}: {what} must have dtype {want} to match the data "
                                f"({kind}), got {fty.dtype}")

    def _smem_u32(builder, p):
        """A generic pointer into shared memory as its 32-bit shared-window address. Done in
        LLVM (addrspacecast), not in the asm, so that NVVM folds it into the shared array's
        address and the PTX computes 32-bit offsets (no cvta per access)."""
        return builder.ptrtoint(builder.addrspacecast(p, ir.IntType(8).as_pointer(3)), _I32)

    def _gmem_u64(builder, p):
        """A generic pointer into global memory as a .global address."""
        return builder.ptrtoint(builder.addrspacecast(p, ir.IntType(8).as_pointer(1)), _I64)

    def _make_wmma_load(which):
        name = f"wmma_load_{which}"

        @_intrinsic_literal
        def load(typingctx, frag, arr, idx, ldm, layout):
            _check_index(name, arr, idx, "the shared array")
            kind = _elt_kind(name, arr.dtype, "the shared array")
            _check_frag(name, frag, kind, 16, "the fragment")
            if not _is_int(ldm):
                raise PTXUsageError(f"{name}: ldm (the row stride in elements) must be an "
                                    f"integer, got {ldm}")
            lay = _literal_str(name, "layout", layout)
            nreg = 8 if kind == "f16" else 4
            sig = types.void(frag, arr, idx, ldm, layout)

            def codegen(context, builder, sig, args):
                fty, aty, ity, lty, _ = sig.args
                f, a, i, l, _ = args
                p = _elem_ptr(context, builder, aty, a, ity, i)
                regs = ",".join(f"${k}" for k in range(nreg))
                asm = ir.InlineAsm(
                    ir.FunctionType(ir.LiteralStructType([_I32] * nreg), [_I32, _I32]),
                    f"wmma.load.{which}.sync.aligned.{lay}.m16n16k16.shared.{kind} "
                    f"{{{regs}}}, [${nreg}], ${nreg + 1};",
                    "=r," * nreg + "r,r,~{memory}", side_effect=True)
                res = builder.call(asm, [_smem_u32(builder, p), _as_i32(builder, l, lty)])
                fp = _data_ptr(context, builder, fty, f, _I32)
                for k in range(nreg):
                    builder.store(builder.extract_value(res, k),
                                  builder.gep(fp, [ir.Constant(_I32, k)]))
            return sig, codegen
        return load

    _wmma_load_a = _make_wmma_load("a")
    _wmma_load_b = _make_wmma_load("b")

    @_intrinsic_literal
    def _wmma_mma(typingctx, acc, a, b, a_layout, b_layout):
        fn = "wmma_mma"
        for what, f in (("a", a), ("b", b)):
            if not isinstance(f, types.Array):
                raise PTXUsageError(f"{fn}: fragment {what} must be a local array, got {f}")
        kind = _elt_kind(fn, a.dtype, "fragment a")
        if _elt_kind(fn, b.dtype, "fragment b") != kind:
            raise PTXUsageError(f"{fn}: fragments a and b differ in dtype ({a.dtype}, "
                                f"{b.dtype})")
        _check_frag(fn, a, kind, 16, "fragment a")
        _check_frag(fn, b, kind, 16, "fragment b")
        _check_frag(fn, acc, "f32", 8, "the accumulator")
        la = _literal_str(fn, "a_layout", a_layout)
        lb = _literal_str(fn, "b_layout", b_layout)
        nreg = 8 if kind == "f16" else 4
        types_part = "f32.f32" if kind == "f16" else "f32.bf16.bf16.f32"
        sig = types.void(acc, a, b, a_layout, b_layout)

        def codegen(context, builder, sig, args):
            cty, aty, bty = sig.args[:3]
            c, av, bv = args[:3]
            f32 = ir.FloatType()
            cp = _data_ptr(context, builder, cty, c, f32)
            ap = _data_ptr(context, builder, aty, av, _I32)
            bp = _data_ptr(context, builder, bty, bv, _I32)

            def get(p, k):
                return builder.gep(p, [ir.Constant(_I32, k)])
            ins = ([builder.load(get(ap, k)) for k in range(nreg)] +
                   [builder.load(get(bp, k)) for k in range(nreg)] +
                   [builder.load(get(cp, k)) for k in range(8)])
            d = ",".join(f"${k}" for k in range(8))
            A = ",".join(f"${k}" for k in range(8, 8 + nreg))
            B = ",".join(f"${k}" for k in range(8 + nreg, 8 + 2 * nreg))
            C = ",".join(f"${k}" for k in range(8 + 2 * nreg, 16 + 2 * nreg))
            asm = ir.InlineAsm(
                ir.FunctionType(ir.LiteralStructType([f32] * 8), [_I32] * (2 * nreg) + [f32] * 8),
                f"wmma.mma.sync.aligned.{la}.{lb}.m16n16k16.{types_part} "
                f"{{{d}}}, {{{A}}}, {{{B}}}, {{{C}}};",
                "=f," * 8 + "r," * (2 * nreg) + ",".join(["f"] * 8), side_effect=False)
            res = builder.call(asm, ins)
            for k in range(8):
                builder.store(builder.extract_value(res, k), get(cp, k))
        return sig, codegen

    @_intrinsic_literal
    def _wmma_store_d(typingctx, arr, idx, ldm, acc, layout):
        fn = "wmma_store_d"
        _check_index(fn, arr, idx, "the destination")
        if arr.dtype != types.float32:
            raise PTXUsageError(f"{fn}: the destination must be a float32 array (the "
                                f"accumulator is float32), got {arr.dtype}")
        _check_frag(fn, acc, "f32", 8, "the accumulator")
        if not _is_int(ldm):
            raise PTXUsageError(f"{fn}: ldm must be an integer, got {ldm}")
        lay = _literal_str(fn, "layout", layout)
        sig = types.void(arr, idx, ldm, acc, layout)

        def codegen(context, builder, sig, args):
            aty, ity, lty, cty, _ = sig.args
            a, i, l, c, _ = args
            f32 = ir.FloatType()
            p = _elem_ptr(context, builder, aty, a, ity, i)
            cp = _data_ptr(context, builder, cty, c, f32)
            vals = [builder.load(builder.gep(cp, [ir.Constant(_I32, k)])) for k in range(8)]
            regs = ",".join(f"${k}" for k in range(1, 9))
            asm = ir.InlineAsm(
                ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()] + [f32] * 8 + [_I32]),
                f"wmma.store.d.sync.aligned.{lay}.m16n16k16.f32 [$0], {{{regs}}}, $9;",
                "l," + "f," * 8 + "r,~{memory}", side_effect=True)
            builder.call(asm, [p] + vals + [_as_i32(builder, l, lty)])
        return sig, codegen

    def _cp_async_typing(fn, dst, di, src, si):
        _check_index(fn, dst, di, "the shared destination")
        _check_index(fn, src, si, "the global source")
        if dst.dtype.bitwidth != src.dtype.bitwidth:
            raise PTXUsageError(f"{fn}: source and destination differ in element size "
                                f"({src.dtype}, {dst.dtype})")

    def _cp_async_asm(cache, nbytes, with_src_size):
        tail = ", $2" if with_src_size else ""
        return f"cp.async.{cache}.shared.global [$0], [$1], {nbytes}{tail};"

    @intrinsic
    def _cp_async16(typingctx, dst, di, src, si):
        _cp_async_typing("cp_async16", dst, di, src, si)
        sig = types.void(dst, di, src, si)

        def codegen(context, builder, sig, args):
            dty, dity, sty, sity = sig.args
            d, dix, s, six = args
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I32, _I64]),
                               _cp_async_asm("cg", 16, False), "r,l,~{memory}",
                               side_effect=True)
            builder.call(asm, [_smem_u32(builder, _elem_ptr(context, builder, dty, d, dity, dix)),
                               _gmem_u64(builder, _elem_ptr(context, builder, sty, s, sity, six))])
        return sig, codegen

    @intrinsic
    def _cp_async16_zfill(typingctx, dst, di, src, si, src_bytes):
        _cp_async_typing("cp_async16_zfill", dst, di, src, si)
        if not _is_int(src_bytes):
            raise PTXUsageError(f"cp_async16_zfill: src_bytes must be an integer (0 to 16), "
                                f"got {src_bytes}")
        sig = types.void(dst, di, src, si, src_bytes)

        def codegen(context, builder, sig, args):
            dty, dity, sty, sity, nty = sig.args
            d, dix, s, six, n = args
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I32, _I64, _I32]),
                               _cp_async_asm("cg", 16, True), "r,l,r,~{memory}",
                               side_effect=True)
            builder.call(asm, [_smem_u32(builder, _elem_ptr(context, builder, dty, d, dity, dix)),
                               _gmem_u64(builder, _elem_ptr(context, builder, sty, s, sity, six)),
                               _as_i32(builder, n, nty)])
        return sig, codegen

    @_intrinsic_literal
    def _cp_async_ca(typingctx, dst, di, src, si, nbytes):
        fn = "cp_async_ca"
        _cp_async_typing(fn, dst, di, src, si)
        if not isinstance(nbytes, types.IntegerLiteral) or \
                nbytes.literal_value not in (4, 8, 16):
            got = nbytes.literal_value if isinstance(nbytes, types.IntegerLiteral) else nbytes
            raise PTXUsageError(_msg_literal(fn, "nbytes (4, 8 or 16)", got))
        n = nbytes.literal_value
        sig = types.void(dst, di, src, si, nbytes)

        def codegen(context, builder, sig, args):
            dty, dity, sty, sity, _ = sig.args
            d, dix, s, six, _ = args
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I32, _I64]),
                               _cp_async_asm("ca", n, False), "r,l,~{memory}",
                               side_effect=True)
            builder.call(asm, [_smem_u32(builder, _elem_ptr(context, builder, dty, d, dity, dix)),
                               _gmem_u64(builder, _elem_ptr(context, builder, sty, s, sity, six))])
        return sig, codegen

    @intrinsic
    def _cp_async_commit_group(typingctx):
        sig = types.void()

        def codegen(context, builder, sig, args):
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []),
                                      "cp.async.commit_group;", "~{memory}",
                                      side_effect=True), [])
        return sig, codegen

    @_intrinsic_literal
    def _cp_async_wait_group(typingctx, n):
        fn = "cp_async_wait_group"
        if not isinstance(n, types.IntegerLiteral):
            raise PTXUsageError(_msg_literal(fn, "N", f"a run-time value of type {n}"))
        N = n.literal_value
        if N < 0:
            raise PTXUsageError(f"{fn}: N must be >= 0, got {N}")
        sig = types.void(n)

        def codegen(context, builder, sig, args):
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []),
                                      f"cp.async.wait_group {N};", "~{memory}",
                                      side_effect=True), [])
        return sig, codegen

    @intrinsic
    def _bf16_to_f32(typingctx, bits):
        if not (_is_int(bits) and bits.bitwidth == 16):
            raise PTXUsageError(f"bf16_to_f32: takes the raw 16 bits (int16), got {bits}")
        sig = types.float32(bits)

        def codegen(context, builder, sig, args):
            w = builder.shl(builder.zext(args[0], _I32), ir.Constant(_I32, 16))
            return builder.bitcast(w, ir.FloatType())
        return sig, codegen

    @intrinsic
    def _f32_to_bf16(typingctx, x):
        if not isinstance(x, types.Float):
            raise PTXUsageError(f"f32_to_bf16: takes a float, got {x}")
        sig = types.int16(x)

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(16), [ir.FloatType()]),
                               "cvt.rn.bf16.f32 $0, $1;", "=h,f")
            return builder.call(asm, [v])
        return sig, codegen

    @intrinsic
    def _f32_to_f16(typingctx, x):
        if not isinstance(x, types.Float):
            raise PTXUsageError(f"f32_to_f16: takes a float, got {x}")
        sig = types.float16(x)

        def codegen(context, builder, sig, args):
            return context.cast(builder, args[0], sig.args[0], types.float16)
        return sig, codegen

    @intrinsic
    def _f16_to_f32(typingctx, x):
        if x != types.float16:
            raise PTXUsageError(f"f16_to_f32: takes a float16, got {x}")
        sig = types.float32(x)

        def codegen(context, builder, sig, args):
            return context.cast(builder, args[0], types.float16, types.float32)
        return sig, codegen


# ================================================================ the simulator: emulation
else:
    def _is_int(x):
        return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

    def _np(arr, fn, what):
        """The numpy array behind a simulator array (shared, local or global)."""
        from numba.cuda.simulator.cudadrv.devicearray import (FakeCUDAArray,
                                                              FakeWithinKernelCUDAArray)
        if isinstance(arr, FakeWithinKernelCUDAArray):
            arr = arr.__dict__["_item"]
        if isinstance(arr, FakeCUDAArray):
            return arr._ary
        arr = counters.unwrap(arr)
        if isinstance(arr, np.ndarray):
            return arr
        raise PTXUsageError(f"{fn}: {what} must be an array, got {type(arr).__name__}")

    def _is_global(arr):
        from numba.cuda.simulator.cudadrv.devicearray import (FakeCUDAArray,
                                                              FakeWithinKernelCUDAArray)
        return isinstance(arr, (FakeCUDAArray, FakeWithinKernelCUDAArray))

    def _offset(a, idx, fn, what):
        """Byte offset of a[idx] from a's first element; checks the index."""
        idx = (idx,) if _is_int(idx) else tuple(idx)
        if not all(_is_int(i) for i in idx):
            raise PTXUsageError(f"{fn}: the index into {what} must be integers, got {idx}")
        if len(idx) != a.ndim:
            raise PTXUsageError(f"{fn}: {what} is {a.ndim}-D but its index has {len(idx)} "
                                f"entries")
        for i, n in zip(idx, a.shape):
            if not 0 <= i < n:
                raise IndexError(f"{fn}: index {idx} is outside {what} of shape {a.shape}")
        return sum(int(i) * s for i, s in zip(idx, a.strides))

    def _addr(a):
        return a.__array_interface__["data"][0]

    try:
        from numpy.lib.array_utils import byte_bounds as _byte_bounds
    except ImportError:  # numpy < 2
        _byte_bounds = np.byte_bounds

    def _check_span(a, start, nbytes, fn, what):
        lo, hi = _byte_bounds(a)
        if start < lo or start + nbytes > hi:
            raise IndexError(f"{fn}: {nbytes} bytes at {what}[...] run past the end of the "
                             f"array (the GPU would read or write memory it does not own)")

    def _layout(fn, what, lay):
        if not isinstance(lay, str):
            raise PTXUsageError(_msg_literal(fn, what, repr(lay)))
        if lay not in _LAYOUTS:
            raise PTXUsageError(f"{fn}: {what} must be 'row' or 'col', got {lay!r}")
        return lay

    def _kind(fn, dtype, what):
        if dtype == np.float16:
            return "f16"
        if dtype in (np.int16, np.uint16):
            return "bf16"
        raise PTXUsageError(f"{fn}: {what} must hold float16 (fp16) or int16 (the raw bits "
                            f"of bf16), got {dtype}")

    def _to_f32(x):
        """fp16 values, or bf16 bits (int16), as float32."""
        x = np.asarray(x)
        if x.dtype == np.float16:
            return x.astype(np.float32)
        return (x.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)

    # Fragments are opaque: a simulated fragment holds the whole 16x16 tile in the order it
    # lay in memory; wmma_mma reads it with the layout it is given, so a layout that does not
    # match the load gives a wrong product here as it does on the GPU.
    def _frag(f, fn, what, dtypes):
        f = np.asarray(f)
        if f.ndim != 1 or f.size < 256:
            raise PTXUsageError(f"{fn}: {what} must be a 1-D local array of FRAG_AB (or "
                                f"FRAG_C) elements, got shape {f.shape}")
        if f.dtype not in dtypes:
            raise PTXUsageError(f"{fn}: {what} has dtype {f.dtype}; it must be "
                                f"{' or '.join(str(np.dtype(d)) for d in dtypes)}")
        return f

    def _tile_view(fn, arr, idx, ldm, lay, what):
        """The 16x16 tile at arr[idx] with leading dimension ldm, as memory holds it:
        view[r, c] = element (r * ldm + c) after the start ("row") - for "col" the logical
        element (i, j) is view[j, i]."""
        a = _np(arr, fn, what)
        start = _addr(a) + _offset(a, idx, fn, what)
        isz = a.dtype.itemsize
        ldm = int(ldm) if _is_int(ldm) else ldm
        if not _is_int(ldm) or ldm < 16:
            raise PTXUsageError(f"{fn}: ldm must be an integer >= 16, got {ldm}")
        if (ldm * isz) % 16:
            raise PTXUsageError(f"{fn}: ldm * element size must be a multiple of 16 bytes "
                                f"(ldm={ldm})")
        if (start - _addr(a)) % 32:
            raise PTXUsageError(f"{fn}: the tile must start 32-byte aligned within the "
                                f"array (byte offset {start - _addr(a)})")
        span = (15 * ldm + 16) * isz
        _check_span(a, start, span, fn, what)
        return np.lib.stride_tricks.as_strided(
            np.frombuffer((ctypes.c_char * span).from_address(start), dtype=a.dtype),
            shape=(16, 16), strides=(ldm * isz, isz), writeable=False)

    def wmma_load_a(frag, arr, idx, ldm, layout):
        fn = "wmma_load_a"
        lay = _layout(fn, "layout", layout)
        kind = _kind(fn, _np(arr, fn, "the shared array").dtype, "the shared array")
        if _is_global(arr):
            raise PTXUsageError(f"{fn}: loads fragments from shared memory; pass a "
                                "cuda.shared.array")
        f = _frag(frag, fn, "the fragment", (np.float16,) if kind == "f16"
                  else (np.int16, np.uint16))
        f[:256] = _tile_view(fn, arr, idx, ldm, lay, "the shared array").reshape(-1)

    def wmma_load_b(frag, arr, idx, ldm, layout):
        fn = "wmma_load_b"
        lay = _layout(fn, "layout", layout)
        kind = _kind(fn, _np(arr, fn, "the shared array").dtype, "the shared array")
        if _is_global(arr):
            raise PTXUsageError(f"{fn}: loads fragments from shared memory; pass a "
                                "cuda.shared.array")
        f = _frag(frag, fn, "the fragment", (np.float16,) if kind == "f16"
                  else (np.int16, np.uint16))
        f[:256] = _tile_view(fn, arr, idx, ldm, lay, "the shared array").reshape(-1)

    def wmma_mma(acc, a, b, a_layout, b_layout):
        fn = "wmma_mma"
        la = _layout(fn, "a_layout", a_layout)
        lb = _layout(fn, "b_layout", b_layout)
        a = np.asarray(a)
        b = np.asarray(b)
        ka, kb = _kind(fn, a.dtype, "fragment a"), _kind(fn, b.dtype, "fragment b")
        if ka != kb:
            raise PTXUsageError(f"{fn}: fragments a and b differ in dtype ({a.dtype}, "
                                f"{b.dtype})")
        _frag(a, fn, "fragment a", (a.dtype,))
        _frag(b, fn, "fragment b", (b.dtype,))
        c = _frag(acc, fn, "the accumulator", (np.float32,))
        # a fragment holds its tile in memory order; the layout says how to read it
        A = _to_f32(a[:256]).reshape(16, 16)
        B = _to_f32(b[:256]).reshape(16, 16)
        if la == "col":
            A = A.T
        if lb == "col":
            B = B.T
        C = c[:256].reshape(16, 16)
        with np.errstate(all="ignore"):      # inf/NaN inputs give inf/NaN, as on the GPU
            C += A @ B

    def wmma_store_d(arr, idx, ldm, acc, layout):
        fn = "wmma_store_d"
        lay = _layout(fn, "layout", layout)
        a = _np(arr, fn, "the destination")
        if a.dtype != np.float32:
            raise PTXUsageError(f"{fn}: the destination must be a float32 array (the "
                                f"accumulator is float32), got {a.dtype}")
        c = _frag(acc, fn, "the accumulator", (np.float32,))
        if not _is_int(ldm) or ldm < 16 or (ldm * 4) % 16:
            raise PTXUsageError(f"{fn}: ldm must be an integer >= 16 and a multiple of 4, "
                                f"got {ldm}")
        base = _offset(a, idx, fn, "the destination")
        if base % 32:
            raise PTXUsageError(f"{fn}: the tile must start 32-byte aligned within the "
                                f"array (byte offset {base})")
        start = _addr(a) + base
        span = (15 * ldm + 16) * 4
        _check_span(a, start, span, fn, "the destination")
        view = np.lib.stride_tricks.as_strided(
            np.frombuffer((ctypes.c_char * span).from_address(start), dtype=np.float32),
            shape=(16, 16), strides=(ldm * 4, 4))
        tile = c[:256].reshape(16, 16)
        view[...] = tile if lay == "row" else tile.T

    # ---- cp.async: a queue of copies per thread -----------------------------------------
    def _state():
        th = threading.current_thread()
        st = getattr(th, "_gl_cp_async", None)
        if st is None:
            st = th._gl_cp_async = {"pending": [], "groups": []}
        return st

    def _issue(fn, dst, di, src, si, nbytes, src_bytes, align):
        d = _np(dst, fn, "the shared destination")
        s = _np(src, fn, "the global source")
        if _is_global(dst):
            raise PTXUsageError(f"{fn}: the destination must be shared memory "
                                "(cuda.shared.array), the source global memory")
        if d.dtype.itemsize != s.dtype.itemsize:
            raise PTXUsageError(f"{fn}: source and destination differ in element size "
                                f"({s.dtype}, {d.dtype})")
        if not _is_int(src_bytes) or not 0 <= src_bytes <= nbytes:
            raise PTXUsageError(f"{fn}: src_bytes must be an integer from 0 to {nbytes}, "
                                f"got {src_bytes}")
        nbytes, src_bytes = int(nbytes), int(src_bytes)
        doff = _offset(d, di, fn, "the shared destination")
        if doff % align:
            raise PTXUsageError(f"{fn}: the shared destination must be {align}-byte aligned "
                                f"(byte offset {doff} in the array)")
        dst_addr = _addr(d) + doff
        _check_span(d, dst_addr, nbytes, fn, "the shared destination")
        src_addr = 0
        if src_bytes:
            src_addr = _addr(s) + _offset(s, si, fn, "the global source")
            if src_addr % align:
                raise PTXUsageError(f"{fn}: the global source must be {align}-byte aligned "
                                    f"(address ends in {src_addr % 64:#x})")
            _check_span(s, src_addr, src_bytes, fn, "the global source")
        # keep the arrays alive until the copy lands
        _state()["pending"].append((d, s, dst_addr, src_addr, nbytes, src_bytes))

    def _land(copies):
        for _d, _s, dst_addr, src_addr, nbytes, src_bytes in copies:
            if src_bytes:
                ctypes.memmove(dst_addr, src_addr, src_bytes)
            if src_bytes < nbytes:
                ctypes.memset(dst_addr + src_bytes, 0, nbytes - src_bytes)

    def cp_async16(dst, di, src, si):
        _issue("cp_async16", dst, di, src, si, 16, 16, 16)

    def cp_async16_zfill(dst, di, src, si, src_bytes):
        _issue("cp_async16_zfill", dst, di, src, si, 16, src_bytes, 16)

    def cp_async_ca(dst, di, src, si, nbytes):
        if nbytes not in (4, 8, 16) or not _is_int(nbytes):
            raise PTXUsageError(_msg_literal("cp_async_ca", "nbytes (4, 8 or 16)", nbytes))
        _issue("cp_async_ca", dst, di, src, si, nbytes, nbytes, nbytes)

    def cp_async_commit_group():
        st = _state()
        st["groups"].append(st["pending"])
        st["pending"] = []

    def cp_async_wait_group(n):
        if not _is_int(n):
            raise PTXUsageError(_msg_literal("cp_async_wait_group", "N", repr(n)))
        if n < 0:
            raise PTXUsageError(f"cp_async_wait_group: N must be >= 0, got {n}")
        st = _state()
        groups = st["groups"]
        while len(groups) > n:
            _land(groups.pop(0))

    def bf16_to_f32(bits):
        return np.float32(_to_f32(np.int16(bits)))

    def f32_to_bf16(x):
        """float -> bf16 bits (int16), round to nearest even, as cvt.rn.bf16.f32."""
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


# ==================================================================== the public names
if not SIMULATED:
    wmma_load_a = _wmma_load_a
    wmma_load_b = _wmma_load_b
    wmma_mma = _wmma_mma
    wmma_store_d = _wmma_store_d
    cp_async16 = _cp_async16
    cp_async16_zfill = _cp_async16_zfill
    cp_async_ca = _cp_async_ca
    cp_async_commit_group = _cp_async_commit_group
    cp_async_wait_group = _cp_async_wait_group
    bf16_to_f32 = _bf16_to_f32
    f32_to_bf16 = _f32_to_bf16
    f16_to_f32 = _f16_to_f32
    f32_to_f16 = _f32_to_f16

_DOCS = {
    "wmma_load_a": """wmma_load_a(frag, arr, idx, ldm, layout): load the 16x16 A tile at
    ``arr[idx]`` (shared memory, ``ldm`` elements between rows if ``layout == 'row'``,
    between columns if ``'col'``) into this lane's fragment ``frag``. Warp-wide: all 32 lanes
    call it with the same arguments.

    PTX: ``wmma.load.a.sync.aligned.{row|col}.m16n16k16.shared.{f16|bf16}``; compute
    capability 7.0 (fp16), 8.0 (bf16). The tile must start 32-byte aligned and ``ldm`` be a
    multiple of 8 elements. ``arr`` holds float16, or int16 for bf16 bits; ``frag`` is
    ``cuda.local.array(FRAG_AB, same dtype)``.""",
    "wmma_load_b": """wmma_load_b(frag, arr, idx, ldm, layout): as :func:`wmma_load_a`, for
    the 16x16 B tile. PTX: ``wmma.load.b.sync.aligned.{row|col}.m16n16k16.shared.{f16|bf16}``;
    compute capability 7.0 (fp16), 8.0 (bf16).""",
    "wmma_mma": """wmma_mma(acc, a, b, a_layout, b_layout): ``acc += a @ b`` on a 16x16x16
    tile, in float32, warp-wide. The layouts must be those ``a`` and ``b`` were loaded with.

    PTX: ``wmma.mma.sync.aligned.{al}.{bl}.m16n16k16.f32.f32`` (fp16 inputs, compute
    capability 7.0) or ``...m16n16k16.f32.bf16.bf16.f32`` (bf16, 8.0): on sm_80+ each
    becomes two ``HMMA.16816.F32`` in SASS. ``acc`` is ``cuda.local.array(FRAG_C, float32)``
    (or a slice ``acc[i, j]`` of a bigger local array).""",
    "wmma_store_d": """wmma_store_d(arr, idx, ldm, acc, layout): store the float32 16x16
    accumulator tile to ``arr[idx]`` (shared or global float32 memory, 32-byte aligned),
    ``ldm`` elements between rows (``'row'``) or columns (``'col'``). Warp-wide.

    PTX: ``wmma.store.d.sync.aligned.{row|col}.m16n16k16.f32``; compute capability 7.0.""",
    "cp_async16": """cp_async16(dst, di, src, si): start copying 16 bytes from global
    ``src[si]`` to shared ``dst[di]`` without waiting (both 16-byte aligned). The copy belongs
    to the next ``cp_async_commit_group()``; read ``dst`` only after a
    ``cp_async_wait_group`` that covers it and a ``cuda.syncthreads()``.

    PTX: ``cp.async.cg.shared.global [dst], [src], 16;`` (``.cg``: cached in L2 only, skips
    L1); SASS ``LDGSTS.E.BYPASS.128``. Compute capability 8.0.""",
    "cp_async16_zfill": """cp_async16_zfill(dst, di, src, si, src_bytes): as
    :func:`cp_async16`, but reads only the first ``src_bytes`` (0 to 16) bytes of the source
    and writes zeros to the rest of the 16: the way to load the ragged edge of a tile (with
    ``src_bytes = 0`` nothing is read, so an out-of-range tile costs no access).

    PTX: ``cp.async.cg.shared.global [dst], [src], 16, src_bytes;``. Compute capability 8.0.""",
    "cp_async_ca": """cp_async_ca(dst, di, src, si, nbytes): start an asynchronous copy of
    ``nbytes`` (a constant: 4, 8 or 16) bytes, both addresses aligned to ``nbytes``: for
    operands whose rows are not 16-byte aligned.

    PTX: ``cp.async.ca.shared.global [dst], [src], nbytes;`` (``.ca``: cached in L1 too).
    Compute capability 8.0.""",
    "cp_async_commit_group": """cp_async_commit_group(): close the copies this thread issued
    since the last commit into one group.

    PTX: ``cp.async.commit_group;`` (SASS ``LDGDEPBAR``). Compute capability 8.0.""",
    "cp_async_wait_group": """cp_async_wait_group(N): wait until at most the ``N`` newest
    groups of this thread are still in flight (``N`` a compile-time constant; 0 waits for
    all). It waits for this thread's copies only: follow it with ``cuda.syncthreads()``
    before reading what other threads copied.

    PTX: ``cp.async.wait_group N;`` (SASS ``DEPBAR.LE SB0, N``). Compute capability 8.0.""",
    "bf16_to_f32": """bf16_to_f32(bits): the float32 value of bf16 raw bits (int16): the bits
    shifted into the high half of a float32 word. Exact.""",
    "f32_to_bf16": """f32_to_bf16(x): the bf16 raw bits (int16) of float32 ``x``, rounded to
    nearest even. PTX: ``cvt.rn.bf16.f32``; compute capability 8.0.""",
    "f32_to_f16": """f32_to_f16(x): float32 to float16, rounded to nearest even
    (``cvt.rn.f16.f32``).""",
    "f16_to_f32": """f16_to_f32(x): float16 to float32, exact (``cvt.f32.f16``).""",
}
for _name, _doc in _DOCS.items():
    _f = globals()[_name]
    try:
        _f.__doc__ = _doc
    except (AttributeError, TypeError):  # pragma: no cover
        pass
del _name, _doc, _f
