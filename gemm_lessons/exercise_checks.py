"""The checks of the exercises (``exercises/NN_*.ipynb``): one function per exercise.

Each check

* runs the learner's answer on small shapes, within a time limit, so that a wrong answer
  is answered as quickly as a right one;
* tests what the lesson is about, not only the product: coalesced requests (01), loads per
  element (02), conflict-free banks (03), loads per multiply-add (04), tensor-core calls
  (05), copies in flight while the tensor cores compute (06), the order of the tiles (07),
  the epilogue's BLAS rules (09);
* on failure raises :class:`ExerciseError` (an ``AssertionError``, so nbgrader counts the
  test cell as failed) whose message names the likely cause: the grid, a mask, a missing
  barrier, a wait count, the accumulator type, the tile order, an unfinished TODO.

Instruments used on the simulator:

* :func:`barrier_audit`: every shared-memory access of a numba kernel is recorded with its
  thread and the number of ``cuda.syncthreads()`` that thread has passed. Two threads that
  touch the same element between the same two barriers (one of them writing) race: a
  missing barrier, reported even when the simulator's scheduling happened to give the
  right numbers.
* :func:`pipeline_audit`: every ``cp.async`` copy into a stage of a shared buffer, every
  ``wait_group``, every barrier and every tensor-core read of a stage: a stage read while
  this thread's copy into it is still in flight (a wait count), read before another
  thread's copy has landed and a barrier has passed (a missing barrier), overwritten while
  another thread may still read it (a missing barrier before the next issue), and whether
  any copy was in flight while the tensor cores computed (the overlap the pipeline is for).
* :mod:`gemm_lessons.interp_poison` for Triton: masked-off lanes of a load without
  ``other=`` come back NaN, and which program stored which tile.

The mutants of ``tests/exercise_mutants.yaml`` (typical mistakes, applied to the solutions)
must each be caught by these checks with the hint the table names.
"""
from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections import defaultdict

import torch

from . import engines, harness
from ._ptx_plumbing import WatchedArray

__all__ = ["ExerciseError", "time_limit", "barrier_audit", "pipeline_audit", "check_product",
           "HINTS"]

# The words a hint uses for each cause (tests/exercise_mutants.yaml refers to these keys).
HINTS = {
    "todo": "the TODO is not done yet",
    "barrier": "a missing barrier (cuda.syncthreads())",
    "barrier_skipped": "a barrier that some threads skip",
    "wait": "a wait count: cp_async_wait_group(N) leaves a copy of the tile in flight",
    "overlap": "no copy in flight while the tensor cores compute",
    "grid": "the grid is too small",
    "mask": "a missing mask",
    "other": "a masked load without other=",
    "zero": "C is all zero: the K loop accumulates nothing",
    "order": "the tile order",
    "accumulator": "the accumulator type",
    "timeout": "took longer than",
}


class ExerciseError(AssertionError):
    """An exercise's answer is wrong; the message says where and the likely cause."""


# ------------------------------------------------------------------ generic guards
@contextlib.contextmanager
def time_limit(seconds, what="the check"):
    """Raise :class:`ExerciseError` if the block runs longer than ``seconds`` (main thread
    only, through SIGALRM; elsewhere the block simply runs)."""
    usable = (threading.current_thread() is threading.main_thread()
              and hasattr(signal, "setitimer"))
    if not usable:
        yield
        return

    def expired(signum, frame):
        raise ExerciseError(f"{what} took longer than {seconds} s: an endless loop, or far "
                            "more work than the exercise needs (a right answer takes a "
                            "fraction of that)")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def _answer(what, seconds=60):
    """Run a learner's answer: unfinished TODOs, undefined names and launch errors become an
    :class:`ExerciseError` that says so; the whole block has a time limit."""
    with time_limit(seconds, what):
        try:
            yield
        except ExerciseError:
            raise
        except harness.CheckError:
            raise
        except NotImplementedError:
            raise ExerciseError(f"{what}: {HINTS['todo']} (replace `raise "
                                "NotImplementedError()` under the TODO with your code)") from None
        except Exception as e:                                  # noqa: BLE001
            text = f"{type(e).__name__}: {e}"
            if "NotImplementedError" in text:
                raise ExerciseError(f"{what}: {HINTS['todo']} (replace `raise "
                                    "NotImplementedError()` under the TODO with your code)") from None
            if isinstance(e, IndexError) or "IndexError" in text:
                raise ExerciseError(
                    f"{what}: an index outside an array ({_short(text, 160)}): {HINTS['mask']} "
                    "(a bounds check) for threads or elements past the edge of A, B or C, or "
                    "a loop that runs past its dimension (M, N and K mixed up?)") from None
            if "NameError" in text or isinstance(e, (NameError, UnboundLocalError)):
                raise ExerciseError(
                    f"{what}: a name is used before your code defines it ({_short(text)}): "
                    f"{HINTS['todo']}, or it does not define every name the code after it "
                    "uses.") from None
            raise ExerciseError(f"{what} raised {_short(text)}") from None


def _short(text, n=300):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."


# ------------------------------------------------------------------ simulator: barriers
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


def _me():
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

    def _access(self, arr, idx, write):
        if self.race is not None:
            return
        if not isinstance(idx, tuple):
            idx = (idx,)
        try:
            idx = tuple(int(i) for i in idx)
        except TypeError:           # a slice: not tracked
            return
        blk, tid, ep = _me()
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


