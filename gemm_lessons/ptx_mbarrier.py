"""Hopper's transaction barriers (``mbarrier``) from numba: inline-PTX intrinsics and their
emulation (the companion of :mod:`gemm_lessons.ptx_hopper`, which has wgmma).

``cuda.syncthreads()`` stops *every* thread of the block until all have arrived. A
warp-specialized kernel cannot use it in its main loop: a producer warp issues copies while
consumer warps multiply, and neither may wait for the other more than the data requires.
An **mbarrier** is a 64-bit object in shared memory that counts two things for its current
*phase*:

* the **pending arrivals**: set to the barrier's *expected count* at the start of each
  phase; every ``mbarrier_arrive`` takes one off;
* the **transaction count** (tx-count, bytes): ``mbarrier_arrive_expect_tx(bar, i, n)``
  adds ``n`` bytes still to come (then arrives); each asynchronous copy that completes on
  the barrier (a TMA copy, :mod:`gemm_lessons.ptx_tma`) takes its bytes off.

When both reach zero the phase **completes**: the barrier flips to the next phase (whose
parity, 0 or 1, is the other one) and resets its pending arrivals. A thread waits with
``mbarrier_try_wait_parity(bar, i, parity)``: true once the phase of that parity has
completed, i.e. once the barrier's current phase has the *other* parity. A ring of S stages
therefore waits on stage ``s`` in round ``r`` with parity ``r & 1``; a freshly initialized
barrier is in phase 0, so a wait with parity 1 passes at once (the "phase before the
first", which counts as complete).

``mbarrier_init`` by one thread, then ``fence_mbarrier_init()`` and a ``cuda.syncthreads()``
before any other thread uses the barrier. Barriers live in a ``cuda.shared.array(n, int64)``
(one element each, 8-byte aligned).

In numba's CUDA simulator the same names are Python, with the PTX ISA's semantics (pending
count, tx-count, phase) kept per barrier. A thread that waits on an incomplete phase
*blocks*; the simulator's scheduler (:mod:`gemm_lessons.sim_scheduler`) sees when every
live thread of the block is blocked on an mbarrier or a ``syncthreads`` with nothing left
that could complete a phase (no copy in flight), and raises :class:`MbarrierDeadlock` naming
each barrier waited on (its array and index, which is the stage of a ring), the phase and
parity, and what the phase still lacks (arrivals, bytes). A copy that delivers more bytes
than the phase expects raises :class:`MbarrierTxError`. A wrong parity, a missing arrive or a
wrong byte count therefore fails within seconds on a laptop instead of hanging a GPU.

Also here: :func:`named_barrier_sync` (``bar.sync id, n``: a barrier for part of the block,
emulated with the same phase rules and deadlock detection), and :func:`record`, which notes
every barrier operation the simulator runs (the lesson's phase timeline).

The simulator runs the threads of a warp independently, where a GPU runs them together:
a kernel in which one lane arrives for its whole warp after a warp-wide wait is right on a
GPU and may not be here. Let every thread that read a stage arrive (``mbarrier_init`` with
that many arrivals): on a GPU that is still one instruction per warp.
"""
from __future__ import annotations

import contextlib
import sys
import threading

from . import _ptx_plumbing as pl
from ._ptx_plumbing import PTXUsageError, set_doc

__all__ = ["SIMULATED", "MIN_CC", "INSTRUCTIONS", "MbarrierDeadlock", "MbarrierTxError",
           "mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx",
           "mbarrier_try_wait_parity", "mbarrier_wait", "fence_mbarrier_init",
           "named_barrier_sync", "TX_LIMIT", "record"]

SIMULATED = pl.SIMULATED

#: mbarrier with expected transactions and try_wait need compute capability 9.0
#: (init/arrive alone exist from 8.0; this module is for Hopper's producer/consumer ring).
MIN_CC = {"mbarrier": (9, 0)}

#: The tx-count of a phase must stay within +-(2**20 - 1) bytes (PTX ISA).
TX_LIMIT = (1 << 20) - 1
#: The expected arrival count of a barrier: 1 to 2**20 - 1.
COUNT_LIMIT = (1 << 20) - 1

