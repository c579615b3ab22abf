"""Plumbing shared by the intrinsic modules (:mod:`~gemm_lessons.ptx`,
:mod:`~gemm_lessons.ptx_hopper`, :mod:`~gemm_lessons.ptx_simt`): one copy each of

* the error type and the messages every intrinsic gives for misuse;
* on a GPU (and when compiling PTX): the typing checks and the LLVM code that turns a numba
  array and index into an address, and the building blocks of an inline-``asm`` call;
* in numba's simulator: the numpy array behind a simulated array, byte offsets, the
  alignment and bounds checks the hardware would fault on, and the hook through which the
  instruments hand kernels their own shared arrays (:func:`shared_arrays`).

A lesson never needs this module: it reads the instruction sections of the three public
modules. Which engine runs is read once, from :func:`gemm_lessons.common.simulated`.
"""
from __future__ import annotations

import contextlib
import sys
import threading

import numpy as np

from .common import simulated

SIMULATED = simulated()

#: The operand layouts WMMA takes.
LAYOUTS = ("row", "col")


class PTXUsageError(TypeError):
    """An intrinsic was called with arguments its PTX instruction cannot take."""


def msg_literal(fn, what, got):
    """The message for an argument PTX needs as a compile-time constant."""
    return (f"{fn}: {what} must be a compile-time constant (a literal such as 0 or 'row', "
            f"or a constant the kernel factory closes over); got {got}")


def set_doc(fn, doc):
    """Give an intrinsic (or its emulation) its docstring; numba's intrinsic objects take
    one like functions do."""
    try:
        fn.__doc__ = doc
    except (AttributeError, TypeError):  # pragma: no cover - an object without __doc__
        pass
    return fn


class WatchedArray:
    """A numpy array behind a hook: every element access calls ``self.access(idx, store)``
    first, everything else is the array's. The simulator's instruments (``counters.trace``,
    the exercises' barrier audit) hand these out in place of shared arrays."""

    def __init__(self, arr, name):
        self._arr, self._name = arr, name

    def access(self, idx, store):
        raise NotImplementedError

    def __getitem__(self, idx):
        self.access(idx, False)
        return self._arr[idx]

    def __setitem__(self, idx, val):
        self.access(idx, True)
        self._arr[idx] = val

    def __getattr__(self, name):
        return getattr(self._arr, name)

    def __len__(self):
        return len(self._arr)

    def __array__(self, *args, **kwargs):
        return np.asarray(self._arr, *args, **kwargs)


class RecordedArray(WatchedArray):
    """A shared-memory array that records each access in a ``counters.trace()`` (numpy
    semantics otherwise). Defined here so that the emulations see through it."""

    def __init__(self, arr, name, tr):
        super().__init__(arr, name)
        self._tr = tr

    def access(self, idx, store):
        self._tr.record("shared", self._name, "store" if store else "load", 0, self._arr, idx)

    def record_wide(self, op, idx, nbytes):
        """Record ONE ``nbytes``-wide access of this lane (``idx`` indexes the array viewed
        as items of ``nbytes``) and return the plain array."""
        wide = np.asarray(self._arr).view(np.dtype((np.void, nbytes)))
        self._tr.record("shared", self._name, op, 0, wide, idx)
        return self._arr


_ALLOC_LOCK = threading.Lock()


