"""Launch plans: how ``gl.matmul``, ``gl.gemm`` and ``gl.prepare`` skip the launcher's
Python on a GPU.

A launcher is Python: it picks a configuration, sizes a grid, binds arguments (Triton
specialises them and finds the compiled kernel; numba dispatches on their types and turns
each tensor into a device array), and only then calls the driver. On a small product that
Python is the whole time of a call. Most of it depends only on the call's *kind*: the kernel,
and for each tensor its shape, strides, dtype, device and whether its address is 16-byte
aligned (Triton specialises pointers on it, TMA needs it), plus the epilogue's scalars. So:

1. the first call of a kind runs the launcher (it compiles, autotunes, fills caches);
2. the second runs it again while :class:`recording` captures the kernel launches it makes,
   at the lowest level Python sees (Triton's launcher object after binding; numba's driver
   launch with its final argument list), then replays them once into a NaN-filled output
   and keeps the :class:`Plan` only if the replay gives the launcher's result bit for bit;
3. every later call of that kind replays the plan with the new tensors' addresses put in
   place of the recorded ones: no launcher, no autotuner dispatch, no type dispatch.

A recording becomes a plan only if every address its launches take lies in one of the
call's tensors (its *roles*: a, b, out, ...), in a buffer a launcher keeps for good and
declared with :func:`keep` (split-K's workspace and counters), or in a buffer made from a
role's address and declared with :func:`derived` (a TMA descriptor in device memory: the
plan asks the launcher's cache for the new address's descriptor, built once per address). A
padded copy of an operand or another per-call buffer makes the kind a launcher kind for good:
those calls keep running the launcher, correct and as slow as before. Raw integers of 2**32 and more in a numba argument list are taken for
addresses (sizes and strides of the course's products stay far below).
"""
from __future__ import annotations

import copy
import numbers
import os

import torch

__all__ = ["keep", "forget", "derived", "recording", "Plan", "build", "tensor_key", "Cache", "LAUNCHER",
           "ENABLED"]

LAUNCHER = "launcher"     # a kind whose launches cannot be replayed: run the launcher
# GEMM_LESSONS_FASTPATH=0: gl.matmul and gl.gemm run the launcher on every call (to compare)
ENABLED = os.environ.get("GEMM_LESSONS_FASTPATH", "1") != "0"

# ------------------------------------------------------------------ buffers kept for good
_KEPT: dict = {}          # (lo, hi) address span -> the tensor (kept alive here)


def _span(t):
    """Bytes ``t`` can address: [data_ptr, data_ptr + extent)."""
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) if t.numel() else 0
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def keep(t):
    """Declare ``t`` a buffer its launcher keeps across calls (a workspace it reuses): a plan
    may take its address as a constant. Returns ``t``."""
    _KEPT[_span(t)] = t
    return t


_RETIRED: list = []       # kept buffers their launchers replaced: still alive (see forget)


def forget(t):
    """``t`` is no longer its launcher's buffer (it grew a larger one): plans that took its
    address are dropped on their next call and record the new one. ``t`` itself stays
    allocated: a CUDA graph captured with its address (``gl.prepare(..., graph=True)``)
    may still be replayed, and must not write into memory that something else now holds."""
    if t is not None:
        _KEPT.pop(_span(t), None)
        _RETIRED.append(t)


# ------------------------------------------------------------------ buffers made from a role
_DERIVED: dict = {}       # (lo, hi) span of a buffer -> (source's address, shape, strides, rebuild)
_DERIVED_LIMIT = 256


def derived(buf, source, rebuild):
    """Declare the device tensor ``buf`` a function of the tensor ``source`` alone (a TMA
    descriptor built on its address): ``rebuild(t)`` returns the buffer for a tensor ``t``
    of ``source``'s shape and strides (from the launcher's cache where it has one). A plan
    whose launch takes ``buf`` calls ``rebuild`` on the new call's tensor instead. Returns
    ``buf``."""
    if len(_DERIVED) >= _DERIVED_LIMIT:
        _DERIVED.pop(next(iter(_DERIVED)))
    _DERIVED[_span(buf)] = (source.data_ptr(), tuple(source.shape), source.stride(), rebuild)
    return buf


def _derived_at(addr):
    for span, what in _DERIVED.items():
        if span[0] <= addr < span[1]:
            return span, what
    return None