#: name: (PTX, minimum compute capability, SASS): the SASS as ptxas writes it for sm_90a
#: (``compiled.sass`` of ``k06_producer_consumer``'s PTX)
INSTRUCTIONS = {
    "mbarrier_init": ("mbarrier.init.shared::cta.b64 [bar], count", (8, 0), "SYNCS.EXCH.64"),
    "mbarrier_arrive": ("mbarrier.arrive.shared::cta.b64 state, [bar]", (8, 0),
                        "SYNCS.ARRIVE.TRANS64.A1T0"),
    "mbarrier_arrive_expect_tx": ("mbarrier.arrive.expect_tx.shared::cta.b64 state, [bar], tx",
                                  (9, 0), "SYNCS.ARRIVE.TRANS64 (the byte count in a register)"),
    "mbarrier_try_wait_parity": ("mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity",
                                 (9, 0), "SYNCS.PHASECHK.TRANS64.TRYWAIT"),
    "fence_mbarrier_init": ("fence.mbarrier_init.release.cluster", (9, 0), "FENCE.VIEW.ASYNC.S"),
    "named_barrier_sync": ("bar.sync id, nthreads", (7, 0), "BAR.SYNC.DEFER_BLOCKING"),
}


class MbarrierDeadlock(RuntimeError):
    """Every live thread of a block waits on an mbarrier or a syncthreads, and nothing in
    flight can complete any of those phases (simulator only)."""


class MbarrierTxError(RuntimeError):
    """A phase received more transaction bytes than were expected (simulator only)."""


def _check_count(fn, what, v, lo, hi):
    if pl.is_int(v) and not lo <= v <= hi:
        raise PTXUsageError(f"{fn}: {what} must be from {lo} to {hi}, got {v}")


# ====================================================================== the GPU: intrinsics
if not SIMULATED:
    from llvmlite import ir
    from numba import cuda
    from numba.cuda import types

    from ._ptx_plumbing import I32, intrinsic

    def _check_bar(fn, bars, idx):
        pl.check_index(fn, bars, idx, "the barrier array")
        if bars.dtype not in (types.int64, types.uint64):
            raise PTXUsageError(f"{fn}: barriers live in a shared int64 (or uint64) array, "
                                f"got {bars.dtype}")

    def _bar_addr(context, builder, sig, args):
        return pl.smem_u32(builder, pl.elem_ptr(context, builder, sig.args[0], args[0],
                                                sig.args[1], args[1]))

    @intrinsic
    def mbarrier_init(typingctx, bars, idx, count):
        _check_bar("mbarrier_init", bars, idx)
        if not pl.is_int(count):
            raise PTXUsageError(f"mbarrier_init: count must be an integer, got {count}")

        def codegen(context, builder, sig, args):
            pl.asm_call(builder, "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}",
                        [_bar_addr(context, builder, sig, args),
                         pl.as_i32(builder, args[2], sig.args[2])], [I32, I32])
        return types.void(bars, idx, count), codegen

    @intrinsic
    def mbarrier_arrive(typingctx, bars, idx):
        _check_bar("mbarrier_arrive", bars, idx)

        def codegen(context, builder, sig, args):
            # the returned state (the phase arrived on) is not needed: a scoped register
            pl.asm_call(builder, "{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [$0]; }",
                        "r,~{memory}", [_bar_addr(context, builder, sig, args)], [I32])
        return types.void(bars, idx), codegen

    @intrinsic
    def mbarrier_arrive_expect_tx(typingctx, bars, idx, nbytes):
        _check_bar("mbarrier_arrive_expect_tx", bars, idx)
        if not pl.is_int(nbytes):
            raise PTXUsageError(f"mbarrier_arrive_expect_tx: nbytes must be an integer, "
                                f"got {nbytes}")

        def codegen(context, builder, sig, args):
            pl.asm_call(builder, "{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 "
                        "st, [$0], $1; }", "r,r,~{memory}",
                        [_bar_addr(context, builder, sig, args),
                         pl.as_i32(builder, args[2], sig.args[2])], [I32, I32])
        return types.void(bars, idx, nbytes), codegen

    @intrinsic
    def mbarrier_try_wait_parity(typingctx, bars, idx, parity):
        _check_bar("mbarrier_try_wait_parity", bars, idx)
        if not pl.is_int(parity):
            raise PTXUsageError(f"mbarrier_try_wait_parity: parity must be an integer (0 "
                                f"or 1), got {parity}")

        def codegen(context, builder, sig, args):
            par = builder.and_(pl.as_i32(builder, args[2], sig.args[2]), ir.Constant(I32, 1))
            done = pl.asm_call(
                builder, "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; "
                "selp.u32 $0, 1, 0, p; }", "=r,r,r,~{memory}",
                [_bar_addr(context, builder, sig, args), par], [I32, I32], I32)
            return builder.icmp_unsigned("!=", done, ir.Constant(I32, 0))
        return types.boolean(bars, idx, parity), codegen

    fence_mbarrier_init = pl.barrier_op("fence_mbarrier_init",
                                        "fence.mbarrier_init.release.cluster;")

    @intrinsic
    def named_barrier_sync(typingctx, bar_id, nthreads):
        if not (pl.is_int(bar_id) and pl.is_int(nthreads)):
            raise PTXUsageError(f"named_barrier_sync: the barrier id and the thread count "
                                f"must be integers, got {bar_id}, {nthreads}")

        def codegen(context, builder, sig, args):
            pl.asm_call(builder, "bar.sync $0, $1;", "r,r,~{memory}",
                        [pl.as_i32(builder, args[0], sig.args[0]),
                         pl.as_i32(builder, args[1], sig.args[1])], [I32, I32])
        return types.void(bar_id, nthreads), codegen

    @cuda.jit(device=True, inline="always")
    def mbarrier_wait(bars, idx, parity):
        while not mbarrier_try_wait_parity(bars, idx, parity):
            pass