@contextlib.contextmanager
def shared_arrays(make):
    """Inside the block, ``cuda.shared.array(shape, dtype)`` in a simulated kernel returns
    ``make(shape, numpy dtype, frame)`` (``frame``: the declaring line's, for a name): one
    array per block and declaring source line, as the simulator keys them, made under a lock
    so that every thread of the block gets the same one. Dynamic shared memory (shape 0)
    stays the simulator's."""
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support
    real = kernelapi.FakeCUDAShared.array

    def array(self, shape, dtype, alignment=None):
        if shape == 0:
            return real(self, shape, dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with _ALLOC_LOCK:
            res = self._allocations.get(caller)
            if res is None:
                if isinstance(dtype, types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                res = self._allocations[caller] = make(shape, np.dtype(dtype), frame)
        return res

    kernelapi.FakeCUDAShared.array = array
    try:
        yield
    finally:
        kernelapi.FakeCUDAShared.array = real


def unwrap(arr):
    """The plain array behind a recorded one."""
    return arr._arr if isinstance(arr, RecordedArray) else arr


def record_wide_access(arr, op, idx, nbytes):
    """For an instruction that moves ``nbytes`` in one access (a float4 load or store):
    inside a ``counters.trace()``, record it as ONE ``nbytes``-wide access of this lane to
    the shared array ``arr`` (as the hardware sees it). Returns the plain array behind
    ``arr``, to be read or written without recording again."""
    return arr.record_wide(op, idx, nbytes) if isinstance(arr, RecordedArray) else arr


# ====================================================================== the GPU: LLVM code
if not SIMULATED:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda import extending as _extending
    from numba.cuda.extending import intrinsic  # noqa: F401  (re-exported for the modules)

    I8P = ir.IntType(8).as_pointer()
    I32 = ir.IntType(32)
    I64 = ir.IntType(64)
    F32 = ir.FloatType()

    def intrinsic_literal(func):
        """``@intrinsic`` whose literal arguments (layouts, counts) are typed as literals."""
        return _extending._intrinsic(target="cuda", prefer_literal=True)(func)

    def is_int(t):
        return isinstance(t, types.Integer)

    def check_index(fn, arrty, idxty, what):
        """``arrty`` is an array and ``idxty`` one integer per dimension."""
        if not isinstance(arrty, types.Array):
            raise PTXUsageError(f"{fn}: {what} must be an array, got {arrty}")
        if is_int(idxty):
            if arrty.ndim != 1:
                raise PTXUsageError(f"{fn}: {what} is {arrty.ndim}-D: give its index as a "
                                    f"tuple of {arrty.ndim} integers")
            return
        if isinstance(idxty, types.BaseTuple) and all(is_int(t) for t in idxty.types):
            if len(idxty.types) != arrty.ndim:
                raise PTXUsageError(f"{fn}: {what} is {arrty.ndim}-D but its index has "
                                    f"{len(idxty.types)} entries")
            return
        raise PTXUsageError(f"{fn}: the index into {what} must be an integer or a tuple of "
                            f"integers, got {idxty}")

    def literal_int(fn, what, t):
        """The value of a compile-time integer argument."""
        if not isinstance(t, types.IntegerLiteral):
            raise PTXUsageError(msg_literal(fn, what, f"a run-time value of type {t}"))
        return t.literal_value

    def literal_layout(fn, what, t):
        """'row' or 'col' from a string-literal argument."""
        if isinstance(t, types.StringLiteral) and t.literal_value in LAYOUTS:
            return t.literal_value
        if isinstance(t, types.StringLiteral):
            raise PTXUsageError(f"{fn}: {what} must be 'row' or 'col', got "
                                f"{t.literal_value!r}")
        raise PTXUsageError(msg_literal(fn, what, t))

    def half_kind(fn, dtype, what):
        """'f16' or 'bf16' from an array dtype (bf16 travels as int16/uint16 bits)."""
        if dtype == types.float16:
            return "f16"
        if dtype in (types.int16, types.uint16):
            return "bf16"
        raise PTXUsageError(f"{fn}: {what} must hold float16 (fp16) or int16 (the raw bits "
                            f"of bf16), got {dtype}")

    def check_fragment(fn, fty, kind, what):
        """A fragment is a 1-D contiguous local array in the dtype of its data."""
        if not isinstance(fty, types.Array) or fty.ndim != 1 or fty.layout != "C":
            raise PTXUsageError(f"{fn}: {what} must be a 1-D contiguous local array "
                                f"(cuda.local.array(FRAG_.., dtype)), got {fty}")
        want = {"f16": types.float16, "bf16": types.int16, "f32": types.float32}[kind]
        if fty.dtype != want and not (kind == "bf16" and fty.dtype == types.uint16):
            raise PTXUsageError(f"{fn}: {what} must have dtype {want} to match the data "
                                f"({kind}), got {fty.dtype}")

    def elem_ptr(context, builder, arrty, arr, idxty, idx):
        """Generic (64-bit) pointer to ``arr[idx]`` as i8*: numba's own indexing, with no
        negative-index wrap-around and no bounds check."""
        ary = context.make_array(arrty)(context, builder, value=arr)
        if isinstance(idxty, types.BaseTuple):
            vals = cgutils.unpack_tuple(builder, idx, len(idxty.types))
            tys = idxty.types
        else:
            vals, tys = [idx], [idxty]
        inds = [context.cast(builder, v, t, types.intp) for v, t in zip(vals, tys)]
        ptr = cgutils.get_item_pointer(context, builder, arrty, ary, inds, wraparound=False)
        return builder.bitcast(ptr, I8P)

    def data_ptr(context, builder, arrty, arr, elt):
        """Pointer to the first element of ``arr``, typed as ``elt*``."""
        ary = context.make_array(arrty)(context, builder, value=arr)
        return builder.bitcast(ary.data, elt.as_pointer())

    def as_i32(builder, val, ty):
        """An integer argument as the 32-bit register an instruction operand takes."""
        if ty.bitwidth > 32:
            return builder.trunc(val, I32)
        if ty.bitwidth < 32:
            return builder.sext(val, I32) if ty.signed else builder.zext(val, I32)
        return val

    def smem_u32(builder, p):
        """A generic pointer into shared memory as its 32-bit shared-window address. Done in
        LLVM (addrspacecast), not in the asm, so that NVVM folds it into the shared array's
        address and the PTX computes 32-bit offsets (no cvta per access)."""
        return builder.ptrtoint(builder.addrspacecast(p, ir.IntType(8).as_pointer(3)), I32)

    def gmem_u64(builder, p):
        """A generic pointer into global memory as a .global address."""
        return builder.ptrtoint(builder.addrspacecast(p, ir.IntType(8).as_pointer(1)), I64)

    def asm_call(builder, text, constraints, args=(), arg_types=(), result=ir.VoidType(),
                 side_effect=True):
        """Emit one inline-``asm`` block: ``text`` with ``$n`` operands, LLVM
        ``constraints`` (outputs first), and the call's result (a struct for several
        outputs)."""
        fnty = ir.FunctionType(result, list(arg_types))
        return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=side_effect),
                            list(args))

    def barrier_op(name, text):
        """An intrinsic with no operands that is one instruction and a memory clobber
        (commit_group, fences)."""
        @intrinsic_literal
        def op(typingctx):
            def codegen(context, builder, sig, args):
                asm_call(builder, text, "~{memory}")
            return types.void(), codegen
        op.__name__ = name
        return op


