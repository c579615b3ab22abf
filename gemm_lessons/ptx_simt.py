"""128-bit (float4) loads and stores for numba's fp32 SIMT kernels (lesson 04).

CUDA C++ writes ``float4 v = reinterpret_cast<const float4*>(p)[i]`` and gets one 128-bit
instruction (``ld.global.v4.f32``, ``ld.shared.v4.f32``). numba has no float4 type, and its
compiler does not merge four neighbouring ``float32`` loads into one: it cannot prove that
the address is 16-byte aligned (check: ``python -m gemm_lessons ptx k04_2d_tiling`` shows
only scalar ``ld.shared.f32``). So this module adds four functions that a kernel calls like
any other, each compiled to exactly one vector instruction:

=============================== ================================ ==========================
call (in a ``@cuda.jit`` kernel) what it does                      PTX instruction
=============================== ================================ ==========================
``v = ld_global_v4(A, r, c)``   ``(A[r,c], A[r,c+1], A[r,c+2],   ``ld.global.nc.v4.f32``
                                A[r,c+3])`` from global memory
``v = ld_shared_v4(sA, r, c)``  the same from a shared array      ``ld.shared.v4.f32``
``st_shared_v4(sB, r, c, v)``   ``sB[r, c:c+4] = v``              ``st.shared.v4.f32``
``st_global_v4(C, r, c, v)``    ``C[r, c:c+4] = v``               ``st.global.v4.f32``
=============================== ================================ ==========================

``v`` is a tuple of four float32 (unpack it: ``a0, a1, a2, a3 = ld_shared_v4(...)``).

Rules the caller keeps (the hardware faults otherwise, "misaligned address"):

* ``arr`` is a 2-D float32 array whose rows are contiguous (unit column stride);
* ``arr[r, c]`` is 16-byte aligned: ``c`` is a multiple of 4, the row stride is a multiple
  of 4 elements and the array starts on a 16-byte boundary. Shared arrays get that from
  ``cuda.shared.array(shape, float32, alignment=SMEM_ALIGN)``; global operands from the
  launcher (lesson 04's launcher copies an operand that is not aligned);
* ``ld_global_v4`` reads through the read-only (non-coherent) cache: only for arrays the
  kernel does not write.

How: each function is a numba ``@intrinsic`` that computes the element's address as
numba's own indexing does (no negative-index wrap-around, no bounds check), casts it to a
pointer to ``<4 x float>`` in the right address space (1 = global, 3 = shared) and emits
one LLVM vector load or store with ``align 16``. LLVM turns that into the PTX above. A plain
LLVM instruction, unlike an inline-``asm`` block, leaves the compiler free to schedule and
combine it (``ld.shared.v4.f32 [%r+512]`` uses the address offset for free).

In numba's CUDA simulator (no GPU) the same names are plain Python functions with the same
meaning, element by element (under ``counters.trace()`` a shared float4 access is recorded
as one 16-byte access per lane, as the hardware sees it), and they check the alignment rules (a misaligned float4
stops the simulation with the GPU's error name).

A fifth function writes 16-bit outputs (lesson 06's epilogue): ``st_global_v8(C, r, c, v)``
stores ``v``, a tuple of eight values of ``C``'s type (``float16``, or ``int16`` holding
bf16's bits, as ``ptx.f32_to_f16`` and ``ptx.f32_to_bf16`` return them), to
``C[r, c:c+8]`` in one ``st.global.v4.u32`` (the pairs packed into four 32-bit words,
``<4 x i32>`` in LLVM). The rules are the same with 8 for 4: a 2-D 16-bit array with
contiguous rows, ``c`` a multiple of 8, 16-byte aligned rows and start.
"""
from __future__ import annotations

from . import _ptx_plumbing as pl

__all__ = ["ld_global_v4", "ld_shared_v4", "st_shared_v4", "st_global_v4", "st_global_v8",
           "FLOAT4_SMEM_ALIGN",
           "SMEM_ALIGN", "SIMULATED", "launch_bounds"]

SIMULATED = pl.SIMULATED

#: ``alignment=`` for shared arrays read or written as float4: 16 bytes on the GPU; the
#: simulator refuses the keyword (its numpy arrays are 16-byte aligned anyway), so None there.
FLOAT4_SMEM_ALIGN = None if SIMULATED else 16
#: The name lesson 04 imports (the same value as :data:`FLOAT4_SMEM_ALIGN`).
SMEM_ALIGN = FLOAT4_SMEM_ALIGN