# ================================================================ the simulator: emulation
else:
    _lock = threading.Condition()
    _NOT_STAGES = ("turn[",)     # barrier arrays that are not a ring's stages (k06_pingpong)
    _bars = {}           # address -> _Barrier (this block's barriers)
    _stall_hooks = []    # functions that may make progress when every thread waits
    _trace = []          # the events of record(), while one records
    _recording = [False]

    def note(op, b, phase, thread=None, **extra):
        """Record one event (while :func:`record` runs); returns its index, or None. The
        caller holds the lock."""
        if not _recording[0]:
            return None
        if thread is None:
            thread = int(getattr(threading.current_thread(), "thread_id", -1))
        _trace.append(dict(seq=len(_trace), thread=thread, op=op, barrier=b.name,
                           kind=b.kind, phase=phase, **extra))
        return len(_trace) - 1

    class _Barrier:
        """The state the PTX ISA gives an mbarrier, and a name for messages."""
        __slots__ = ("name", "count", "pending", "tx", "phase", "token", "kind")
        made = 0

        def __init__(self, name, count, kind="mbarrier"):
            self.name, self.count, self.kind = name, count, kind
            _Barrier.made += 1
            self.token = _Barrier.made        # written into the barrier's word
            self.pending, self.tx, self.phase = count, 0, 0

        def lacks(self):
            return (f"{self.pending} of {self.count} arrivals pending, "
                    f"{self.tx} transaction bytes outstanding")

        def where(self):
            ring = self.name.endswith("]") and not self.name.startswith(_NOT_STAGES)
            return f"{self.kind} {self.name} (stage {self.name.rsplit('[', 1)[-1][:-1]})" \
                if ring else f"{self.kind} {self.name}"

    def _name_of(arr, idx):
        """'full[2]': the name the kernel gives the barrier array (read from the calling
        frames' locals), and the index."""
        frame = sys._getframe(2)
        for _ in range(8):
            if frame is None:
                break
            for k, v in frame.f_locals.items():
                if v is arr and not k.startswith("_"):
                    return f"{k}[{idx}]"
            frame = frame.f_back
        return f"barrier[{idx}]"

    def _addr(fn, bars, idx):
        a = pl.as_numpy(bars, fn, "the barrier array")
        if pl.is_global(bars):
            raise PTXUsageError(f"{fn}: barriers live in shared memory "
                                f"(cuda.shared.array(n, int64))")
        if a.dtype.itemsize != 8 or a.dtype.kind not in "iu":
            raise PTXUsageError(f"{fn}: barriers live in a shared int64 (or uint64) array, "
                                f"got {a.dtype}")
        return a, pl.address(a) + pl.byte_offset(a, idx, fn, "the barrier array")

    def _get(fn, bars, idx):
        a, addr = _addr(fn, bars, idx)
        b = _bars.get(addr)
        if b is None or int(a[idx]) != b.token:       # another array now at that address
            raise PTXUsageError(f"{fn}: {_name_of(a, idx)} was never initialized "
                                f"(mbarrier_init, fence_mbarrier_init, then syncthreads)")
        return b

    def _complete_if_done(b):
        """Flip the phase when arrivals and bytes are both done (the lock is held)."""
        if b.pending == 0 and b.tx < 0:
            raise MbarrierTxError(
                f"{b.where()}, phase {b.phase} (parity {b.phase & 1}): the copies delivered "
                f"{-b.tx} bytes more than mbarrier_arrive_expect_tx announced")
        if b.pending == 0 and b.tx == 0:
            b.phase += 1
            b.pending, b.tx = b.count, 0
            _lock.notify_all()

    def _land_some():
        """A landing point for copies in flight (TMA); they may complete phases."""
        for hook in _stall_hooks:
            hook(False)

    def mbarrier_init(bars, idx, count):
        fn = "mbarrier_init"
        if not pl.is_int(count):
            raise PTXUsageError(f"{fn}: count must be an integer, got {count!r}")
        _check_count(fn, "count (expected arrivals per phase)", count, 1, COUNT_LIMIT)
        a, addr = _addr(fn, bars, idx)
        with _lock:
            b = _bars[addr] = _Barrier(_name_of(a, idx), int(count))
            a[idx] = b.token

    def _one_more_arrival(fn, b):
        # every arrival of the phase is in, its bytes are still to come: one more is a bug
        if b.pending == 0:
            raise MbarrierTxError(f"{b.where()}, phase {b.phase}: {fn} with no arrival "
                                  "pending (more arrivals than the count given to "
                                  "mbarrier_init)")

    def mbarrier_arrive(bars, idx):
        b = _get("mbarrier_arrive", bars, idx)
        with _lock:
            _one_more_arrival("mbarrier_arrive", b)
            note("arrive", b, b.phase)
            b.pending -= 1
            _complete_if_done(b)
        _land_some()

    def mbarrier_arrive_expect_tx(bars, idx, nbytes):
        fn = "mbarrier_arrive_expect_tx"
        if not pl.is_int(nbytes):
            raise PTXUsageError(f"{fn}: nbytes must be an integer, got {nbytes!r}")
        _check_count(fn, "nbytes", nbytes, 0, TX_LIMIT)
        b = _get(fn, bars, idx)
        with _lock:
            _one_more_arrival(fn, b)
            note("expect_tx", b, b.phase, nbytes=int(nbytes))
            b.tx += int(nbytes)
            b.pending -= 1
            _complete_if_done(b)
        _land_some()

    def complete_tx(bars, idx, nbytes, origin=None):
        """A copy of ``nbytes`` completed on the barrier (called by the TMA emulation;
        ``origin``: the recorded event of its issue)."""
        b = _get("complete_tx", bars, idx)
        with _lock:
            note("complete_tx", b, b.phase, thread=-1, nbytes=int(nbytes), origin=origin)
            b.tx -= int(nbytes)
            if b.tx < -TX_LIMIT:
                raise MbarrierTxError(f"{b.where()}, phase {b.phase}: tx-count below "
                                      f"-{TX_LIMIT}")
            _complete_if_done(b)

    def note_copy(bars, idx, nbytes):
        """Record the issue of a copy that will complete on ``bars[idx]``; its event index
        (None when nothing records)."""
        b = _get("note_copy", bars, idx)
        with _lock:
            return note("copy", b, b.phase, nbytes=int(nbytes))

    def describe(bars, idx):
        """'mbarrier full[2] (stage 2), phase 3': the barrier's name and current phase (a
        PTXUsageError if it was never initialized)."""
        b = _get("describe", bars, idx)
        return f"{b.where()}, phase {b.phase}"

    def _satisfied(b, parity):
        return (b.phase & 1) != parity

    def _wait_until(b, parity, what):
        """With ``_lock`` held: wait until the phase of ``parity`` of ``b`` has completed,
        telling the scheduler what this thread waits for (it reports a deadlock, or an
        error found while landing copies, through the thread's attributes)."""
        th = threading.current_thread()
        while not _satisfied(b, parity):
            if getattr(th, "abort", False):
                raise RuntimeError(f"abort flag set while waiting on {what}")
            err = getattr(th, "gl_mbarrier_error", None)
            if err is not None:
                raise err
            th.gl_mbarrier_wait = (b, parity)
            _lock.wait(0.05)
        th.gl_mbarrier_wait = None

    def mbarrier_try_wait_parity(bars, idx, parity):
        """Returns True once the phase of ``parity`` has completed; blocks the calling
        thread until then (the scheduler raises MbarrierDeadlock if it never can)."""
        fn = "mbarrier_try_wait_parity"
        if not pl.is_int(parity):
            raise PTXUsageError(f"{fn}: parity must be an integer (0 or 1), got {parity!r}")
        b = _get(fn, bars, idx)
        parity = int(parity) & 1
        _land_some()
        with _lock:
            _wait_until(b, parity, "an mbarrier")
            # the phase that completed with this parity (-1: the one before the first)
            note("wait", b, b.phase - 1, parity=parity)
        return True

    def mbarrier_wait(bars, idx, parity):
        while not mbarrier_try_wait_parity(bars, idx, parity):
            pass

    def fence_mbarrier_init():
        pass

    _named = {}          # bar.sync id -> _Barrier (this block's)

    def named_barrier_sync(bar_id, nthreads):
        """Arrive on named barrier ``bar_id`` and wait until ``nthreads`` threads have."""
        fn = "named_barrier_sync"
        if not (pl.is_int(bar_id) and pl.is_int(nthreads)):
            raise PTXUsageError(f"{fn}: the barrier id and the thread count must be integers, "
                                f"got {bar_id!r}, {nthreads!r}")
        if not 0 <= bar_id < 16:
            raise PTXUsageError(f"{fn}: barrier ids are 0 to 15, got {bar_id}")
        if nthreads <= 0 or nthreads % 32:
            raise PTXUsageError(f"{fn}: the thread count must be a positive multiple of 32 "
                                f"(whole warps), got {nthreads}")
        with _lock:
            b = _named.get(int(bar_id))
            if b is None:
                b = _named[int(bar_id)] = _Barrier(str(int(bar_id)), int(nthreads),
                                                   "named barrier")
            if b.count != nthreads:
                raise PTXUsageError(f"{fn}: named barrier {bar_id} is used with {b.count} "
                                    f"and with {nthreads} threads in the same phase")
            parity = b.phase & 1
            note("arrive", b, b.phase)
            b.pending -= 1
            _complete_if_done(b)
        with _lock:
            _wait_until(b, parity, "a named barrier")

    # ----------------------------------------------------------- the scheduler's hooks
    def block_started():
        with _lock:
            _bars.clear()
            _named.clear()

    def stalled(threads):
        """Called by the scheduler when every live thread is blocked (at a syncthreads or an
        mbarrier wait) and not all at a syncthreads. Returns None where something can still
        progress (copies in flight landed, or a waiter's phase already completed), else the
        :class:`MbarrierDeadlock` to raise (every waiter raises it too)."""
        with _lock:
            for hook in _stall_hooks:
                if hook(True):                 # copies in flight landed: look again later
                    return None
            waits, syncs = {}, 0
            for t in threads:
                w = getattr(t, "gl_mbarrier_wait", None)
                if w is not None:
                    if _satisfied(*w):
                        return None            # it will wake
                    waits.setdefault((id(w[0]), w[1]), [w, 0])[1] += 1
                elif t.syncthreads_blocked:
                    syncs += 1
                else:
                    return None                # running after all
            if not waits:
                return None
            lines = []
            for (b, parity), n in waits.values():
                lines.append(f"  {n} thread(s) wait with parity {parity} on {b.where()}: its "
                             f"phase {b.phase} (parity {b.phase & 1}) never completes, "
                             f"{b.lacks()}")
            if syncs:
                lines.append(f"  {syncs} thread(s) wait at cuda.syncthreads()")
            block = tuple(getattr(threads[0], "blockIdx", ()))
            msg = (f"deadlock in block {block}: every live thread waits and nothing in "
                   f"flight can complete a phase\n" + "\n".join(lines))
            err = MbarrierDeadlock(msg)
            for t in threads:
                t.gl_mbarrier_error = err
            _lock.notify_all()
            return err

    def add_stall_hook(hook):
        """``hook(final)``: land copies in flight (all of them if ``final``, else the random
        mode's share); returns whether any landed."""
        if hook not in _stall_hooks:
            _stall_hooks.append(hook)

    def _install():
        from . import sim_scheduler
        sim_scheduler.add_hooks(block_started, stalled)

    _install()


