"""The simulator's instruments: :func:`barrier_audit` (races between two barriers, barriers
that some threads skip) and :func:`pipeline_audit` (every ``cp.async`` copy, wait, barrier
and tensor-core read of a stage)."""
from __future__ import annotations

import contextlib
import threading
from collections import defaultdict

from .._ptx_plumbing import WatchedArray, shared_arrays
from .guards import HINTS


class _Epochs:
    """Counts, per simulated thread, the barriers it has passed (patched syncthreads)."""

    def __init__(self):
        self.final = {}                 # (block, thread) -> barriers passed
        self.lock = threading.Lock()

    @staticmethod
    def of(th=None):
        th = th or threading.current_thread()
        return getattr(th, "_gl_epoch", 0)

    @contextlib.contextmanager
    def installed(self):
        from numba.cuda.simulator import kernel as simkernel
        BT = simkernel.BlockThread
        real = BT.syncthreads
        epochs = self

        def syncthreads(th):
            real(th)
            th._gl_epoch = getattr(th, "_gl_epoch", 0) + 1
            with epochs.lock:
                epochs.final[(tuple(th.blockIdx), th.thread_id)] = th._gl_epoch

        BT.syncthreads = syncthreads
        try:
            yield self
        finally:
            BT.syncthreads = real

    def skipped(self, threads_per_block):
        """A block whose threads passed different numbers of barriers, or None."""
        per_block = defaultdict(dict)
        for (blk, tid), n in self.final.items():
            per_block[blk][tid] = n
        for blk, d in per_block.items():
            counts = set(d.values())
            if len(d) < threads_per_block:
                counts.add(0)
            if len(counts) > 1:
                return blk, min(counts), max(counts)
        return None


def thread_epoch():
    th = threading.current_thread()
    return tuple(getattr(th, "blockIdx", (0, 0, 0))), getattr(th, "thread_id", 0), _Epochs.of(th)


class _Watched(WatchedArray):
    """A shared array whose element accesses are checked for races between barriers."""

    def __init__(self, arr, name, audit):
        super().__init__(arr, name)
        self._audit = audit

    def access(self, idx, store):
        self._audit._access(self, idx, store)


class _BarrierAudit:
    def __init__(self):
        self.epochs = _Epochs()
        self.race = None
        self.lock = threading.Lock()
        self.writes = {}            # (array id, idx) -> (thread, epoch)
        self.reads = {}             # (array id, idx) -> (epoch, set of threads)
        self.alive = []
        self.shapes = {}
        self.stale = None           # the first read of an element not written since the
                                    # barrier before last (never written, or an old tile)

    def _access(self, arr, idx, write):
        if self.race is not None:
            return
        if not isinstance(idx, tuple):
            idx = (idx,)
        try:
            idx = tuple(int(i) for i in idx)
        except TypeError:           # a slice: not tracked
            return
        blk, tid, ep = thread_epoch()
        key = (id(arr), idx)
        where = f"{arr._name}[{', '.join(map(str, idx))}]"
        with self.lock:
            w = self.writes.get(key)
            r = self.reads.get(key)
            if write:
                if w and w[0] != tid and w[1] == ep:
                    self.race = (f"threads {w[0]} and {tid} of block {blk[:2]} both write {where} "
                                 "between the same two barriers")
                elif r and r[0] == ep and (r[1] - {tid}):
                    other = min(r[1] - {tid})
                    self.race = (f"thread {tid} of block {blk[:2]} overwrites {where} while thread "
                                 f"{other} may still read the old value (no barrier between the "
                                 "reads and the next writes)")
                self.writes[key] = (tid, ep)
            else:
                if self.stale is None and (w is None or w[1] < ep - 1):
                    self.stale = (f"thread {tid} of block {blk[:2]} reads {where}, which "
                                  + ("no thread has written" if w is None else
                                     f"was last written {ep - w[1]} barriers earlier") +
                                  " (it holds what shared memory held: NaN here, anything "
                                  "on a GPU)")
                if w and w[0] != tid and w[1] == ep:
                    self.race = (f"thread {tid} of block {blk[:2]} reads {where}, which thread "
                                 f"{w[0]} wrote after the last barrier: it may read it before "
                                 "it is written (no barrier between the writes and the reads)")
                if r and r[0] == ep:
                    r[1].add(tid)
                else:
                    self.reads[key] = (ep, {tid})

    def message(self):
        return f"{HINTS['barrier']}: {self.race}"


def _poisoned(shape, dtype):
    import numpy as np
    return np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -1, dtype)


@contextlib.contextmanager
def nan_shared():
    """Shared arrays of the numba kernels launched inside start filled with NaN (simulator;
    integer arrays with -1): an element a kernel reads before writing is then as undefined
    as on a GPU, and shows in the result. One array per source line, as the simulator."""
    def nan_array(shape, dtype, frame):
        return _poisoned(shape, dtype)

    with shared_arrays(nan_array):
        yield