# ------------------------------------------------------------------ recording
class recording:
    """Within ``with recording() as rec:``, every kernel launch is also appended to
    ``rec.launches``: ``("triton", launcher, head, args)`` (head: grid, stream, function,
    metadata, hooks) or ``("numba", launch, stream, config, kernel, kernelargs)`` (numba's
    driver launch, or :func:`gemm_lessons.ptx_cluster.core_launch` of a cluster launch).
    ``rec.ok`` is False where a launch was not made as expected (then nothing is
    replayed)."""

    def __init__(self):
        self.launches = []
        self.ok = True
        self._undo = []

    def __enter__(self):
        launches = self.launches
        try:
            from triton.runtime import driver
            cls = driver.active.launcher_cls
            real_call = cls.__call__

            def call(launcher, *args, **kwargs):
                if kwargs or len(args) < 9:
                    self.ok = False
                else:
                    launches.append(("triton", launcher, args[:9], args[9:]))
                return real_call(launcher, *args, **kwargs)
            cls.__call__ = call
            self._undo.append(lambda: setattr(cls, "__call__", real_call))
        except (ImportError, AttributeError, RuntimeError):
            pass          # no Triton launcher here: a launch it made would go unrecorded,
        try:              # and the replay's check (see record_plan) refuses the plan
            from numba.cuda import dispatcher
            real_launch = dispatcher.launch

            def launch(stream, config, kernel, *kernelargs):
                launches.append(("numba", real_launch, stream, config, kernel, kernelargs))
                return real_launch(stream, config, kernel, *kernelargs)
            dispatcher.launch = launch
            self._undo.append(lambda: setattr(dispatcher, "launch", real_launch))
        except (ImportError, AttributeError):
            pass          # the simulator: no driver launch to record
        from . import ptx_cluster
        real_core = getattr(ptx_cluster, "core_launch", None)
        if real_core is not None:   # a cluster launch: numba's arguments, cuda.core's call

            def core_launch(stream, config, kernel, *kernelargs):
                launches.append(("numba", real_core, stream, config, kernel, kernelargs))
                return real_core(stream, config, kernel, *kernelargs)
            ptx_cluster.core_launch = core_launch
            self._undo.append(lambda: setattr(ptx_cluster, "core_launch", real_core))
        return self

    def __exit__(self, *exc):
        for undo in reversed(self._undo):
            undo()
        self._undo = []


# ------------------------------------------------------------------ plans
_POINTER_MIN = 2 ** 32


def _role_of(addr, spans):
    """(role index, byte offset) of the one role whose span holds ``addr``; None if none;
    False if several (aliased views: not replayable)."""
    found = [(i, addr - lo) for i, (lo, hi) in enumerate(spans) if lo <= addr < max(hi, lo + 1)]
    if not found:
        return None
    exact = [f for f in found if f[1] == 0]
    if len(found) > 1 and len(exact) != 1:
        return False
    return exact[0] if exact else found[0]


def _kept_span(addr):
    for span in _KEPT:
        if span[0] <= addr < span[1]:
            return span
    return None