# ============================================================ the simulator: numpy checks
else:
    import ctypes

    try:
        from numpy.lib.array_utils import byte_bounds as _byte_bounds
    except ImportError:  # numpy < 2
        _byte_bounds = np.byte_bounds

    def is_int(x):
        return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

    def _fake_array_types():
        from numba.cuda.simulator.cudadrv.devicearray import (FakeCUDAArray,
                                                              FakeWithinKernelCUDAArray)
        return FakeCUDAArray, FakeWithinKernelCUDAArray

    def as_numpy(arr, fn, what):
        """The numpy array behind a simulator array (shared, local, global or traced)."""
        fake, within = _fake_array_types()
        if isinstance(arr, within):
            arr = arr.__dict__["_item"]
        if isinstance(arr, fake):
            return arr._ary
        arr = unwrap(arr)
        if isinstance(arr, np.ndarray):
            return arr
        raise PTXUsageError(f"{fn}: {what} must be an array, got {type(arr).__name__}")

    def is_global(arr):
        """True for a kernel argument (global memory), False for a shared or local array."""
        return isinstance(arr, _fake_array_types())

    def byte_offset(a, idx, fn, what):
        """Byte offset of ``a[idx]`` from ``a``'s first element; checks the index."""
        idx = (idx,) if is_int(idx) else tuple(idx)
        if not all(is_int(i) for i in idx):
            raise PTXUsageError(f"{fn}: the index into {what} must be integers, got {idx}")
        if len(idx) != a.ndim:
            raise PTXUsageError(f"{fn}: {what} is {a.ndim}-D but its index has {len(idx)} "
                                f"entries")
        for i, n in zip(idx, a.shape):
            if not 0 <= i < n:
                raise IndexError(f"{fn}: index {idx} is outside {what} of shape {a.shape}")
        return sum(int(i) * s for i, s in zip(idx, a.strides))

    def address(a):
        """The address of ``a``'s first element."""
        return a.__array_interface__["data"][0]

    def check_aligned(fn, what, where, align, offset):
        """Fault as the GPU would ("misaligned address") unless ``offset`` is a multiple of
        ``align`` bytes; ``where`` says what the offset is measured from."""
        if offset % align:
            raise PTXUsageError(f"{fn}: {what} must be {align}-byte aligned ({where} "
                                f"{offset:#x} is {offset % align} bytes past a multiple of "
                                f"{align})")

    def check_span(a, start, nbytes, fn, what):
        """``nbytes`` bytes from address ``start`` lie inside ``a``."""
        lo, hi = _byte_bounds(a)
        if start < lo or start + nbytes > hi:
            raise IndexError(f"{fn}: {nbytes} bytes at {what}[...] run past the end of the "
                             f"array (the GPU would read or write memory it does not own)")

    def layout(fn, what, lay):
        """'row' or 'col', given as a constant."""
        if not isinstance(lay, str):
            raise PTXUsageError(msg_literal(fn, what, repr(lay)))
        if lay not in LAYOUTS:
            raise PTXUsageError(f"{fn}: {what} must be 'row' or 'col', got {lay!r}")
        return lay

    def half_kind(fn, dtype, what):
        """'f16' or 'bf16' from a numpy dtype (bf16 travels as int16/uint16 bits)."""
        if dtype == np.float16:
            return "f16"
        if dtype in (np.int16, np.uint16):
            return "bf16"
        raise PTXUsageError(f"{fn}: {what} must hold float16 (fp16) or int16 (the raw bits "
                            f"of bf16), got {dtype}")

    def halves_to_f32(x):
        """fp16 values, or bf16 bits (int16), as float32."""
        x = np.asarray(x)
        if x.dtype == np.float16:
            return x.astype(np.float32)
        return (x.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)

    def raw_view(start, nbytes, dtype, shape, strides, writeable=True):
        """A numpy view of ``nbytes`` bytes of memory at address ``start``."""
        buf = np.frombuffer((ctypes.c_char * nbytes).from_address(start), dtype=dtype)
        return np.lib.stride_tricks.as_strided(buf, shape=shape, strides=strides,
                                               writeable=writeable)

    def memmove(dst, src, nbytes):
        ctypes.memmove(dst, src, nbytes)

    def memset(dst, value, nbytes):
        ctypes.memset(dst, value, nbytes)
