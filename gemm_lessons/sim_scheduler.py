"""A block scheduler for numba's CUDA simulator that yields while it waits.

The simulator runs every CUDA thread of a block as a Python thread. Its block manager polls
them in a loop to see when all have reached ``syncthreads()``, and that loop never sleeps, so
it competes with the threads it waits for. With a few hundred threads per block the contest
can cost minutes where the work itself takes a second (a 256-thread block of lesson 04
measured 0.8-1.6 s with the loop below and did not finish in 200 s without it).

:func:`install` replaces ``BlockManager.run`` of numba-cuda's simulator with a loop that keeps
the same rules (all live threads blocked in ``syncthreads`` -> release them all; a thread's
exception aborts the block and is raised, here once the block's other threads have stopped)
and sleeps briefly between polls. It is applied by
:mod:`gemm_lessons.engines` whenever the simulator is chosen, and only to the simulator.

Threads may also block on an ``mbarrier`` (:mod:`gemm_lessons.ptx_mbarrier`), which only other
threads' arrivals or a copy in flight can release. The scheduler calls that module's hooks
(:func:`add_hooks`): once at the start of each block, and whenever every live thread is
blocked and not all of them at the ``syncthreads``. The hook lands copies still in flight,
or, where nothing can progress any more, returns the deadlock error: the block is stopped
and the error raised (:class:`~gemm_lessons.ptx_mbarrier.MbarrierDeadlock`), instead of a
kernel that never returns.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import time

import numpy as np

POLL_SECONDS = 2e-4
JOIN_SECONDS = 60.0      # how long an aborted block's other threads get to stop

_HOOKS = []              # (block_started(), stalled(live threads) -> None or an error,
                         #  block_finished() or None)


def add_hooks(block_started, stalled, block_finished=None):
    """Register ``block_started()`` (called before a block's threads start),
    ``stalled(live)`` (called when every live thread is blocked, not all at the
    syncthreads; returns None if something can progress, else the deadlock error to raise)
    and ``block_finished()`` (called when every thread of a block has ended without an
    error; it may raise what the block left undone)."""
    if (block_started, stalled, block_finished) not in _HOOKS:
        _HOOKS.append((block_started, stalled, block_finished))


def _mbarrier_waiting(t):
    return getattr(t, "gl_mbarrier_wait", None) is not None


def _run(self, grid_point, *args):
    from numba.cuda.simulator.kernel import BlockThread

    def target():
        self._f(*args)

    for started, _, _ in _HOOKS:
        started()
    threads = []
    for block_point in np.ndindex(*self._block_dim):
        t = BlockThread(target, self, grid_point, block_point, self._debug)
        t.start()
        threads.append(t)

    def abort_all():
        for other in threads:
            other.abort = True
            other.syncthreads_blocked = False
            other.syncthreads_event.set()
        # wait for the others to stop (at their next barrier, or at the end) before the
        # exception reaches the caller: a thread still running would keep swapping the
        # kernel module's ``cuda`` for the simulator's while the caller goes on
        deadline = time.monotonic() + JOIN_SECONDS
        for other in threads:
            other.join(max(0.0, deadline - time.monotonic()))

    live = list(threads)
    while live:
        blocked = waiting = 0
        for t in live:
            if t.exception:
                abort_all()
                raise t.exception[0].with_traceback(t.exception[1])
            blocked += bool(t.syncthreads_blocked)
            waiting += _mbarrier_waiting(t)
        if blocked == len(live):                 # every live thread waits at the barrier
            for t in live:
                t.syncthreads_blocked = False
                t.syncthreads_event.set()
        elif waiting and blocked + waiting >= len(live):
            for _, stalled, _ in _HOOKS:         # some wait on an mbarrier: can any progress?
                try:
                    err = stalled(live)          # (landing a copy may find it was wrong)
                except Exception as exc:        # noqa: BLE001  (raised below, as it is)
                    err = exc
                if err is not None:
                    _stop_deadlocked(abort_all, err)
        live = [t for t in live if t.is_alive()]
        time.sleep(POLL_SECONDS)                 # let the threads run
    for t in threads:
        if t.exception:
            raise t.exception[0].with_traceback(t.exception[1])
    for _, _, finished in _HOOKS:
        if finished is not None:
            finished()


def _stop_deadlocked(abort_all, err):
    """Stop a block that cannot go on: every thread is aborted (a thread waiting on an
    mbarrier sees the flag within a poll), then ``err`` is raised here."""
    abort_all()
    raise err


def _patch(sim):
    manager = getattr(sim, "BlockManager", None)
    if manager is None or not hasattr(sim, "BlockThread") or manager.run is _run:
        return False
    manager.run = _run
    return True


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches the simulator's kernel module right after Python first imports it, so that
    ``import gemm_lessons`` itself still imports no numba."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)
        spec.loader.exec_module = exec_and_patch
        return spec


_MODULE = "numba.cuda.simulator.kernel"
_FINDER = _PatchOnImport()


def install():
    """Use :func:`_run` for the simulator's blocks: now if numba's simulator is already
    imported, else as soon as it is (numba-cuda's simulator with a ``BlockManager`` and
    ``BlockThread``; anything else is left as it is)."""
    if _MODULE in sys.modules:
        return _patch(sys.modules[_MODULE])
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return True
