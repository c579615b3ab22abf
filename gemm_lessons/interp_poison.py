"""Triton interpreter instruments for the exercise checks: poisoned masked-off lanes, and
which program stored where.

On a GPU the lanes a masked ``tl.load`` skips hold whatever was in the registers: a load
without ``other=`` gives undefined values there, and a kernel that lets them reach a
``tl.dot`` is wrong. Triton's interpreter hands back zeros instead, which hides the bug.
:func:`poison_masked_loads` makes those lanes NaN (for floating-point loads), as undefined
as on the GPU, so a check sees the mistake::

    with interp_poison.poison_masked_loads():
        run(a, b, c)          # a load that needs other=0.0 now spreads NaN into C

:func:`record_stores` lists, per program of the grid, the element offsets it stored into a
given tensor (to check *which* tile a program computed, not only that every tile was
computed).

:func:`bounded_loads` catches the opposite mistake, a mask that lets a lane through whose
address lies outside every operand (a mask on the wrong offsets): the interpreter would read
whatever memory lies there, different from run to run; inside the block those lanes read
NaN instead, and are counted, so a check can name the mask every time.

All three wrap the interpreter's ``InterpreterBuilder.create_masked_load(ptrs, mask, other,
...)`` / ``create_masked_store(ptrs, value, mask, ...)`` (``triton.runtime.interpreter``;
run here with Triton 3.9, whose trailing arguments are the cache policy and volatility;
earlier 3.x releases pass cache modifier and eviction policy there, which the wrappers hand
on unchanged). Where the hook is missing (a Triton without it, or a GPU run), the context
managers do nothing and ``active`` is False: checks then still run, without this extra
scrutiny.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

__all__ = ["poison_masked_loads", "bounded_loads", "record_stores", "hook_available"]

_lock = threading.Lock()


def _builder_class():
    """The interpreter's builder class, or None (no interpreter, or no known hook)."""
    from . import engines
    if engines.on_gpu():
        return None
    try:
        from triton.runtime import interpreter
    except Exception:       # pragma: no cover - Triton missing or reorganised
        return None
    cls = getattr(interpreter, "InterpreterBuilder", None)
    if cls is None or not hasattr(cls, "create_masked_load") or not hasattr(cls, "create_masked_store"):
        return None
    return cls


def hook_available() -> bool:
    """Can the interpreter be instrumented here (Triton's interpreter, a known version)?"""
    return _builder_class() is not None


@contextlib.contextmanager
def _patched(cls, name, wrapper):
    """``cls.name`` replaced by ``wrapper(real)`` inside the block, restored after it."""
    real = getattr(cls, name)
    with _lock:
        setattr(cls, name, wrapper(real))
    try:
        yield
    finally:
        with _lock:
            setattr(cls, name, real)


class _Flag:
    def __init__(self, active):
        self.active = active
        self.poisoned = 0          # masked-off lanes handed back as NaN


@contextlib.contextmanager
def poison_masked_loads():
    """Inside the block, masked-off lanes of a floating-point ``tl.load(ptr, mask=...)``
    without ``other=`` come back as NaN. Yields an object with ``active`` (the hook is in
    place) and ``poisoned`` (how many lanes were poisoned)."""
    cls = _builder_class()
    flag = _Flag(cls is not None)
    if cls is None:
        yield flag
        return
    from triton.runtime import interpreter

    def wrap(real):
        def load(self, ptrs, mask, other, *rest):      # rest: cache policy, volatility...
            if other is None:
                dtype_tt = ptrs.get_element_ty()
                dtype_np = interpreter._get_np_dtype(dtype_tt)
                if np.issubdtype(dtype_np, np.floating):
                    m = np.asarray(mask.data, dtype=bool)
                    flag.poisoned += int(m.size - np.count_nonzero(m))
                    other = interpreter.TensorHandle(
                        np.full_like(ptrs.data, np.nan, dtype=dtype_np), dtype_tt)
            return real(self, ptrs, mask, other, *rest)
        return load

    with _patched(cls, "create_masked_load", wrap):
        yield flag


class _Bounds:
    def __init__(self, active):
        self.active = active
        self.ranges = []           # (first byte, end byte) of every tensor a load may read
        self.outside = 0           # lanes let through by the mask but outside every range

    def allow(self, *tensors):
        """Loads may read the storage of ``tensors`` (replaces the previous list)."""
        self.ranges = [(t.untyped_storage().data_ptr(),
                        t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
                       for t in tensors]


@contextlib.contextmanager
def bounded_loads():
    """Inside the block, lanes of a ``tl.load`` that the mask lets through (or that have no
    mask) but point outside every tensor given to ``allow()`` read NaN (0 for integer loads)
    instead of stray memory; ``outside`` counts them. Yields the :class:`_Bounds` object
    (``active`` False where the hook is missing)."""
    cls = _builder_class()
    bounds = _Bounds(cls is not None)
    if cls is None:
        yield bounds
        return
    from triton.runtime import interpreter

    def wrap(real):
        def load(self, ptrs, mask, other, *rest):
            if bounds.ranges:
                addrs = np.asarray(ptrs.data, dtype=np.uint64)
                dtype_tt = ptrs.get_element_ty()
                dtype_np = interpreter._get_np_dtype(dtype_tt)
                size = np.dtype(dtype_np).itemsize
                inside = np.zeros(addrs.shape, dtype=bool)
                for lo, hi in bounds.ranges:
                    inside |= (addrs >= lo) & (addrs + size <= hi)
                m = np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape)
                stray = m & ~inside
                if stray.any():
                    bounds.outside += int(np.count_nonzero(stray))
                    fill = np.nan if np.issubdtype(dtype_np, np.floating) else 0
                    base = (np.zeros(addrs.shape, dtype=dtype_np) if other is None else
                            np.broadcast_to(np.asarray(other.data, dtype=dtype_np), addrs.shape))
                    other = interpreter.TensorHandle(
                        np.where(stray, np.asarray(fill, dtype=dtype_np), base).astype(dtype_np),
                        dtype_tt)
                    mask = interpreter.TensorHandle(m & inside, mask.dtype)
            return real(self, ptrs, mask, other, *rest)
        return load

    with _patched(cls, "create_masked_load", wrap):
        yield bounds


class _Stores:
    def __init__(self, active):
        self.active = active
        self.by_program = {}       # (x, y, z) program id -> list of element offsets, in order

    def order(self):
        """Programs in launch order (x fastest), each with the offsets it stored."""
        return sorted(self.by_program.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0]))


@contextlib.contextmanager
def record_stores(tensor):
    """Record, per program, the element offsets (from ``tensor``'s first element, in
    elements) of every ``tl.store`` lane that writes into ``tensor``'s storage."""
    cls = _builder_class()
    rec = _Stores(cls is not None)
    if cls is None:
        yield rec
        return
    base = tensor.data_ptr()
    size = tensor.element_size()
    end = base + tensor.untyped_storage().nbytes()

    def wrap(real):
        def store(self, ptrs, value, mask, *rest):
            addrs = np.asarray(ptrs.data, dtype=np.uint64).ravel()
            m = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data)).ravel()
            hit = m & (addrs >= base) & (addrs < end)
            if hit.any():
                pid = tuple(int(v) for v in self.grid_idx)
                offs = ((addrs[hit] - base) // size).astype(np.int64).tolist()
                rec.by_program.setdefault(pid, []).extend(offs)
            return real(self, ptrs, value, mask, *rest)
        return store

    with _patched(cls, "create_masked_store", wrap):
        yield rec