def launch_bounds(threads, min_blocks=1):
    """``cuda.jit`` keywords promising at most ``threads`` threads per block and asking for
    ``min_blocks`` blocks per SM, so ptxas keeps registers within
    65536 / (threads * min_blocks) per thread (a 1024-thread block needs <= 64, or it does
    not launch). Use: ``@cuda.jit(**launch_bounds(1024))``. Empty in the simulator."""
    return {} if SIMULATED else {"launch_bounds": (threads, min_blocks)}


if SIMULATED:
    # ------------------------------------------------------------------ simulator: Python
    from ._ptx_plumbing import record_wide_access

    def _check_aligned(fn, arr, r, c, itemsize=4):
        """Raise as the GPU would ('misaligned address') unless arr[r, c] starts 16 bytes
        aligned in a row with unit column stride."""
        ary = pl.as_numpy(arr, fn, "the array")
        if ary.ndim != 2 or ary.dtype.itemsize != itemsize:
            raise TypeError(f"{fn} takes a 2-D array of {itemsize}-byte elements, got "
                            f"{ary.ndim}-D {ary.dtype}")
        lanes = 16 // itemsize
        addr = pl.address(ary) + r * ary.strides[0] + c * ary.strides[1]
        if ary.strides[1] != itemsize or addr % 16 or c % lanes:
            raise IndexError(
                f"{fn}: misaligned address: element [{r}, {c}] of a {ary.shape} array with "
                f"strides {ary.strides} is not the start of 16 aligned bytes (the column "
                f"must be a multiple of {lanes}, the row stride a multiple of 16 bytes, the "
                "array 16-byte aligned)")

    def ld_global_v4(arr, r, c):
        """(arr[r, c], arr[r, c+1], arr[r, c+2], arr[r, c+3]): one 128-bit global load."""
        _check_aligned("ld_global_v4", arr, r, c)
        return (arr[r, c], arr[r, c + 1], arr[r, c + 2], arr[r, c + 3])

    def ld_shared_v4(arr, r, c):
        """(arr[r, c], ..., arr[r, c+3]): one 128-bit shared-memory load."""
        _check_aligned("ld_shared_v4", arr, r, c)
        arr = record_wide_access(arr, "load", (r, c // 4), 16)
        return (arr[r, c], arr[r, c + 1], arr[r, c + 2], arr[r, c + 3])

    def st_shared_v4(arr, r, c, v):
        """arr[r, c:c+4] = v: one 128-bit shared-memory store."""
        _check_aligned("st_shared_v4", arr, r, c)
        arr = record_wide_access(arr, "store", (r, c // 4), 16)
        arr[r, c] = v[0]
        arr[r, c + 1] = v[1]
        arr[r, c + 2] = v[2]
        arr[r, c + 3] = v[3]

    def st_global_v4(arr, r, c, v):
        """arr[r, c:c+4] = v: one 128-bit global store."""
        _check_aligned("st_global_v4", arr, r, c)
        arr[r, c] = v[0]
        arr[r, c + 1] = v[1]
        arr[r, c + 2] = v[2]
        arr[r, c + 3] = v[3]

    def st_global_v8(arr, r, c, v):
        """arr[r, c:c+8] = v, eight 16-bit values: one 128-bit global store."""
        _check_aligned("st_global_v8", arr, r, c, itemsize=2)
        if len(v) != 8:
            raise TypeError(f"st_global_v8 stores a tuple of 8 values, got {len(v)}")
        for k in range(8):
            arr[r, c + k] = v[k]

else:
    # ------------------------------------------------------------------ GPU: LLVM vector ops
    from llvmlite import ir
    from numba import types
    from numba.core.errors import TypingError
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    _F4 = types.UniTuple(types.float32, 4)
    _VEC = ir.VectorType(ir.FloatType(), 4)
    _GLOBAL, _SHARED = 1, 3          # NVPTX address spaces

    def _check_types(fn, arr, r, c):
        if not (isinstance(arr, types.Array) and arr.dtype == types.float32 and arr.ndim == 2):
            raise TypingError(f"{fn} takes a 2-D float32 array, got {arr}")
        if not (isinstance(r, types.Integer) and isinstance(c, types.Integer)):
            raise TypingError(f"{fn} takes integer indices, got {r} and {c}")

    def _vec_ptr(context, builder, sig, args, addrspace):
        """<4 x float> addrspace(N)* to arr[r, c] (numba's indexing, no wrap-around)."""
        aryty, rty, cty = sig.args[:3]
        ary = context.make_array(aryty)(context, builder, value=args[0])
        inds = [context.cast(builder, args[1], rty, types.intp),
                context.cast(builder, args[2], cty, types.intp)]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, inds, wraparound=False)
        return builder.addrspacecast(builder.bitcast(ptr, _VEC.as_pointer()),
                                     _VEC.as_pointer(addrspace))

    def _unpack(context, builder, vec):
        i32 = ir.IntType(32)
        vals = [builder.extract_element(vec, i32(k)) for k in range(4)]
        return context.make_tuple(builder, _F4, vals)

    def _pack(builder, tup):
        vec = ir.Constant(_VEC, ir.Undefined)
        i32 = ir.IntType(32)
        for k in range(4):
            vec = builder.insert_element(vec, builder.extract_value(tup, k), i32(k))
        return vec

    @intrinsic
    def ld_global_v4(typingctx, arr, r, c):
        """(arr[r, c], ..., arr[r, c+3]) in one ``ld.global.nc.v4.f32``."""
        _check_types("ld_global_v4", arr, r, c)

        def codegen(context, builder, sig, args):
            ptr = _vec_ptr(context, builder, sig, args, _GLOBAL)
            ld = builder.load(ptr, align=16)
            # read-only for the kernel's lifetime: lets LLVM use the non-coherent path
            ld.set_metadata("invariant.load", builder.module.add_metadata([]))
            return _unpack(context, builder, ld)
        return _F4(arr, r, c), codegen

    @intrinsic
    def ld_shared_v4(typingctx, arr, r, c):
        """(arr[r, c], ..., arr[r, c+3]) in one ``ld.shared.v4.f32``."""
        _check_types("ld_shared_v4", arr, r, c)

        def codegen(context, builder, sig, args):
            ptr = _vec_ptr(context, builder, sig, args, _SHARED)
            return _unpack(context, builder, builder.load(ptr, align=16))
        return _F4(arr, r, c), codegen

    def _store(fn, addrspace):
        @intrinsic
        def store(typingctx, arr, r, c, v):
            _check_types(fn, arr, r, c)
            if not (isinstance(v, types.BaseTuple) and len(v) == 4):
                raise TypingError(f"{fn} stores a tuple of 4 float32, got {v}")

            def codegen(context, builder, sig, args):
                vals = [context.cast(builder, builder.extract_value(args[3], k), t,
                                     types.float32) for k, t in enumerate(sig.args[3])]
                tup = context.make_tuple(builder, _F4, vals)
                ptr = _vec_ptr(context, builder, sig, args, addrspace)
                builder.store(_pack(builder, tup), ptr, align=16)
                return context.get_dummy_value()
            return types.void(arr, r, c, v), codegen
        store.__doc__ = f"arr[r, c:c+4] = v in one st.{'global' if addrspace == 1 else 'shared'}.v4.f32"
        return store

    st_shared_v4 = _store("st_shared_v4", _SHARED)
    st_global_v4 = _store("st_global_v4", _GLOBAL)

    _V8 = ir.VectorType(ir.IntType(32), 4)          # 8 x 16 bits, as four 32-bit words

    @intrinsic
    def st_global_v8(typingctx, arr, r, c, v):
        """arr[r, c:c+8] = v (eight 16-bit values) in one ``st.global.v4.u32``."""
        if not (isinstance(arr, types.Array) and arr.ndim == 2
                and arr.dtype in (types.float16, types.int16)):
            raise TypingError(f"st_global_v8 takes a 2-D float16 or int16 array, got {arr}")
        if not (isinstance(r, types.Integer) and isinstance(c, types.Integer)):
            raise TypingError(f"st_global_v8 takes integer indices, got {r} and {c}")
        if not (isinstance(v, types.BaseTuple) and len(v) == 8
                and all(t == arr.dtype for t in v)):
            raise TypingError(f"st_global_v8 stores a tuple of 8 {arr.dtype} (the array's "
                              f"type), got {v}")

        def codegen(context, builder, sig, args):
            aryty, rty, cty = sig.args[:3]
            ary = context.make_array(aryty)(context, builder, value=args[0])
            inds = [context.cast(builder, args[1], rty, types.intp),
                    context.cast(builder, args[2], cty, types.intp)]
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, inds,
                                           wraparound=False)
            ptr = builder.addrspacecast(builder.bitcast(ptr, _V8.as_pointer()),
                                        _V8.as_pointer(_GLOBAL))
            # pairs of 16-bit values packed into four 32-bit words (a vector of eight i16
            # would become two 8-byte stores): v[2k] in the low half, as in memory
            i16, i32 = ir.IntType(16), ir.IntType(32)
            vec = ir.Constant(_V8, ir.Undefined)
            for k in range(4):
                lo, hi = (builder.zext(builder.bitcast(builder.extract_value(args[3], 2 * k + j),
                                                       i16), i32) for j in range(2))
                word = builder.or_(lo, builder.shl(hi, i32(16)))
                vec = builder.insert_element(vec, word, i32(k))
            builder.store(vec, ptr, align=16)
            return context.get_dummy_value()
        return types.void(arr, r, c, v), codegen