@contextlib.contextmanager
def barrier_audit():
    """Record the shared-memory accesses of numba kernels launched inside (simulator only)
    and find races between barriers. Yields an object with ``race`` (None or a sentence),
    ``epochs`` (barriers per thread) and ``message()``."""
    from numba.cuda.simulator import kernelapi
    audit = _BarrierAudit()
    alloc_lock = threading.Lock()
    real_shared = kernelapi.FakeCUDAShared.array
    import sys

    def shared_array(self, shape, dtype, alignment=None):
        if shape == 0:
            return real_shared(self, shape, dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with alloc_lock:    # every thread of the block must get the same array
            return _allocate(self, caller, frame, shape, dtype)

    def _allocate(self, caller, frame, shape, dtype):
        res = self._allocations.get(caller)
        if res is None:
            import numpy as np
            from numba.core import types
            from numba.np import numpy_support
            if isinstance(dtype, types.Type):
                dtype = numpy_support.as_dtype(dtype)
            name = f"the shared array of line {frame.f_lineno}"
            try:
                src = frame.f_code.co_filename
                import linecache
                line = linecache.getline(src, frame.f_lineno).strip()
                if "=" in line:
                    name = line.split("=")[0].strip()
            except Exception:       # noqa: BLE001
                pass
            res = _Watched(np.zeros(shape, dtype), name, audit)
            self._allocations[caller] = res
            audit.alive.append(res)     # ids stay unique while the audit runs
        return res

    kernelapi.FakeCUDAShared.array = shared_array
    try:
        with audit.epochs.installed():
            yield audit
    finally:
        kernelapi.FakeCUDAShared.array = real_shared


# ------------------------------------------------------------------ simulator: cp.async
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
        blk, tid, ep = _me()
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
        blk, tid, ep = _me()
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
    from . import ptx
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


# ------------------------------------------------------------------ product checks
def _all_zero_hint(out):
    if bool(torch.isfinite(out).all()) and bool((out == 0).all()):
        return HINTS["zero"] + " (is the product added into the accumulator inside the loop?)"
    return None


def check_product(run, name, dtypes=(torch.float32,), cases=None, *, audit=None,
                  threads_per_block=None, seconds=60):
    """:func:`harness.check` with an exercise's diagnosis: an unfinished TODO, a time limit,
    an all-zero result, and (with ``audit``) races or skipped barriers found by the audit,
    which outrank the shape-based guess."""
    cases = harness.shape_suite() if cases is None else cases
    zero = {}

    def run_and_look(a, b, out):
        run(a, b, out)
        zero.setdefault("hint", _all_zero_hint(out.cpu()))

    err = None
    with _answer(name, seconds):
        try:
            report = harness.check(run_and_look, name, dtypes, cases)
        except harness.CheckError as e:
            err = e
    cause = None
    if audit is not None:
        problem = getattr(audit, "problem", None) or (audit.message() if getattr(audit, "race", None) else None)
        if problem:
            cause = problem
        elif threads_per_block:
            skipped = audit.epochs.skipped(threads_per_block)
            if skipped:
                cause = (f"{HINTS['barrier_skipped']}: in block {skipped[0][:2]} some threads "
                         f"passed {skipped[1]} barriers, others {skipped[2]} (an early return, "
                         "or a syncthreads inside an if: every thread must reach every barrier)")
    if err is None and cause is None:
        return report
    if err is not None:
        text = str(err)
        hint = zero.get("hint")
        if cause or hint:
            text = text.split("\nLikely cause:")[0] + "\nLikely cause: " + (cause or hint)
        raise ExerciseError(text)
    raise ExerciseError(f"{name} gives the right numbers here, but: {cause}. On a GPU this "
                        "is a race that gives wrong results some of the time.")


def _sim(kernel, grid, block, a, b, c):
    kernel[grid, block](engines.as_numba(a), engines.as_numba(b), engines.as_numba(c))


def _cdiv(a, b):
    return -(-a // b)


# A smaller suite for kernels that run slowly on the simulator: still ragged, 1s and strides.
def _small_suite(names=("square", "ragged", "M=1", "K=1", "A transposed")):
    return [c for c in harness.shape_suite(gpu=False) if c.name in names]


# ------------------------------------------------------------------ lesson 01
def _numba_globals():
    """Bind ``cuda`` and ``float32`` as globals of this module (imported late, after the
    engine is chosen): the simulator swaps a kernel's global ``cuda`` for its fake module,
    which a closure variable would escape."""
    import numba
    from numba import cuda as _cuda
    globals()["cuda"] = _cuda
    globals()["float32"] = numba.float32


def _ref_k01():
    """One thread per element, consecutive threadIdx.x on consecutive columns: lesson 01's
    coalesced kernel, as the package registers it."""
    from .kernels.k01_naive import coalesced_kernel
    return coalesced_kernel


def ex01_kernel(kernel):
    """Lesson 01, exercise 1: a coalesced kernel with a 1-D block of 256 threads, each block
    an 8 x 32 tile of C; launched with a grid that covers C."""
    from . import counters

    def run(a, b, c):
        M, N = c.shape
        _sim(kernel, (_cdiv(N, 32) + 1, _cdiv(M, 8) + 1), 256, a, b, c)

    # the lesson's point first: which element a thread computes decides the sectors touched
    a, b = harness.make_operands(64, 64, 8)
    c = torch.empty(64, 64)
    with counters.trace(A=a, B=b, C=c) as t, _answer("my_kernel"):
        run(a, b, c)
    s = t.global_summary()
    if not (s["B"]["load"] <= 4 and s["C"]["store"] <= 4):
        raise ExerciseError(
            f"B loads use {s['B']['load']:.0f} and C stores {s['C']['store']:.0f} sectors per "
            "warp request (4 when coalesced): consecutive threadIdx.x must map to consecutive "
            "columns (col from the x dimension)")
    report = check_product(run, "my_kernel", cases=_small_suite(
        ("square", "rectangular", "ragged", "M=1", "N=1", "K=1", "A transposed")))
    return f"{report}; B loads and C stores coalesced (4 sectors per warp request)"


def ex01_grid(launcher):
    """Lesson 01, exercise 2: the launcher, run with a correct kernel (independent of
    exercise 1)."""
    kernel = _ref_k01()
    report = check_product(lambda a, b, c: launcher(kernel, a, b, c), "my_launcher")
    return str(report)


def _sectors_truth(x, row, col0, *, stride=True, elem=True, base=True, guard=True, sector=32):
    """Sectors of the request ``x[row, col0 + lane]`` (lane 0..31): the truth, and with a
    flag off, the answer a typical mistake gives."""
    from .counters import Access, sectors_per_request
    e = x.element_size()
    s0, s1 = (x.stride(0), x.stride(1)) if stride else (x.shape[1], 1)
    start = x.data_ptr() if base else 0
    accesses = []
    for lane in range(32):
        col = col0 + lane
        if guard and col >= x.shape[1]:
            continue
        off = row * s0 + col * s1
        addr = start + off * (e if elem else 4)
        accesses.append(Access("global", "x", "load", (0, 0, 0), 0, lane, 0, addr,
                               e if elem else 4))
    if sector == 32:
        return sectors_per_request(accesses)
    return len({b // sector for a in accesses for b in (a.addr, a.addr + a.nbytes - 1)})


def _sector_cases():
    """(description, tensor view, row, col0): the views a kernel meets."""
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(64, 64, generator=gen)
    return [
        ("a row-major float32 matrix", base, 3, 0),
        ("a row-major float32 matrix, from column 32", base, 5, 32),
        ("a transposed view (x = base.t())", base.t(), 3, 0),
        ("a float16 matrix", base.half(), 2, 0),
        ("a float64 matrix", base.double(), 2, 0),
        ("a view that starts 3 columns in (x = base[:, 3:])", base[:, 3:], 0, 0),
        ("every other column (x = base[:, ::2])", base[:, ::2], 1, 0),
        ("a matrix of 40 columns, from column 32 (8 lanes in C)",
         torch.randn(64, 40, generator=gen), 1, 32),
    ]


def ex01_sectors(warp_sectors):
    """Lesson 01, exercise 3: the 32-byte sectors a warp's request ``x[row, col0 + lane]``
    touches, from the view's strides, element size and address."""
    mistakes = [
        (dict(stride=False), "the strides: a transposed or sliced view is not row-major; "
         "how many elements apart its rows and its columns are is x.stride()"),
        (dict(elem=False), "the element size: offsets count elements, addresses count bytes "
         "(x.element_size() bytes per element)"),
        (dict(base=False), "where the view starts: a slice begins x.storage_offset() elements "
         "into its storage; x.data_ptr() is its first element's byte address, and sectors "
         "are counted from address 0"),
        (dict(guard=False), "lanes past the last column: they fail the kernel's bounds check "
         "and read nothing"),
        (dict(sector=128), "the sector size: a request is served in 32-byte sectors, not "
         "128-byte lines"),
    ]
    cases = _sector_cases()
    with _answer("warp_sectors"):
        got = [warp_sectors(x, row, col0) for _, x, row, col0 in cases]
    want = [_sectors_truth(x, row, col0) for _, x, row, col0 in cases]
    if got != want:
        # the mistake whose answers are the learner's on every view
        why = next((w for flags, w in mistakes
                    if got == [_sectors_truth(x, r, c0, **flags) for _, x, r, c0 in cases]),
                   "the byte address of each lane's element (the view's first element, its "
                   "strides, its element size), then the distinct 32-byte sectors among the "
                   "lanes whose column is inside x")
        j = next(n for n, (g, w) in enumerate(zip(got, want)) if g != w)
        what, x, row, col0 = cases[j]
        raise ExerciseError(
            f"{what} (strides {tuple(x.stride())}, {x.element_size()}-byte elements), row "
            f"{row}, columns from {col0}: got {got[j]!r} sectors, expected {want[j]}.\n"
            f"Likely cause: {why}")
    return (f"warp_sectors: right on {len(cases)} views (row-major float32 {want[0]} sectors, "
            f"transposed {want[2]}, float16 {want[3]}, starting 3 columns in {want[5]})")


_traffic_cache = {}


def _measured_traffic(kernel, M, N, K):
    """{("A", "load"): bytes, ...}: the sectors a launch of the registered lesson-01 kernel
    requests, measured with counters.trace, times 32 bytes."""
    key = (kernel, M, N, K)
    if key not in _traffic_cache:
        from . import counters
        from .kernels import k01_naive
        launch = {"k01_naive": k01_naive.naive, "k01_coalesced": k01_naive.coalesced}[kernel]
        a, b = harness.make_operands(M, N, K)
        c = torch.empty(M, N)
        with counters.trace(A=a, B=b, C=c) as t:
            launch(a, b, c)
        per = defaultdict(int)
        for (space, arr, op, *_), req in t.requests("global").items():
            per[(arr, op)] += counters.sectors_per_request(req) * counters.SECTOR_BYTES
        _traffic_cache[key] = dict(per)
    return _traffic_cache[key]


def ex01_traffic(traffic):
    """Lesson 01, exercise 4: the flops and the bytes requested (sectors x 32) of a launch of
    ``k01_naive`` and ``k01_coalesced``, checked against the simulator's count."""
    lines = []
    for kernel, other in (("k01_coalesced", "k01_naive"), ("k01_naive", "k01_coalesced")):
        for M, N, K in ((64, 32, 8), (32, 64, 9)):
            with _answer("traffic"):
                got = traffic(kernel, M, N, K)
            if not (isinstance(got, (tuple, list)) and len(got) == 2):
                raise ExerciseError(f"traffic({kernel!r}, {M}, {N}, {K}) returned {got!r}: "
                                    "return a pair (flops, bytes)")
            flops, nbytes = got
            where = f"{kernel}, M={M}, N={N}, K={K}"
            if flops != 2 * M * N * K:
                why = ("a multiply-add is 2 flops" if flops == M * N * K else
                       "every element of C is a dot product of length K")
                raise ExerciseError(f"{where}: {flops!r} flops, expected {2 * M * N * K}: {why}")
            m = _measured_traffic(kernel, M, N, K)
            want = sum(m.values())
            if nbytes == want:
                continue
            mo = sum(_measured_traffic(other, M, N, K).values())
            useful = 4 * (2 * M * N * K + M * N)
            if nbytes == want // 32:
                why = "that is the number of sectors: each sector is 32 bytes"
            elif nbytes == m[("A", "load")] + m[("B", "load")]:
                why = "the stores of C are warp requests too (one per warp, at the end)"
            elif nbytes == mo:
                why = (f"that is {other}'s traffic: in {kernel} consecutive threadIdx.x are "
                       f"consecutive {'columns' if kernel == 'k01_coalesced' else 'rows'}")
            elif nbytes == useful:
                why = ("those are the bytes the lanes use; a request moves whole 32-byte "
                       "sectors, however few of their bytes a lane needs")
            else:
                why = "count per warp and per k the sectors of A and of B, then the store of C"
            raise ExerciseError(
                f"{where}: {nbytes!r} bytes, the simulator counts {want} (A loads "
                f"{m[('A', 'load')]}, B loads {m[('B', 'load')]}, C stores "
                f"{m[('C', 'store')]}).\nLikely cause: {why}")
        lines.append(f"{kernel} {2 * M * N * K / want:.2f}")
    return ("traffic: flops and bytes right for both kernels; flops per requested byte at "
            f"M={M}, N={N}, K={K}: " + ", ".join(lines))


# ------------------------------------------------------------------ lesson 02
T02 = 16
_ref02 = {}


def _ref_k02():
    if "k" not in _ref02:
        _numba_globals()
        T = T02

        @cuda.jit
        def ref_tiled(A, B, C):
            sA = cuda.shared.array((T, T), float32)
            sB = cuda.shared.array((T, T), float32)
            M, K = A.shape
            N = B.shape[1]
            tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
            row, col = cuda.blockIdx.y * T + ty, cuda.blockIdx.x * T + tx
            acc = float32(0.0)
            for k0 in range(0, K, T):
                sA[ty, tx] = A[row, k0 + tx] if row < M and k0 + tx < K else 0.0
                sB[ty, tx] = B[k0 + ty, col] if k0 + ty < K and col < N else 0.0
                cuda.syncthreads()
                for k in range(T):
                    acc += sA[ty, k] * sB[k, tx]
                cuda.syncthreads()
            if row < M and col < N:
                C[row, col] = acc
        _ref02["k"] = ref_tiled
    return _ref02["k"]


def _ref_launch02(a, b, c):
    M, N = c.shape
    _sim(_ref_k02(), (_cdiv(N, T02), _cdiv(M, T02)), (T02, T02), a, b, c)


def ex02_tile_loop(kernel, T=T02):
    """Lesson 02, exercise 1: the body of the tile loop (loads, barriers, multiply-adds)."""
    def run(a, b, c):
        M, N = c.shape
        _sim(kernel, (_cdiv(N, T), _cdiv(M, T)), (T, T), a, b, c)

    with barrier_audit() as audit:
        report = check_product(run, "my_tiled", cases=_small_suite(
            ("square", "ragged", "M=1", "K=1", "A transposed")), audit=audit,
            threads_per_block=T * T)
    return str(report)


class _LaunchRecorder:
    """Stands for a numba kernel: ``inspect(config, args)`` sees each launch's (grid, block)
    and arguments before it runs (and may raise), then the kernel is launched."""

    def __init__(self, kernel, inspect):
        self.kernel = kernel
        self.inspect = inspect
        self.launches = 0

    def __getitem__(self, config):
        def launch(*args):
            self.inspect(config, args)
            self.launches += 1
            return self.kernel[config](*args)
        return launch


def _dims(d):
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))


def ex02_launch(launcher, BM=16, BN=8):
    """Lesson 02, exercise 2: the launcher of a correct BM x BN tiled kernel (threadIdx.x over
    the BN columns of the tile, threadIdx.y over its BM rows): its block and its grid,
    looked at before each launch, and the product on the shape suite."""
    def inspect(config, args):
        grid, block = _dims(config[0]), _dims(config[1])
        M, N = args[2].shape
        if block != (BN, BM, 1):
            why = (f"the block is transposed: threadIdx.x runs over the BN = {BN} columns of "
                   f"the tile, threadIdx.y over its BM = {BM} rows" if block[:2] == (BM, BN)
                   else f"the kernel expects blocks of BN x BM = {BN} x {BM} threads (x: "
                   "columns, y: rows)")
            raise ExerciseError(f"M={M}, N={N}: the block is {block[:2]}: {why}")
        need = (_cdiv(N, BN), _cdiv(M, BM))
        if grid[0] < need[0] or grid[1] < need[1]:
            if grid[:2] == (_cdiv(M, BM), _cdiv(N, BN)):
                why = ("x and y swapped: blockIdx.x counts tiles along the columns (N), "
                       "blockIdx.y along the rows (M)")
            elif grid[:2] in ((N // BN, M // BM), (max(N // BN, 1), max(M // BM, 1))):
                why = "integer division rounds down: a partial tile at the edge needs a block too"
            else:
                why = (f"{need[0]} blocks along x cover the {N} columns, {need[1]} along y "
                       f"the {M} rows")
            raise ExerciseError(f"M={M}, N={N}: {HINTS['grid']}: {grid[:2]} blocks of {BN} x "
                                f"{BM} threads cover {grid[0] * BN} columns and {grid[1] * BM} "
                                f"rows: {why}")

    kernel = _LaunchRecorder(_rect_tiled(BM, BN), inspect)

    def run(a, b, c):
        before = kernel.launches
        launcher(kernel, a, b, c)
        if kernel.launches == before:
            raise ExerciseError("my_launcher did not launch the kernel (kernel[grid, block](...))")

    return str(check_product(run, "my_launcher", cases=_small_suite(
        ("square", "rectangular", "ragged", "M=1", "N=1"))))


def ex02_loads(fn):
    """Lesson 02, exercise 3: global loads per element of C, counted by the learner in a
    trace of the launch it is given (the tiled kernel on shapes that are and are not
    multiples of the tile, and lesson 01's coalesced kernel): a formula cannot pass."""
    from . import counters
    from .kernels.k01_naive import coalesced
    launches = (("the tiled kernel (T = 16)", _ref_launch02, 32, 32, 32),
                ("the tiled kernel (T = 16)", _ref_launch02, 16, 32, 48),
                ("the tiled kernel (T = 16), a ragged shape", _ref_launch02, 20, 20, 24),
                ("lesson 01's k01_coalesced", coalesced, 16, 16, 8))
    for what, launcher, M, N, K in launches:
        with _answer("global_loads_per_element"):
            got = fn(launcher, M, N, K)
        a, b = harness.make_operands(M, N, K)
        c = torch.empty(M, N)
        with counters.trace(A=a, B=b, C=c) as t:
            launcher(a, b, c)
        glob = sum(1 for x in t.accesses if x.space == "global" and x.op == "load")
        want = glob / (M * N)
        if isinstance(got, (int, float)) and math.isclose(got, want):
            continue
        shared = sum(1 for x in t.accesses if x.space == "shared" and x.op == "load")
        stores = sum(1 for x in t.accesses if x.space == "global" and x.op == "store")
        mistakes = [
            ((glob + shared) / (M * N), "shared loads counted too: count only the accesses "
             "whose space is 'global'"),
            ((glob + stores) / (M * N), "stores counted too: count only the accesses whose op "
             "is 'load'"),
            (glob, "the total, not per element: divide by M * N"),
            (2 * K / T02, f"the formula 2K / T holds for the {T02} x {T02} tiled kernel on "
             "multiples of the tile only: count the loads the launch makes (t.accesses)"),
            (2 * K, "the formula 2K holds for lesson 01's kernel only: count the loads the "
             "launch makes (t.accesses)"),
        ]
        why = next((w for v, w in mistakes
                    if isinstance(got, (int, float)) and math.isclose(got, v)),
                   "count the accesses with space 'global' and op 'load' of the launch, then "
                   "divide by M * N")
        raise ExerciseError(
            f"{what}, M={M}, N={N}, K={K}: {got!r} global loads per element of C, the trace "
            f"counts {want:g}.\nLikely cause: {why}")
    return ("global loads per element of C, counted: 2K / T for the tiled kernel on multiples "
            "of the tile, more on a ragged shape; 2K for lesson 01's kernel")


_rect02 = {}


def _rect_tiled(BM, BN, BK=4):
    """A tiled kernel with a BM x BN tile of C per block of BM x BN threads: per K-tile the
    block loads the BM x BK tile of A and the BK x BN tile of B, each element once, and
    stores 0 (loads nothing) for elements outside A or B."""
    key = (BM, BN, BK)
    if key not in _rect02:
        _numba_globals()

        @cuda.jit
        def rect_tiled(A, B, C):
            sA = cuda.shared.array((BM, BK), float32)
            sB = cuda.shared.array((BK, BN), float32)
            M, K = A.shape
            N = B.shape[1]
            tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
            tid = ty * BN + tx
            m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
            acc = float32(0.0)
            for k0 in range(0, K, BK):
                for e in range(tid, BM * BK, BM * BN):
                    r, kk = e // BK, e % BK
                    sA[r, kk] = A[m0 + r, k0 + kk] if m0 + r < M and k0 + kk < K else 0.0
                for e in range(tid, BK * BN, BM * BN):
                    kk, c = e // BN, e % BN
                    sB[kk, c] = B[k0 + kk, n0 + c] if k0 + kk < K and n0 + c < N else 0.0
                cuda.syncthreads()
                for kk in range(BK):
                    acc += sA[ty, kk] * sB[kk, tx]
                cuda.syncthreads()
            if m0 + ty < M and n0 + tx < N:
                C[m0 + ty, n0 + tx] = acc
        _rect02[key] = rect_tiled
    return _rect02[key]


_loads02 = {}


def _measured_loads(M, N, K, BM, BN):
    """Global loads of one launch of the BM x BN tiled kernel, counted by counters.trace
    (and the product checked, so that the count is of a correct kernel)."""
    key = (M, N, K, BM, BN)
    if key not in _loads02:
        from . import counters
        kernel = _rect_tiled(BM, BN)
        a, b = harness.make_operands(M, N, K)
        c = torch.full((M, N), float("nan"))
        with counters.trace(A=a, B=b, C=c) as t:
            _sim(kernel, (_cdiv(N, BN), _cdiv(M, BM)), (BN, BM), a, b, c)
        ok, _, _ = harness.compare(c, harness.reference(a, b), a, b, torch.float32)
        assert ok, "the reference tiled kernel is wrong"
        _loads02[key] = sum(1 for x in t.accesses if x.space == "global" and x.op == "load")
    return _loads02[key]


def ex02_reuse(global_loads):
    """Lesson 02, exercise 4: the global loads of a BM x BN tiled launch on any shape
    (partial edge tiles, masked loads), checked against the simulator's count."""
    cases = ((16, 16, 8, 8, 8), (24, 12, 10, 8, 4), (20, 12, 10, 8, 4), (7, 30, 5, 4, 16),
             (33, 9, 3, 16, 8))
    for M, N, K, BM, BN in cases:
        with _answer("global_loads"):
            got = global_loads(M, N, K, BM, BN)
        want = _measured_loads(M, N, K, BM, BN)
        if got == want:
            continue
        cm, cn = _cdiv(M, BM), _cdiv(N, BN)
        mistakes = [
            (M * K * (N / BN) + K * N * (M / BM), "the block count is rounded up: a partial "
             "block column at the right edge still loads its rows of A (and a partial block "
             "row its columns of B)"),
            (M * K * (N // BN) + K * N * (M // BM), "the block count is rounded up: a partial "
             "block column at the right edge still loads its rows of A (and a partial block "
             "row its columns of B)"),
            (cm * BM * _cdiv(K, 4) * 4 * cn + _cdiv(K, 4) * 4 * cn * BN * cm, "masked loads: "
             "a tile element outside A or B is stored as 0 without a load"),
            (cn * BN * K * cm + K * cm * BM * cn, "masked loads: a tile element outside A or B "
             "is stored as 0 without a load"),
            (M * K * _cdiv(N, BM) + K * N * _cdiv(M, BN), "BM and BN swapped: an element of A "
             "is loaded once by each block of its block row, that is once per block column "
             "(cdiv(N, BN) times)"),
            (M * K * cm + K * N * cn, "BM and BN swapped: an element of A is loaded once by "
             "each block of its block row, that is once per block column (cdiv(N, BN) times)"),
            (2 * K * M * N / BM, "the lesson's 2K / T holds for square tiles: here A and B "
             "are reused by different factors"),
            (M * K + K * N, "each block loads its own tiles: an element of A is loaded by every "
             "block of its block row"),
        ]
        why = next((w for v, w in mistakes if isinstance(got, (int, float)) and got == v),
                   "count per block: the rows of A and the columns of B it covers, inside A "
                   "and B, times K")
        raise ExerciseError(
            f"M={M}, N={N}, K={K}, BM={BM}, BN={BN}: {got!r} global loads, the simulator counts "
            f"{want}.\nLikely cause: {why}")
    return ("global_loads: right on 5 launches (partial edge tiles, masked loads): each "
            "element of A is loaded once per block column, each element of B once per block "
            "row")


# ------------------------------------------------------------------ lesson 03
def ex03_ways(ways):
    """Lesson 03, exercise 1: the bank-conflict degree of a warp request."""
    import random
    rng = random.Random(3)
    cases = {"consecutive": list(range(32)), "broadcast": [7] * 32,
             "stride 2": list(range(0, 64, 2)), "column of 32 x 32": [32 * i for i in range(32)],
             "column of 32 x 33": [33 * i for i in range(32)], "stride 8": [8 * i for i in range(32)],
             "pairs": [i // 2 for i in range(32)]}
    for i in range(5):
        cases[f"random {i}"] = [rng.randrange(256) for _ in range(32)]

    def truth(words, nbanks=32, distinct=True):
        banks = defaultdict(list)
        for w in words:
            if not distinct or w not in banks[w % nbanks]:
                banks[w % nbanks].append(w)
        return max(len(s) for s in banks.values())

    for name, words in cases.items():
        with _answer("ways"):
            got = ways(list(words))
        want = truth(words)
        if got != want:
            if got == truth(words, distinct=False):
                why = "lanes reading the same word are one broadcast: count distinct words"
            elif got == truth(words, nbanks=16):
                why = "shared memory has 32 banks: word w is in bank w % 32"
            else:
                why = "the busiest bank decides: distinct words per bank w % 32"
            raise ExerciseError(f"{name}: words {words[:6]}...: got {got}-way, expected "
                                f"{want}-way ({why})")
    return "ways: right on 12 requests (broadcasts, strides, random)"


def ex03_swizzle(run_swizzled):
    """Lesson 03, exercise 2: the swizzled store and read; conflict-free and correct."""
    from . import counters
    with barrier_audit() as audit:
        try:
            report = check_product(run_swizzled, "swizzled",
                                   cases=_small_suite(("square", "ragged", "K=1", "A transposed")),
                                   audit=audit)
        except ExerciseError as e:
            text = str(e)
            if "\nLikely cause:" in text and not audit.race and "TODO" not in text:
                text = text.split("\nLikely cause:")[0] + (
                    "\nLikely cause: the swizzle: the store and the read must put logical "
                    "element (row, k) at the same place, column (k + row) % 32 of its row")
            raise ExerciseError(text) from None
    a, b = harness.make_operands(32, 8, 32)
    c = torch.empty(32, 8)
    with counters.trace(A=a, B=b, C=c) as t:
        run_swizzled(a, b, c)
    worst = t.max_shared_ways()
    if worst != 1:
        raise ExerciseError(f"a shared-memory request is {worst}-way: the store and the read "
                            "must spread a column of the logical tile over 32 banks")
    return f"{report}; every shared-memory request is 1-way, with a 32 x 32 tile"


def _ways_of_words(words):
    banks = defaultdict(set)
    for w in words:
        banks[w % 32].add(w)
    return max(len(s) for s in banks.values())


def _bank_of(i, k, width, pad, elem_bytes, *, use_pad=True, use_bytes=True, nbanks=32,
             transposed=False, words=True):
    row = width + pad if use_pad else width
    e = elem_bytes if use_bytes else 4
    off = (k * row + i) if transposed else (i * row + k)
    if not words:
        return (off * e) % nbanks
    if not use_bytes:
        return off % nbanks
    return (off * e // 4) % nbanks


def ex03_bank(bank):
    """Lesson 03, exercise 3: the bank of element (i, k) of a shared tile whose rows are
    ``width + pad`` elements of ``elem_bytes`` bytes."""
    points = [(i, k, width, pad, e) for e in (4, 2, 1) for width in (32, 8, 16, 64)
              for pad in (0, 1, 2, 4) for i in range(32)
              for k in sorted({0, 1, 3, width - 1})]
    with _answer("bank"):
        got = [bank(*p) for p in points]
    want = [_bank_of(*p) for p in points]
    if got != want:
        mistakes = [
            (dict(use_pad=False), "the padding: a padded row is width + pad elements long"),
            (dict(use_bytes=False), "the element size: offsets count elements, banks count "
             "4-byte words (how many bytes from the start of the tile is the element?)"),
            (dict(transposed=True), "rows and columns: the tile is stored row after row "
             "(row-major): element (i, k) comes after i whole rows and k elements of its row"),
            (dict(nbanks=16), "the number of banks: shared memory has 32 banks"),
            (dict(words=False), "bytes, not words: a bank is 4 bytes wide (byte offset // 4, "
             "then % 32)"),
        ]
        why = next((w for flags, w in mistakes
                    if got == [_bank_of(*p, **flags) for p in points]), None)
        if why is None and any(isinstance(g, float) for g in got):
            why = ("a whole word: elements smaller than 4 bytes share their 4-byte word "
                   "(integer division, //)")
        j = next(n for n, (g, w) in enumerate(zip(got, want)) if g != w)
        i, k, width, pad, e = points[j]
        why = why or ("the byte offset of element (i, k), divided by the 4 bytes of a word, "
                      "then modulo 32")
        raise ExerciseError(
            f"bank(i={i}, k={k}, width={width}, pad={pad}, elem_bytes={e}) = {got[j]!r}, "
            f"expected {want[j]}.\nLikely cause: {why}")
    ways = {}
    for e, pad in ((4, 0), (4, 1), (2, 0), (2, 1), (2, 2), (1, 0), (1, 4)):
        ways[(e, pad)] = _ways_of_words(
            [(i * (32 + pad) * e) // 4 for i in range(32)])
    text = ", ".join(f"{e}-byte pad {p}: {w}-way" for (e, p), w in ways.items())
    return f"bank: right on {len(points)} elements; a column read of a 32-wide tile: {text}"


_swz03 = {}


def _swizzled_k8(swizzle, BN=4):
    """Lesson 03's column-walk kernel with a 32 x 8 tile of A (BK = 8, no padding): element
    (r, c) of the tile is stored at column swizzle(r, c) of its row, and read from there."""
    _numba_globals()
    BK = 8

    @cuda.jit
    def swizzled_k8(A, B, C):
        sA = cuda.shared.array((32, BK), float32)   # (m, k), swizzled columns
        sB = cuda.shared.array((BK, BN), float32)   # (k, n)
        M, K = A.shape
        N = B.shape[1]
        lane = cuda.threadIdx.x                     # row of the C tile
        ty = cuda.threadIdx.y                       # column of the C tile
        tid = ty * 32 + lane
        m0 = cuda.blockIdx.y * 32
        n0 = cuda.blockIdx.x * BN
        acc = float32(0.0)
        for k0 in range(0, K, BK):
            for e in range(tid, 32 * BK, 32 * BN):  # a warp stores 4 rows of 8
                r = e // BK
                c = e % BK
                v = float32(0.0)
                if m0 + r < M and k0 + c < K:
                    v = A[m0 + r, k0 + c]
                sA[r, swizzle(r, c)] = v
            if tid < BK * BN:
                kr = tid // BN
                c = tid % BN
                sB[kr, c] = B[k0 + kr, n0 + c] if k0 + kr < K and n0 + c < N else 0.0
            cuda.syncthreads()
            for k in range(BK):                     # the warp walks down column k
                acc += sA[lane, swizzle(lane, k)] * sB[k, ty]
            cuda.syncthreads()
        if m0 + lane < M and n0 + ty < N:
            C[m0 + lane, n0 + ty] = acc

    def run(a, b, c):
        M, N = c.shape
        _sim(swizzled_k8, (_cdiv(N, BN), _cdiv(M, 32)), (32, BN), a, b, c)
    return run


def ex03_xor_swizzle(swizzle):
    """Lesson 03, exercise 4: an XOR swizzle of a 32 x 8 float32 tile: every row a
    permutation of its 8 columns, every column walk of a warp 1-way; then in the kernel."""
    import numbers
    from . import counters
    with _answer("swizzle"):
        table = [[swizzle(r, c) for c in range(8)] for r in range(32)]
    odd = next((v for row in table for v in row if not isinstance(v, numbers.Integral)), None)
    if odd is not None:
        raise ExerciseError(f"swizzle returned {odd!r}: return a column, an int from 0 to 7")
    for r, row in enumerate(table):
        if sorted(row) != list(range(8)):
            raise ExerciseError(
                f"row {r}: columns 0..7 go to {row}: a swizzle must send the 8 columns of a "
                "row to the columns 0..7, each once (a permutation); otherwise two elements "
                "share a place or one falls outside the row (XOR with a value from 0 to 7 "
                "stays within 0..7)")
    for k in range(8):
        words = [8 * i + table[i][k] for i in range(32)]
        w = _ways_of_words(words)
        if w > 1:
            by_bank = defaultdict(list)
            for i, word in enumerate(words):
                by_bank[word % 32].append(i)
            lanes = max(by_bank.values(), key=len)
            raise ExerciseError(
                f"column {k}: a warp reading sA[lane, {k}] is {w}-way: lanes {lanes[:4]} "
                f"land in bank {words[lanes[0]] % 32}. A row is 8 words, so rows i and i + 4 "
                "start in the same bank: the 8 rows with the same i % 4 need 8 different "
                "columns for column k (what of the row tells them apart?)")
    run = _swizzled_k8(swizzle)
    report = check_product(run, "swizzle in the kernel", cases=_small_suite(("square", "ragged")))
    a, b = harness.make_operands(32, 8, 16)
    c = torch.empty(32, 8)
    with counters.trace(A=a, B=b, C=c) as t:
        run(a, b, c)
    worst = t.max_shared_ways()
    if worst != 1:
        raise ExerciseError(f"in the kernel a shared-memory request is {worst}-way")
    return (f"{report}; every row a permutation, every shared-memory request 1-way "
            "(column walks and tile stores)")


# ------------------------------------------------------------------ lesson 04
_k04 = {}


def k04_helpers(TM, TN, TROWS, TCOLS):
    """(outer_step, store_tile): the two halves of a thread's work in the exercises' strided
    register tile (thread (tm, tn) owns rows tm + i * TROWS and columns tn + j * TCOLS of
    the block tile), as device functions, so that each exercise writes one half and gets
    the other done: ``outer_step(sA, sB, rA, rB, acc, k, tm, tn)`` adds one k's outer
    product into ``acc``; ``store_tile(C, acc, row0, col0)`` writes the thread's tile of C,
    ``acc[i, j]`` at ``(row0 + i * TROWS, col0 + j * TCOLS)``."""
    key = (TM, TN, TROWS, TCOLS)
    if key not in _k04:
        _numba_globals()

        @cuda.jit(device=True)
        def outer_step(sA, sB, rA, rB, acc, k, tm, tn):
            for i in range(TM):
                rA[i] = sA[tm + i * TROWS, k]
            for j in range(TN):
                rB[j] = sB[k, tn + j * TCOLS]
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += rA[i] * rB[j]

        @cuda.jit(device=True)
        def store_tile(C, acc, row0, col0):
            for i in range(TM):
                for j in range(TN):
                    if row0 + i * TROWS < C.shape[0] and col0 + j * TCOLS < C.shape[1]:
                        C[row0 + i * TROWS, col0 + j * TCOLS] = acc[i, j]

        _k04[key] = (outer_step, store_tile)
    return _k04[key]


_STRIDED = ("the strided layout: acc[i, j] is row tm + i * TROWS, column tn + j * TCOLS of the "
            "block tile (rA[i] from that row of sA, rB[j] from that column of sB)")


def _layout_hint(e):
    text = str(e)
    if ("\nLikely cause:" in text and "never written" not in text and "inf in C" not in text
            and "barrier" not in text and "TODO" not in text):
        text = text.split("\nLikely cause:")[0] + "\nLikely cause: " + _STRIDED
    return ExerciseError(text)


def ex04_outer(run_2d, TM, TN):
    """Lesson 04, exercise 1: fragments and their outer product."""
    from . import counters
    with barrier_audit() as audit:
        try:
            report = check_product(run_2d, "my_2d", cases=_small_suite(
                ("square", "ragged", "M=1", "K=1")), audit=audit)
        except ExerciseError as e:
            raise _layout_hint(e) from None
    M = N = 16
    K = 8
    a, b = harness.make_operands(M, N, K)
    c = torch.empty(M, N)
    with counters.trace(A=a, B=b, C=c) as t:
        run_2d(a, b, c)
    loads = sum(1 for x in t.accesses if x.space == "shared" and x.op == "load")
    per_fma = loads / (M * N * K)
    if per_fma > (TM + TN) / (TM * TN) + 1e-9:
        raise ExerciseError(
            f"{per_fma:.2f} shared loads per multiply-add; a {TM} x {TN} register tile needs "
            f"only {(TM + TN) / (TM * TN):.2f}: load each fragment value once per k, not once "
            "per multiply-add")
    return f"{report}; shared loads per multiply-add: {per_fma:.2f} (lesson 02: 2)"


def ex04_store(run_2d_store):
    """Lesson 04, exercise 2: the masked store of a thread's tile."""
    try:
        return str(check_product(run_2d_store, "my_2d_store", cases=_small_suite(
            ("square", "ragged", "M=1", "N=1", "rectangular"))))
    except ExerciseError as e:
        raise _layout_hint(e) from None


# ------------------------------------------------------------------ lesson 05
def ex05_warp_tile(run, FM, FN):
    """Lesson 05, exercise 1: the warp's tensor-core step."""
    from . import ptx
    try:
        report = check_product(run, "my_wmma", (torch.float16,), cases=_small_suite(
            ("square", "ragged", "M=1", "K=1", "A transposed")))
    except ExerciseError as e:
        text = str(e)
        if "\nLikely cause:" in text and "TODO" not in text:
            text = text.split("\nLikely cause:")[0] + (
                "\nLikely cause: the fragment offsets: fragment i of A starts at row i * 16, "
                "column kk of sA; fragment j of B at row kk, column j * 16 of sB; the product "
                "(i, j) pairs rA[i] with rB[j] into acc[i, j]")
        raise ExerciseError(text) from None
    calls, lock, real = [0], threading.Lock(), ptx.wmma_mma

    def counted(*args):
        with lock:
            calls[0] += 1
        return real(*args)

    ptx.wmma_mma = counted
    try:
        a, b = harness.make_operands(32, 32, 32, torch.float16)
        run(a, b, torch.empty(32, 32, dtype=torch.float16))
    finally:
        ptx.wmma_mma = real
    want = 32 * 2 * FM * FN
    if calls[0] != want:
        raise ExerciseError(f"wmma_mma was called {calls[0]} times by the warp's 32 lanes for "
                            f"K = 32; expected {want}: FM x FN = {FM * FN} per 16-deep step")
    return f"{report}; one wmma_mma per fragment of C per 16-deep step"


def _ldmatrix_ways(row_bytes):
    banks = [set() for _ in range(32)]
    for r in range(8):
        for w in range(4):
            word = r * row_bytes // 4 + w
            banks[word % 32].add(word)
    return max(len(s) for s in banks)


def ex05_pad(smallest_pad):
    """Lesson 05, exercise 2: the smallest conflict-free padding, for several row lengths
    and element sizes (the answer is not always the same)."""
    answers = set()
    for elem in (2, 4):
        step = 16 // elem
        for row in (8, 16, 24, 32, 40, 48, 64, 96, 128):
            want = next(p for p in range(0, 33 * step, step)
                        if _ldmatrix_ways((row + p) * elem) == 1)
            with _answer("smallest_pad", seconds=3):
                got = smallest_pad(row, elem)
            answers.add(want)
            if got != want:
                more = ""
                if isinstance(got, int) and got % step:
                    more = f" ({got} is not a multiple of {step} elements: rows must stay 16-byte aligned)"
                elif isinstance(got, int) and got > want:
                    more = " (not the smallest)"
                elif isinstance(got, int):
                    more = f" (rows {(row + got) * elem} bytes apart leave a {_ldmatrix_ways((row + got) * elem)}-way conflict)"
                raise ExerciseError(f"rows of {row} elements of {elem} bytes: pad {got!r}, "
                                    f"expected {want}{more}")
    return (f"smallest_pad: right for 18 row lengths and element sizes "
            f"(pads {', '.join(map(str, sorted(answers)))})")


# ------------------------------------------------------------------ lesson 06
def _landing_modes():
    """The cp.async landing modes to run the pipeline under: the default (at the wait) and,
    where ptx offers it, a few seeds of the random mode."""
    from . import ptx
    modes = [None]
    if hasattr(ptx, "cp_async_landing"):
        modes += [("random", s) for s in (1, 2, 3)]
    return modes


def ex06_pipeline(run, k_tiles_of_long=7):
    """Lesson 06, exercise 1: the double-buffered loop. Correct results under every landing
    mode, no race found by the audit, and copies in flight while the tensor cores compute."""
    from . import ptx
    long_k = harness.Case("long K", 24, 40, 100,
                          hint="the pipeline over 7 tiles: is every tile waited for?")
    cases = _small_suite(("square", "ragged", "K=1")) + [long_k]
    report = None
    overlapped = reads = 0
    for mode in _landing_modes():
        ctx = (ptx.cp_async_landing(mode[0], seed=mode[1]) if mode else contextlib.nullcontext())
        with ctx, pipeline_audit() as audit:
            report = check_product(run, "my_pipeline", (torch.float16,), cases, audit=audit)
        overlapped += audit.reads_overlapped
        reads += audit.reads
    if reads and overlapped == 0:
        raise ExerciseError(
            f"{HINTS['overlap']}: every tensor-core read happened with no copy of this thread "
            "pending. The loop is serial: start the copy of tile t + 1 (issue) before "
            "compute(t), so that it runs while the tensor cores work")
    return f"{report}; a copy in flight during compute, no race found"


def _pipeline_smem(BM, BN, BK, stages, pad):
    return stages * (BM * (BK + pad) + BK * (BN + pad)) * 2


def ex06_budget(pipeline_smem, max_stages):
    """Lesson 06, exercise 2: the shared-memory budget of a pipeline."""
    for BM, BN, BK in ((128, 256, 32), (128, 128, 64), (64, 64, 32)):
        for stages in (1, 2, 4):
            for pad in (0, 8):
                want = _pipeline_smem(BM, BN, BK, stages, pad)
                with _answer("pipeline_smem", seconds=10):
                    got = pipeline_smem(BM, BN, BK, stages, pad=pad)
                if got != want:
                    raise ExerciseError(f"pipeline_smem({BM}, {BN}, {BK}, {stages}, pad={pad}) = "
                                        f"{got!r}, expected {want}: stages x (BM x (BK + pad) + "
                                        "BK x (BN + pad)) elements of 2 bytes")
    for BM, BN, BK, limit in ((128, 256, 32, 227 * 1024), (128, 128, 32, 48 * 1024),
                              (64, 64, 64, 100 * 1024), (256, 128, 64, 227 * 1024)):
        want = limit // _pipeline_smem(BM, BN, BK, 1, 8)
        with _answer("max_stages", seconds=10):
            got = max_stages(BM, BN, BK, limit=limit)
        if got != want:
            raise ExerciseError(f"max_stages({BM}, {BN}, {BK}, limit={limit}) = {got!r}, "
                                f"expected {want}: the largest number of stages whose "
                                "pipeline_smem is at most the limit")
    return "pipeline_smem and max_stages: right on 22 configurations"


# ------------------------------------------------------------------ lesson 07
def _grouped(pid, num_pid_m, num_pid_n, g):
    in_group = g * num_pid_n
    first = (pid // in_group) * g
    size = min(num_pid_m - first, g)
    return first + (pid % in_group) % size, (pid % in_group) // size


def ex07_order(order):
    """Lesson 07, exercise 1: the grouped tile order (a bijection, grouped, ragged)."""
    for num_pid_m in range(1, 12):
        for num_pid_n in range(1, 9):
            for g in (1, 2, 3, 4, 8):
                with _answer("my_grouped_order", seconds=20):
                    tiles = [tuple(order(p, num_pid_m, num_pid_n, g))
                             for p in range(num_pid_m * num_pid_n)]
                want = [_grouped(p, num_pid_m, num_pid_n, g) for p in range(num_pid_m * num_pid_n)]
                if tiles == want:
                    continue
                seen = set(tiles)
                missing = [(m, n) for m in range(num_pid_m) for n in range(num_pid_n)
                           if (m, n) not in seen]
                if missing or len(seen) != len(tiles):
                    raise ExerciseError(
                        f"grid {num_pid_m} x {num_pid_n} tiles, group_size_m={g}: tiles "
                        f"{missing[:4]} are never computed and {len(tiles) - len(seen)} are "
                        "computed twice" + (" (is the last, ragged group handled?)"
                                            if num_pid_m % g else ""))
                p = next(i for i, (x, y) in enumerate(zip(tiles, want)) if x != y)
                raise ExerciseError(
                    f"{HINTS['order']}: grid {num_pid_m} x {num_pid_n}, group_size_m={g}: "
                    f"program {p} gets tile {tiles[p]}, the grouped order gives {want[p]} "
                    "(inside a group, consecutive programs walk down a column of tiles)")
    return "my_grouped_order: the grouped order on 440 grids, ragged groups included"


def ex07_kernel(kernel):
    """Lesson 07, exercise 2: the Triton kernel (grouped mapping + masked K loop)."""
    from . import interp_poison
    from .kernels import k07_triton_swizzle as k07

    def run(a, b, c):
        k07.matmul(a, b, c, kernel=kernel)

    with interp_poison.poison_masked_loads() as poison:
        try:
            report = check_product(run, "my_kernel", (torch.float16, torch.float32),
                                   _small_suite(("square", "rectangular", "ragged", "M=1",
                                                 "K=1", "A transposed")))
        except ExerciseError as e:
            text = str(e)
            if poison.poisoned and ("NaN" in text or "nan" in text):
                text = text.split("\nLikely cause:")[0] + (
                    f"\nLikely cause: {HINTS['other']}: lanes the mask switches off are "
                    "undefined on a GPU (NaN here) and reach tl.dot; give the K-tile loads "
                    "other=0.0")
            raise ExerciseError(text) from None
        # partial K-tiles inside larger buffers: reads past K would find nonzero values
        big_a, big_b = torch.randn(24, 64).half(), torch.randn(64, 20).half()
        a, b = big_a[:, :21], big_b[:21]
        c = torch.full((24, 20), float("nan"), dtype=torch.float16)
        with _answer("my_kernel"):
            run(a, b, c)
        ok, _, _ = harness.compare(c, harness.reference(a, b), a, b, torch.float16)
        if not ok:
            raise ExerciseError(f"K = 21 is wrong when the operands continue past K: "
                                f"{HINTS['mask']} on the K-tile loads (offs_k < k_left)")
    # the tile order: 10 x 3 tiles of 16 x 16, GROUP_SIZE_M = 8 (row-major differs)
    a, b = harness.make_operands(160, 48, 16, torch.float16)
    c = torch.full((160, 48), float("nan"), dtype=torch.float16)
    with interp_poison.record_stores(c) as rec, _answer("my_kernel"):
        run(a, b, c)
    if rec.active:
        cfg = k07.config_for(torch.float16)
        BM, BN = cfg[0], cfg[1]
        got = []
        for _pid, offs in rec.order():
            first = min(offs)
            got.append((first // 48 // BM, first % 48 // BN))
        nm, nn = _cdiv(160, BM), _cdiv(48, BN)
        want = [_grouped(p, nm, nn, k07.GROUP_SIZE_M) for p in range(nm * nn)]
        if got != want:
            p = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), len(got))
            rowmajor = [(q // nn, q % nn) for q in range(nm * nn)]
            what = " (that is row-major order)" if got == rowmajor else ""
            raise ExerciseError(
                f"{HINTS['order']}: with {nm} x {nn} tiles and GROUP_SIZE_M = "
                f"{k07.GROUP_SIZE_M}, program {p} computed tile "
                f"{got[p] if p < len(got) else None}, the grouped order gives "
                f"{want[p] if p < len(want) else None}{what}: map pid to (pid_m, pid_n) as in "
                "exercise 1, with tl.minimum for the ragged last group")
    return f"{report}; partial K-tiles masked; tiles in grouped order"


def ex07_wave(first_wave):
    """Lesson 07, exercise 3: the L2 model of the first wave (given a correct tile order)."""
    from .kernels import k07_triton_swizzle as k07
    for M, N in [(8192, 8192), (4096, 4096), (16384, 2048), (500, 700), (1024, 65536)]:
        for g in (1, 4, 8):
            for programs in (132, 7):
                want = k07.first_wave(M, N, 128, 256, g, programs)
                with _answer("my_first_wave", seconds=20):
                    got = first_wave(M, N, 128, 256, g, programs, _grouped)
                if tuple(got) != tuple(want):
                    raise ExerciseError(f"{M} x {N}, GROUP_SIZE_M={g}, {programs} programs: got "
                                        f"{got} (A strips, B strips), expected {tuple(want)}")
    rows = first_wave(8192, 8192, 128, 256, 1, 132, _grouped)
    grouped = first_wave(8192, 8192, 128, 256, 8, 132, _grouped)
    return (f"my_first_wave: right on 30 grids and waves. 8192 x 8192, one wave of 132: "
            f"row-major {rows[0]} + {rows[1]} strips, grouped {grouped[0]} + {grouped[1]}")


# ------------------------------------------------------------------ lesson 08
_CASES08 = ("square", "ragged", "K=1", "A transposed")


def ex08_tuned(tuned):
    """Lesson 08, exercise 1: configs, key and timer of the autotuner."""
    from .kernels import k08_triton_autotune as k08
    keys = sorted(getattr(tuned, "keys", []) or [])
    if keys != ["K", "M", "N"]:
        raise ExerciseError(f"the key is {keys}: re-tune when M, N or K changes "
                            "(key=['M', 'N', 'K'])")
    configs = list(getattr(tuned, "configs", []))
    tiles = sorted((c.kwargs["BLOCK_SIZE_M"], c.kwargs["BLOCK_SIZE_N"], c.kwargs["BLOCK_SIZE_K"])
                   for c in configs)
    if tiles != [(16, 16, 16), (16, 32, 32), (32, 16, 16)]:
        raise ExerciseError(f"{len(configs)} configs with tiles {tiles}: give the three configs "
                            "asked for, 16 x 16 x 16, 32 x 16 x 16 and 16 x 32 x 32")
    report = check_product(lambda a, b, c: k08.matmul(a, b, c, kernel=tuned), "my_tuned",
                           (torch.float16,), _small_suite(_CASES08), seconds=120)
    timed = len(getattr(tuned, "configs_timings", None) or {})
    if timed != 3:
        raise ExerciseError(f"{timed} configs were timed on the last new shape, not 3: is "
                            "do_bench=k08.cpu_timer given?")
    return f"{report}; three configs timed per new (M, N, K)"


def ex08_grid(launcher):
    """Lesson 08, exercise 2: a grid that follows the chosen config. The launcher is run with
    kernels tuned over a single config each, so a fixed grid fails for one of them."""
    import triton
    from .kernels import k07_triton_swizzle as k07
    from .kernels import k08_triton_autotune as k08
    report = None
    for bm, bn, bk in ((16, 16, 16), (32, 16, 16), (16, 32, 32)):
        cfg = triton.Config({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk,
                             "GROUP_SIZE_M": 4}, num_warps=1, num_stages=1)
        tuned = triton.autotune(configs=[cfg], key=["M", "N", "K"],
                                do_bench=k08.cpu_timer)(k07.matmul_kernel)
        try:
            report = check_product(lambda a, b, c: launcher(tuned, a, b, c), "my_launcher",
                                   (torch.float16,), _small_suite(_CASES08))
        except ExerciseError as e:
            raise ExerciseError(f"with the config {bm} x {bn} x {bk}: {e}\n(the {HINTS['grid']} "
                                "for this config? compute it from meta['BLOCK_SIZE_M'] and "
                                "meta['BLOCK_SIZE_N'])") from None
    return f"{report}; every tile written, whichever config won"


def ex08_prune(prune):
    """Lesson 08, exercise 3: prune the configs whose pipeline does not fit."""
    from .kernels import k08_triton_autotune as k08
    configs = [k08.make_config(128, 256, 64, 8, 3), k08.make_config(128, 256, 64, 8, 4),
               k08.make_config(128, 256, 64, 8, 5), k08.make_config(256, 256, 64, 8, 4),
               k08.make_config(128, 128, 128, 8, 3), k08.make_config(64, 64, 32, 4, 6),
               k08.make_config(128, 64, 32, 4, 2)]
    for dtype in (torch.float16, torch.float32, torch.int8):
        size = torch.empty(0, dtype=dtype).element_size()
        want = [k08.label(c) for c in configs
                if c.num_stages * (c.kwargs["BLOCK_SIZE_M"] + c.kwargs["BLOCK_SIZE_N"])
                * c.kwargs["BLOCK_SIZE_K"] * size <= k08.SMEM_LIMIT]
        with _answer("my_prune", seconds=10):
            got = [k08.label(c) for c in prune(list(configs), {"a_ptr": torch.empty(1, dtype=dtype)})]
        if got != want:
            raise ExerciseError(f"{str(dtype).replace('torch.', '')}: kept {got}, expected {want}: "
                                "per stage (BLOCK_SIZE_M + BLOCK_SIZE_N) x BLOCK_SIZE_K elements, "
                                "times num_stages, at most k08.SMEM_LIMIT bytes")
    return "my_prune: num_stages x (A tile + B tile) checked in fp16, fp32 and int8"


# ------------------------------------------------------------------ lesson 09
def _close(out, ref, tol=2e-3):
    return bool(((out.double() - ref).abs() <= tol * (ref.abs() + 1)).all())


def _rand(gen, *shape, dev=None):
    dev = engines.device() if dev is None else dev
    return torch.randn(*shape, generator=gen).to(torch.float16).to(dev)


def ex09_epilogue(my_gemm):
    """Lesson 09, exercise 1: the fused epilogue with BLAS's beta == 0 rule and a bias per
    row of C."""
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(0)
    a, b, c, bias = _rand(gen, 37, 45), _rand(gen, 45, 29), _rand(gen, 37, 29), _rand(gen, 37)
    nan_c = torch.full_like(c, float("nan"))
    with _answer("my_gemm"):
        out = my_gemm(a, b, nan_c, beta=0.0, bias=bias, gelu=True)
    if bool(out.isnan().any()):
        raise ExerciseError("NaN in C reached the output although beta == 0: read C only under "
                            "`if HAS_C:` (0 * NaN is NaN, so multiplying by beta is not enough)")
    report = check_product(lambda a, b, out: my_gemm(a, b, out=out), "my_gemm", (torch.float16,),
                           _small_suite(("square", "ragged", "M=1", "K=1")))
    ab = a.double() @ b.double()
    cases = [
        (0.5, 0.0, False, False, "alpha: multiply the accumulator by alpha"),
        (1.0, -2.0, False, False, "beta: under `if HAS_C:` load the C tile (with `mask`) and add beta times it"),
        (1.0, 0.0, True, False, "the bias: under `if HAS_BIAS:` load the tile's BLOCK_M bias "
                                "values (one per row, masked on M) and add each to its row, "
                                "broadcast across the columns"),
        (1.0, 0.0, True, True, "gelu: under `if GELU:` x = 0.5 * x * (1 + erf(x / sqrt(2))), after the bias"),
        (0.5, 1.5, True, True, "the order: alpha * acc, + beta * C, + bias, then gelu")]
    for alpha, beta, use_bias, gelu, hint in cases:
        ref = alpha * ab + beta * c.double() + (bias.double()[:, None] if use_bias else 0)
        ref = F.gelu(ref) if gelu else ref
        with _answer("my_gemm"):
            out = my_gemm(a, b, c, alpha=alpha, beta=beta, bias=bias if use_bias else None, gelu=gelu)
        if not _close(out, ref):
            err = (out.double() - ref).abs().max().item()
            raise ExerciseError(f"alpha={alpha}, beta={beta}, bias={use_bias}, gelu={gelu}: wrong "
                                f"(largest error {err:.3g}). Likely cause: {hint}")
    return f"{report}; alpha, beta * C, bias and gelu right; beta == 0 never reads C"


def ex09_batch(as_batch):
    """Lesson 09, exercise 2: a broadcast operand as a stride-0 view."""
    import torch.nn.functional as F
    from .kernels import k09_fused_epilogue as k09
    gen = torch.Generator().manual_seed(1)
    x, W, bias = _rand(gen, 5, 40, 24), _rand(gen, 24, 36), _rand(gen, 36)
    with _answer("as_batch"):
        W3, x3, one = as_batch(W, 5), as_batch(x, 5), as_batch(W.unsqueeze(0), 5)
        W7 = as_batch(W, 7)
    for got, B in ((W3, 5), (W7, 7)):
        if tuple(got.shape) != (B, 24, 36):
            raise ExerciseError(f"as_batch(W, {B}) has shape {tuple(got.shape)}, not ({B}, 24, 36)")
        if got.data_ptr() != W.data_ptr() or got.stride(0) != 0:
            raise ExerciseError(f"as_batch(W, {B}) has strides {got.stride()}: the batch stride "
                                "must be 0 and the memory W's own (expand makes a view; repeat "
                                "and contiguous copy)")
        if not torch.equal(got[B - 1], W):
            raise ExerciseError(f"as_batch(W, {B})[{B - 1}] is not W")
    if x3.data_ptr() != x.data_ptr() or x3.stride() != x.stride():
        raise ExerciseError("a batch of 5 stays as it is (same memory, same strides)")
    if one.stride(0) != 0 or one.data_ptr() != W.data_ptr() or tuple(one.shape) != (5, 24, 36):
        raise ExerciseError("a batch of 1 is broadcast too (stride 0 along the batch)")
    out = torch.full((5, 40, 36), float("nan"), dtype=torch.float16, device=x.device)
    k09.fused_gemm(x3, W3, None, out, 1.0, 0.0, bias, "relu")
    if not _close(out, F.relu(x.double() @ W.double() + bias.double())):
        raise ExerciseError("the batched GEMM on your views is wrong")
    return "as_batch: batch stride 0, no copy; the batched GEMM matches float64"


def _splitk_launch(kernel, ws, bias, M, N):
    import triton
    S = ws.shape[0]
    out = torch.full((M, N), float("nan"), dtype=torch.float16, device=ws.device)
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    kernel[grid](ws, bias, out, M, N, S, ws.stride(0), ws.stride(1), out.stride(0),
                 BLOCK_M=16, BLOCK_N=16)
    return out


def ex09_splitk(kernel):
    """Lesson 09, exercise 3: the second pass of split-K (sum the slices in fp32, then the
    bias and gelu once)."""
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(2)
    M, N, K = 37, 29, 200
    a, b, bias = _rand(gen, M, K), _rand(gen, K, N), _rand(gen, N)
    ref = F.gelu(a.double() @ b.double() + bias.double())
    # partial sums that nearly cancel: 1000.3 - 999.9 + ... is fine in fp32, not in fp16
    dev = bias.device
    base = torch.randn(M, N, generator=gen).to(dev)
    big = torch.full((M, N), 1000.0, device=dev) + torch.rand(M, N, generator=gen).to(dev)
    ws = torch.stack([big, -big + base, big, -big])
    zero_bias = torch.zeros(N, dtype=torch.float16, device=dev)
    with _answer("my_splitk_reduce"):
        out = _splitk_launch(kernel, ws, zero_bias, M, N)
    want = F.gelu(ws.double().sum(0))
    cancel_error = None
    if not _close(out, want):
        err = (out.double() - want).abs().max().item()
        half = torch.zeros(M, N, dtype=torch.float16, device=dev)
        for s in range(ws.shape[0]):
            half = half + ws[s].to(torch.float16)
        if _close(out, F.gelu(half.double()), tol=2e-2):
            raise ExerciseError(
                f"slices of about +-1000 that cancel: largest error {err:.3g}. Likely cause: "
                f"{HINTS['accumulator']}: sum the fp32 slices in an fp32 accumulator (fp16 "
                "keeps 11 bits: steps of 0.5 near 1000)")
        cancel_error = (f"slices of about +-1000 that cancel: largest error {err:.3g}. Likely "
                        "cause: sum all S slices first, then the bias and gelu once")
    for S in (1, 3, 8):
        edges = [K * s // S for s in range(S + 1)]
        ws = torch.stack([a[:, lo:hi].float() @ b[lo:hi].float()
                          for lo, hi in zip(edges, edges[1:])])
        with _answer("my_splitk_reduce"):
            out = _splitk_launch(kernel, ws, bias, M, N)
        if bool(out.isnan().all()):
            raise ExerciseError(f"S={S}: nothing was written (all NaN): {HINTS['todo']}, or "
                                "the tile is never stored")
        if bool(out.isnan().any()):
            raise ExerciseError(f"S={S}: NaN in the output: a load outside the workspace or "
                                "the bias ({HINTS['mask']}, or other=0.0)")
        if S > 1:
            per_slice = F.gelu(ws.double() + bias.double()).sum(0)
            if _close(out, per_slice):
                raise ExerciseError(f"S={S}: the bias and gelu were applied to each slice; "
                                    "they must wait for the full sum")
            if _close(out, F.gelu(ws.double().sum(0) + S * bias.double())):
                raise ExerciseError(f"S={S}: the bias was added once per slice")
        if _close(out, ws.double().sum(0) + bias.double()):
            raise ExerciseError(f"S={S}: gelu is missing (0.5 * x * (1 + erf(x / sqrt(2))))")
        if _close(out, F.gelu(ws.double().sum(0))):
            raise ExerciseError(f"S={S}: the bias is missing")
        if not _close(out, ref):
            raise ExerciseError(f"S={S}: wrong. Likely cause: sum all S slices "
                                "(for s in range(0, S): acc += tl.load(...)), then bias, then gelu")
    if cancel_error:
        raise ExerciseError(cancel_error)
    return "split-K reduction: slices summed in fp32 first, then bias and gelu once"