@contextlib.contextmanager
def barrier_audit():
    """Record the shared-memory accesses of numba kernels launched inside (simulator only)
    and find races between barriers. Yields an object with ``race`` (None or a sentence),
    ``epochs`` (barriers per thread), ``message()``, ``shapes`` ({name: shape} of the
    shared arrays the kernels declared) and ``stale`` (None or a sentence: the first read of
    an element that no thread wrote since the barrier before the last one). Shared arrays start filled with NaN (integer arrays
    with -1), as undefined as on a GPU: an element read before it is written shows."""
    import linecache
    audit = _BarrierAudit()

    def shared_array(shape, dtype, frame):
        name = f"the shared array of line {frame.f_lineno}"
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        if "=" in line:
            name = line.split("=")[0].strip()
        res = _Watched(_poisoned(shape, dtype), name, audit)
        audit.alive.append(res)     # ids stay unique while the audit runs
        audit.shapes[name] = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        return res

    with shared_arrays(shared_array), audit.epochs.installed():
        yield audit


class _PipelineAudit:
    def __init__(self):
        self.epochs = _Epochs()
        self.lock = threading.Lock()
        self.problem = None
        self.chunks = {}            # (block, array id, stage) -> {chunk index: copy record}
        self.last_read = {}         # (block, array id, stage) -> {thread: epoch}
        self.reads = 0
        self.reads_overlapped = 0   # reads made while a copy of this thread was in flight
        self.alive = {}             # id -> array: keeps ids unique while the audit runs

    def _state(self):
        th = threading.current_thread()
        st = getattr(th, "_gl_pipe", None)
        if st is None:
            st = th._gl_pipe = {"pending": [], "groups": []}
        return st

    def _flag(self, text):
        with self.lock:
            if self.problem is None:
                self.problem = text

    def issue(self, dst, di):
        blk, tid, ep = thread_epoch()
        stage = int(di[0])
        key = (blk, id(dst), stage)
        rec = {"thread": tid, "issued": ep, "landed": None}
        with self.lock:
            self.alive.setdefault(id(dst), dst)
            readers = self.last_read.get(key, {})
            late = [t for t, e in readers.items() if t != tid and e >= ep]
            self.chunks.setdefault(key, {})[tuple(int(i) for i in di)] = rec
        if late:
            self._flag(f"{HINTS['barrier']} before the next issue: thread {tid} starts a copy "
                       f"into stage {stage} while thread {late[0]} may still be reading it "
                       "(no barrier between computing on a buffer and refilling it)")
        self._state()["pending"].append(rec)

    def commit(self):
        st = self._state()
        st["groups"].append(st["pending"])
        st["pending"] = []

    def wait(self, n):
        st = self._state()
        ep = _Epochs.of()
        while len(st["groups"]) > n:
            for rec in st["groups"].pop(0):
                rec["landed"] = ep

    def read(self, arr, idx):
        blk, tid, ep = thread_epoch()
        stage = int(idx[0])
        key = (blk, id(arr), stage)
        st = self._state()
        with self.lock:
            self.alive.setdefault(id(arr), arr)
            recs = list(self.chunks.get(key, {}).values())
            self.last_read.setdefault(key, {})[tid] = ep
            self.reads += 1
            if any(g for g in st["groups"]):
                self.reads_overlapped += 1
        if not recs:
            self._flag(f"stage {stage} is read before any tile was copied into it: is the "
                       "next tile issued (issue(t + 1)) inside the loop?")
            return
        mine = [r for r in recs if r["thread"] == tid and r["landed"] is None]
        if mine:
            self._flag(f"{HINTS['wait']}: thread {tid} reads stage {stage} while its own copy "
                       "into it has not landed (which N leaves no group of tile t pending?)")
            return
        theirs = [r for r in recs if r["thread"] != tid and (r["landed"] is None or r["landed"] >= ep)]
        if theirs:
            self._flag(f"{HINTS['barrier']} between the wait and the read: thread {tid} reads "
                       f"stage {stage} before thread {theirs[0]['thread']}'s copy into it has "
                       "landed and a barrier has passed (each thread waits only for its own "
                       "copies; cuda.syncthreads() makes everyone's visible)")


@contextlib.contextmanager
def pipeline_audit():
    """Instrument ``ptx``'s cp.async and WMMA-load intrinsics for the kernels launched inside
    (simulator only). The shared buffers are indexed ``[stage, row, column]``."""
    from .. import ptx
    audit = _PipelineAudit()
    names = ["cp_async16", "cp_async16_zfill", "cp_async_ca", "cp_async_commit_group",
             "cp_async_wait_group", "wmma_load_a", "wmma_load_b"]
    real = {n: getattr(ptx, n) for n in names if hasattr(ptx, n)}

    def wrap_copy(fn):
        def copy(dst, di, src, si, *rest):
            fn(dst, di, src, si, *rest)
            audit.issue(dst, di)
        return copy

    def commit():
        real["cp_async_commit_group"]()
        audit.commit()

    def wait(n):
        real["cp_async_wait_group"](n)
        if isinstance(n, int) and n >= 0:
            audit.wait(n)

    def wrap_load(fn):
        def load(frag, arr, idx, ldm, layout):
            if isinstance(idx, tuple) and len(idx) == 3:
                audit.read(arr, idx)
            return fn(frag, arr, idx, ldm, layout)
        return load

    for n in ("cp_async16", "cp_async16_zfill", "cp_async_ca"):
        if n in real:
            setattr(ptx, n, wrap_copy(real[n]))
    ptx.cp_async_commit_group = commit
    ptx.cp_async_wait_group = wait
    ptx.wmma_load_a = wrap_load(real["wmma_load_a"])
    ptx.wmma_load_b = wrap_load(real["wmma_load_b"])
    try:
        with audit.epochs.installed():
            yield audit
    finally:
        for n, fn in real.items():
            setattr(ptx, n, fn)