@contextlib.contextmanager
def record():
    """Record every mbarrier (and named barrier) operation of the kernels launched inside the
    ``with`` block, in the order the simulator ran them: yields the list that fills, one
    dict per event with ``seq``, ``thread`` (threadIdx.x; -1 for the copy engine), ``op``
    ('arrive', 'expect_tx', 'copy', 'complete_tx', 'wait': recorded when the wait returns),
    ``barrier`` ('full[2]'), ``kind``, ``phase`` (the phase the event belongs to; for a wait
    the phase that completed, -1 for the one before the first) and, where they apply,
    ``parity``, ``nbytes`` and ``origin`` (the copy a completion belongs to). Simulator only:
    a GPU records nothing, and this raises there."""
    if not SIMULATED:
        raise RuntimeError("mbarrier events are recorded by the simulator only")
    with _lock:
        _trace.clear()
        _recording[0] = True
    try:
        yield _trace
    finally:
        with _lock:
            _recording[0] = False


_DOCS = {
    "mbarrier_init": """mbarrier_init(bars, i, count): initialize the barrier ``bars[i]``
    (a shared int64 array) for ``count`` arrivals per phase (1 to 2**20 - 1), in phase 0 with
    no transaction bytes. One thread initializes; then ``fence_mbarrier_init()`` and a
    ``cuda.syncthreads()`` before others use it.

    PTX: ``mbarrier.init.shared::cta.b64 [addr], count``; compute capability 8.0.""",
    "mbarrier_arrive": """mbarrier_arrive(bars, i): one arrival on the current phase of
    ``bars[i]``, with release semantics (this thread's earlier shared-memory reads and
    writes are ordered before it): the phase completes when the last expected arrival
    comes and no transaction bytes are outstanding.

    PTX: ``mbarrier.arrive.shared::cta.b64 state, [addr]``; compute capability 8.0.""",
    "mbarrier_arrive_expect_tx": """mbarrier_arrive_expect_tx(bars, i, nbytes): announce
    ``nbytes`` (0 to 2**20 - 1) more bytes that asynchronous copies will complete on the
    current phase of ``bars[i]``, then arrive: the producer's call before issuing the TMA
    copies of a stage.

    PTX: ``mbarrier.arrive.expect_tx.shared::cta.b64 state, [addr], nbytes``; compute
    capability 9.0.""",
    "mbarrier_try_wait_parity": """mbarrier_try_wait_parity(bars, i, parity): True when the
    phase of ``bars[i]`` with parity ``parity`` (0 or 1) has completed, i.e. the barrier's
    current phase has the other parity. On the GPU the thread may be suspended a while
    inside the instruction and it returns False if the phase is still incomplete after
    that; loop on it (:func:`mbarrier_wait`). Acquire semantics: what the completing
    threads and copies wrote is visible after it returns True.

    PTX: ``mbarrier.try_wait.parity.shared::cta.b64 p, [addr], parity``; compute capability
    9.0.""",
    "mbarrier_wait": """mbarrier_wait(bars, i, parity): wait until the phase of ``bars[i]``
    with parity ``parity`` has completed: a loop on :func:`mbarrier_try_wait_parity` (a
    device function).""",
    "named_barrier_sync": """named_barrier_sync(bar_id, nthreads): wait until ``nthreads``
    threads (whole warps) have reached named barrier ``bar_id`` (1 to 15; 0 is the one
    ``cuda.syncthreads`` uses): a barrier for part of the block, such as the consumer
    warpgroups of a warp-specialized kernel.

    PTX: ``bar.sync bar_id, nthreads``; compute capability 7.0.""",
    "fence_mbarrier_init": """fence_mbarrier_init(): make the ``mbarrier_init`` of this
    thread visible to other threads and to the asynchronous copy engines (before the
    ``syncthreads`` that publishes the barriers).

    PTX: ``fence.mbarrier_init.release.cluster``; compute capability 9.0.""",
}
for _name, _doc in _DOCS.items():
    if not SIMULATED and _name == "mbarrier_wait":
        continue       # a numba device function: its docstring is the Python function's
    set_doc(globals()[_name], _doc)
del _name, _doc