class Plan:
    """Recorded launches, replayable on new tensors of the same kind: ``plan(*roles)``."""

    def __init__(self, steps, kept):
        self._steps = steps          # functions of the roles
        self._kept = kept            # spans of kept buffers the launches use

    def valid(self):
        """Whether every kept buffer the plan uses is still kept."""
        return all(span in _KEPT for span in self._kept)

    def __call__(self, *roles):
        for step in self._steps:
            step(roles)


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def cuda_stream(device=None):
    """The raw handle of torch's current CUDA stream on ``device`` (an index; default the
    current device): where a replayed launch goes (inside a graph capture, the capturing
    stream)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(torch.cuda.current_device() if device is None else device)
    return torch.cuda.current_stream(device).cuda_stream


def _triton_step(launcher, head, args, spans, kept):
    slots = []
    for i, x in enumerate(args):
        if x is None or isinstance(x, (str, bool)):
            continue
        if isinstance(x, numbers.Number):
            if isinstance(x, int) and x >= _POINTER_MIN:
                return None              # a raw address we cannot place
            continue
        if isinstance(x, torch.Tensor):
            where = _role_of(x.data_ptr(), spans)
            if where is None:
                span = _kept_span(x.data_ptr())
                if span is None:
                    return None
                kept.add(span)
                continue
            if where is False:
                return None
            slots.append((i, "ptr", where))
            continue
        base = getattr(x, "base", None)            # a host-side TMA TensorDescriptor
        if isinstance(base, torch.Tensor):
            where = _role_of(base.data_ptr(), spans)
            if where is None or where is False or where[1] != 0:
                return None
            slots.append((i, "desc", where[0]))
            continue
        if hasattr(x, "data_ptr") or hasattr(x, "__cuda_array_interface__"):
            return None                  # memory we cannot place
        continue                         # a constant: a dtype, a tuple of sizes, ...
    g0, g1, g2, _, function, packed = head[:6]
    template = list(args)
    device = next((x.device.index for x in args if isinstance(x, torch.Tensor)), None)

    def step(roles):
        call = template[:]
        for i, kind, where in slots:
            if kind == "ptr":        # the address itself: Triton takes an int as a pointer
                r, off = where
                call[i] = roles[r].data_ptr() + off
            else:
                d = copy.copy(template[i])
                d.base = roles[where]
                call[i] = d
        launcher(g0, g1, g2, cuda_stream(device), function, packed, None, None, None, *call)
    return step


def _numba_step(real_launch, config, kernel, kernelargs, spans, kept):
    from . import engines
    slots, made = [], []
    for i, x in enumerate(kernelargs):
        if type(x) is int and x >= _POINTER_MIN:
            where = _role_of(x, spans)
            if where is False:
                return None
            if where is None:
                span = _kept_span(x)
                if span is not None:
                    kept.add(span)
                    continue
                found = _derived_at(x)
                if found is None:
                    return None
                (lo, _), (src, shape, strides, rebuild) = found
                source = _role_of(src, spans)
                if not source:                     # made from no role, or from several
                    return None
                made.append((i, source, shape, strides, rebuild, x - lo))
                continue
            slots.append((i, where))
    template = list(kernelargs)
    streams = {}              # torch's raw stream handle -> numba's wrapper of it

    def step(roles):
        args = template[:]
        for i, (r, off) in slots:
            args[i] = roles[r].data_ptr() + off
        bufs = []             # referenced until the launch is queued
        for i, (r, off), shape, strides, rebuild, boff in made:
            t = roles[r]
            view = t.as_strided(shape, strides, t.storage_offset() + off // t.element_size())
            bufs.append(rebuild(view))
            args[i] = bufs[-1].data_ptr() + boff
        handle = cuda_stream()
        stream = streams.get(handle)
        if stream is None:
            if len(streams) > 16:
                streams.clear()
            stream = streams[handle] = engines.numba_stream()
        real_launch(stream, config, kernel, *args)
    return step


def build(launches, roles):
    """A :class:`Plan` of recorded ``launches`` over the tensors ``roles``, or None when a
    launch takes an address that lies in none of them nor in a kept buffer."""
    if not launches:
        return None
    spans = [_span(t) if isinstance(t, torch.Tensor) else (0, 0) for t in roles]
    kept, steps = set(), []
    for rec in launches:
        if rec[0] == "triton":
            _, launcher, head, args = rec
            step = _triton_step(launcher, head, args, spans, kept)
        else:
            _, real_launch, _stream, config, kernel, kernelargs = rec
            step = _numba_step(real_launch, config, kernel, kernelargs, spans, kept)
        if step is None:
            return None
        steps.append(step)
    return Plan(steps, frozenset(kept))


def record_plan(launch, roles, out):
    """Run ``launch()`` (it writes ``out``, one of ``roles``) while recording; return the
    plan if replaying it into a NaN-filled ``out`` gives the same bits, else None. Either
    way ``out`` holds the launcher's result when this returns."""
    with recording() as rec:
        launch()
    if not rec.ok:
        return None
    plan = build(rec.launches, roles)
    if plan is None:
        return None
    expect = out.clone()
    out.fill_(float("nan"))
    try:
        plan(*roles)
        same = torch.equal(out, expect)
    except Exception:                      # an internal API not as recorded
        same = False
    if not same:
        out.copy_(expect)
        return None
    return plan


# ------------------------------------------------------------------ the kinds of call
def tensor_key(t):
    """What a launcher may decide on, of one tensor (None: absent)."""
    if t is None:
        return None
    return (tuple(t.shape), t.stride(), t.dtype, t.device, t.data_ptr() % 16)


class Cache:
    """Per kind of call: the number of calls seen (first, second), then a :class:`Plan` or
    :data:`LAUNCHER`."""

    LIMIT = 4096

    def __init__(self):
        self._kinds = {}
        self.notes = {}       # per kind: what the caller keeps beside it (an output's shape)

    def clear(self):
        self._kinds.clear()
        self.notes.clear()

    def get(self, key):
        state = self._kinds.get(key)
        if isinstance(state, Plan) and not state.valid():
            del self._kinds[key]
            return None
        return state

    def run(self, key, launch, roles, out):
        """One call of kind ``key`` that was not replayed: the first runs ``launch()``, the
        second records it; returns nothing (``out`` holds the result)."""
        state = self._kinds.get(key)
        if state is None:
            if len(self._kinds) >= self.LIMIT:
                self.clear()
            launch()
            self._kinds[key] = 1
            return
        if state == 1:
            plan = record_plan(launch, roles, out)
            self._kinds[key] = plan if plan is not None else LAUNCHER
            return
        launch()


def aliasing(*tensors):
    """Which of ``tensors`` share an address: a plan recorded on ``a is b`` must not serve
    distinct operands."""
    ptrs = [None if t is None else t.data_ptr() for t in tensors]
    return tuple(ptrs.index(p) for p in ptrs)
