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
import re
import signal
import threading
from collections import defaultdict

import torch

from . import engines, harness
from ._ptx_plumbing import RecordedArray, WatchedArray, shared_arrays

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
    import linecache

    import numpy as np
    audit = _BarrierAudit()

    def shared_array(shape, dtype, frame):
        name = f"the shared array of line {frame.f_lineno}"
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        if "=" in line:
            name = line.split("=")[0].strip()
        res = _Watched(np.zeros(shape, dtype), name, audit)
        audit.alive.append(res)     # ids stay unique while the audit runs
        return res

    with shared_arrays(shared_array), audit.epochs.installed():
        yield audit


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


def _reg_budget_truth(threads, blocks):
    """The most registers per thread (0..255) that let ``blocks`` blocks of ``threads``
    reside on one 9.0 SM, by :func:`gemm_lessons.occupancy.occupancy`; None if none do."""
    from .occupancy import MAX_REGS, occupancy
    for regs in range(MAX_REGS, 0, -1):
        try:
            if occupancy(regs, 0, threads, (9, 0)).caps["registers"] >= blocks:
                return regs
        except ValueError:          # not even one block fits
            pass
    return None


def ex04_reg_budget(reg_budget):
    """Lesson 04, exercise 3: the register budget of a thread for a number of resident
    blocks (what ``launch_bounds`` hands ptxas), checked against gemm_lessons.occupancy."""
    from .occupancy import REG_UNIT, occupancy
    cases = [(t, b) for t in (32, 64, 96, 100, 128, 200, 256, 384, 512, 1024)
             for b in (1, 2, 3, 4, 5, 6, 8) if -(-t // 32) * b <= 64]
    for threads, blocks in cases:
        want = _reg_budget_truth(threads, blocks)
        with _answer("reg_budget", seconds=5):
            got = reg_budget(threads, blocks)
        if got == want:
            continue
        head = f"reg_budget({threads}, {blocks}) = {got!r}, expected {want}"
        warps = -(-threads // 32)
        if not isinstance(got, int) or isinstance(got, bool):
            raise ExerciseError(f"{head}: return an int, a number of registers per thread")
        if got > 255:
            raise ExerciseError(f"{head}: a thread can address at most 255 registers, however "
                                "many the SM has")
        if got > want:
            per_warp = -(-got * 32 // REG_UNIT) * REG_UNIT
            fit = 65536 // (per_warp * warps)
            why = ("registers are given to a warp in units of 256: "
                   f"{got} x 32 = {got * 32} becomes {per_warp}, and {blocks} blocks of "
                   f"{warps} warps need {blocks * warps * per_warp} of the 65536"
                   if got * 32 % REG_UNIT else
                   f"{blocks} blocks of {warps} warps x {got * 32} registers need "
                   f"{blocks * warps * got * 32} of the 65536")
            if threads % 32:
                why += (f" (a block of {threads} threads occupies {warps} whole warps: the "
                        "registers of the idle lanes are allocated too)")
            raise ExerciseError(f"{head}: too many, only {fit} block(s) fit: {why}")
        raise ExerciseError(f"{head}: not the largest: {want} registers still let {blocks} "
                            f"block(s) of {threads} threads reside "
                            f"({occupancy(want, 0, threads, (9, 0))})")
    per = ", ".join(f"{b} block{'s' if b > 1 else ''} {_reg_budget_truth(256, b)}"
                    for b in (1, 2, 3, 4))
    return (f"reg_budget: right on {len(cases)} launches; 256 threads: {per} registers "
            "per thread")


_WARP_CONFIGS = [dict(BM=128, BN=64, WM=64, WN=32, TM=8, TN=8),
                 dict(BM=64, BN=128, WM=32, WN=64, TM=8, TN=8),
                 dict(BM=128, BN=128, WM=64, WN=64, TM=8, TN=16),
                 dict(BM=64, BN=64, WM=16, WN=32, TM=4, TN=4)]


def _float4_passes(words):
    """(passes, fewest) of one warp request of 128-bit loads starting at ``words``."""
    banks = defaultdict(set)
    for w0 in words:
        for q in range(4):
            banks[(w0 + q) % 32].add(w0 + q)
    distinct = len({w0 + q for w0 in words for q in range(4)})
    return max(len(s) for s in banks.values()), -(-distinct // 32)


def ex04_warp_owner(owner):
    """Lesson 04, exercise 4: the warp-tiled map from (thread, i, j) to an element of the
    block tile. Any map is accepted that (1) gives every element of the block tile to
    exactly one (thread, i, j), (2) gives each warp one WM x WN tile, (3) keeps
    acc[4g..4g+3, j] and acc[i, 4h..4h+3] on 4 consecutive rows / columns starting at a
    multiple of 4 (one float4 each), and (4) lets a warp's float4 fragment loads of one k
    run without a bank conflict."""
    for cfg in _WARP_CONFIGS:
        BM, BN, WM, WN, TM, TN = (cfg[x] for x in ("BM", "BN", "WM", "WN", "TM", "TN"))
        NT = (BM // WM) * (BN // WN) * 32
        where = (f"BM={BM}, BN={BN}, WM={WM}, WN={WN}, TM={TM}, TN={TN} "
                 f"({NT // 32} warps, lanes {WM // TM} x {WN // TN})")
        got = {}
        with _answer("owner", seconds=10):
            for t in range(NT):
                for i in range(TM):
                    for j in range(TN):
                        got[t, i, j] = owner(t, i, j, BM, BN, WM, WN, TM, TN)
        seen = {}
        for (t, i, j), rc in got.items():
            if (not isinstance(rc, tuple) or len(rc) != 2
                    or not all(isinstance(v, int) for v in rc)):
                raise ExerciseError(f"{where}: owner({t}, {i}, {j}) = {rc!r}: return a pair "
                                    "of ints (row, col) of the block tile")
            r, c = rc
            if not (0 <= r < BM and 0 <= c < BN):
                raise ExerciseError(
                    f"{where}: owner({t}, {i}, {j}) = {rc}, outside the {BM} x {BN} block "
                    f"tile: the block holds {BM // WM} x {BN // WN} warp tiles; a thread's "
                    "place inside its warp tile depends on its lane, t % 32, only")
            if rc in seen:
                t2, i2, j2 = seen[rc]
                if t2 // 32 != t // 32:
                    raise ExerciseError(
                        f"{where}: element {rc} of the block tile belongs to warp {t2 // 32} "
                        f"(thread {t2}) and to warp {t // 32} (thread {t}): two warps share a "
                        f"warp tile. The block's {BM // WM} x {BN // WN} warp tiles take one "
                        "warp each (warp // (BN / WN) down, warp % (BN / WN) across)")
                raise ExerciseError(
                    f"{where}: element {rc} of the block tile belongs to thread {t2} "
                    f"(acc[{i2}, {j2}]) and to thread {t} (acc[{i}, {j}]): the map is not "
                    "one-to-one, two threads would write the same element of C. Are the "
                    "lanes' 4 x 4 blocks spaced so that the other lanes' blocks fit between "
                    "them (4 * WM / TM rows, 4 * WN / TN columns)?")
            seen[rc] = (t, i, j)
        for w in range(NT // 32):
            cells = [got[t, i, j] for t in range(32 * w, 32 * w + 32)
                     for i in range(TM) for j in range(TN)]
            rows = {r for r, _ in cells}
            cols = {c for _, c in cells}
            if max(rows) - min(rows) + 1 != WM or max(cols) - min(cols) + 1 != WN:
                raise ExerciseError(
                    f"{where}: warp {w}'s outputs span rows {min(rows)}..{max(rows)} and "
                    f"columns {min(cols)}..{max(cols)}, not one {WM} x {WN} warp tile: a "
                    "warp's 32 lanes must share one compact tile, so that its fragment "
                    "loads read a few neighbouring float4s")
        for t in range(NT):
            for i0 in range(0, TM, 4):
                for j0 in range(0, TN, 4):
                    r0, c0 = got[t, i0, j0]
                    block = [got[t, i0 + a, j0 + b] for a in range(4) for b in range(4)]
                    if (r0 % 4 or c0 % 4
                            or block != [(r0 + a, c0 + b) for a in range(4) for b in range(4)]):
                        raise ExerciseError(
                            f"{where}: thread {t}'s acc[{i0}..{i0 + 3}, {j0}..{j0 + 3}] is "
                            f"not the 4 x 4 block of consecutive rows and columns at "
                            f"{(r0, c0)} (4-aligned): each float4 fragment load reads 4 "
                            "neighbouring values of sA[k, :] or sB[k, :]")
        for w in range(NT // 32):
            lanes = range(32 * w, 32 * w + 32)
            for what, ln, n in (("sA", 0, TM), ("sB", 1, TN)):
                for g in range(0, n, 4):
                    starts = [got[t, g, 0][0] if ln == 0 else got[t, 0, g][1] for t in lanes]
                    passes, fewest = _float4_passes(starts)
                    if passes > fewest:
                        raise ExerciseError(
                            f"{where}: warp {w}'s float4 loads of {what}[k, :] for "
                            f"{'rA' if ln == 0 else 'rB'}[{g}..{g + 3}] start at "
                            f"{sorted(set(starts))[:8]}...: a {passes}-way bank conflict "
                            f"({fewest} pass(es) would do). Neighbouring lanes must read "
                            "neighbouring float4s: a lane's blocks spaced a quarter warp tile "
                            "apart, not one contiguous TM x TN tile")
    return (f"owner: a one-to-one, warp-compact, float4-ready map on {len(_WARP_CONFIGS)} "
            "configurations; every fragment load conflict-free")


_k04_double = {}


def k04_double_helpers(BM, BN, BK, TM, TN):
    """(load_regs, store_regs, outer_buf, GA, GB) for exercise 5's double-buffered kernel
    (the strided register tile of exercises 1 and 2, NT = (BM/TM) x (BN/TN) threads):
    ``load_regs(A, B, gA, gB, m0, n0, k0, t)`` brings thread t's share of the tiles at k0
    from global memory into registers gA (GA values) and gB (GB values), zeros outside A
    and B; ``store_regs(sA, sB, buf, gA, gB, t)`` puts them into shared buffer ``buf``
    (``sA[buf, m, k]``, ``sB[buf, k, n]``); ``outer_buf(sA, sB, buf, rA, rB, acc, k, tm,
    tn)`` adds one k's outer product from buffer ``buf``."""
    key = (BM, BN, BK, TM, TN)
    if key not in _k04_double:
        _numba_globals()
        TROWS, TCOLS = BM // TM, BN // TN
        NT = TROWS * TCOLS
        GA, GB = -(-BM * BK // NT), -(-BK * BN // NT)

        @cuda.jit(device=True)
        def load_regs(A, B, gA, gB, m0, n0, k0, t):
            M, K = A.shape
            N = B.shape[1]
            for i in range(GA):
                e = t + i * NT
                r, c = e // BK, e % BK
                gA[i] = A[m0 + r, k0 + c] if e < BM * BK and m0 + r < M and k0 + c < K else 0.0
            for i in range(GB):
                e = t + i * NT
                r, c = e // BN, e % BN
                gB[i] = B[k0 + r, n0 + c] if e < BK * BN and k0 + r < K and n0 + c < N else 0.0

        @cuda.jit(device=True)
        def store_regs(sA, sB, buf, gA, gB, t):
            for i in range(GA):
                e = t + i * NT
                if e < BM * BK:
                    sA[buf, e // BK, e % BK] = gA[i]
            for i in range(GB):
                e = t + i * NT
                if e < BK * BN:
                    sB[buf, e // BN, e % BN] = gB[i]

        @cuda.jit(device=True)
        def outer_buf(sA, sB, buf, rA, rB, acc, k, tm, tn):
            for i in range(TM):
                rA[i] = sA[buf, tm + i * TROWS, k]
            for j in range(TN):
                rB[j] = sB[buf, k, tn + j * TCOLS]
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += rA[i] * rB[j]

        _k04_double[key] = (load_regs, store_regs, outer_buf, GA, GB)
    return _k04_double[key]


def _buffer_log(audit):
    """Watch, thread by thread, which of the two buffers (the first index of a 3-D shared
    array) it reads and writes between two barriers; the first misuse becomes
    ``audit.problem`` (which :func:`check_product` reports ahead of everything else)."""
    real = audit._access
    last = {}                   # (block, thread, barriers passed, array, buffer) -> 'r' / 'w'
    written = set()             # (block, array, buffer) stored into at least once
    lock = threading.Lock()
    audit.problem = None

    def logged(arr, idx, write):
        if isinstance(idx, tuple) and len(idx) == 3 and audit.problem is None:
            try:
                buf = int(idx[0])
            except TypeError:
                buf = None
            if buf is not None:
                blk, tid, ep = _me()
                name = arr._name
                where = f"{name}[{buf}, ...] (buffer {buf})"
                with lock:
                    key = (blk, tid, ep, name, buf)
                    before = last.get(key)
                    if write:
                        written.add((blk, name, buf))
                        if before == "r":
                            audit.problem = (
                                f"thread {tid} of block {blk[:2]} stores into {where} after "
                                "reading it since the last barrier: other threads may still "
                                "be multiplying the previous tile from it. With one barrier per "
                                "tile, consecutive tiles must alternate between the two buffers "
                                "(tile kt in buffer kt % 2)")
                    else:
                        if (blk, name, buf) not in written:
                            audit.problem = (
                                f"thread {tid} of block {blk[:2]} reads {where} before any tile "
                                "was stored into it: multiply tile kt from the buffer it was "
                                "stored into (kt % 2)")
                        elif before == "w":
                            audit.problem = (
                                f"{HINTS['barrier']}: thread {tid} of block {blk[:2]} reads "
                                f"{where} right after storing its share of the tile into it, "
                                "with no barrier between: the other threads' shares may not be "
                                "there yet. The barrier goes between store_regs and the "
                                "multiply-adds")
                    last[key] = "w" if write else "r"
        real(arr, idx, write)

    audit._access = logged
    return audit


def ex04_double(run, BM, BN, BK):
    """Lesson 04, exercise 5: two shared buffers and one barrier per tile. The product on
    ragged shapes; every buffer access audited (a buffer refilled while it may still be
    read, read before its barrier, read before it was filled); exactly one barrier per
    tile; and the next tile's global loads issued before this tile's multiply-adds."""
    from . import counters
    cases = _small_suite(("square", "ragged", "K=1", "M=1"))
    with barrier_audit() as audit:
        _buffer_log(audit)
        try:
            report = check_product(run, "my_double", cases=cases, audit=audit)
        except ExerciseError as e:
            text = str(e)
            if ("\nLikely cause:" in text and not audit.problem and not audit.race
                    and "TODO" not in text and "never written" not in text):
                text = text.split("\nLikely cause:")[0] + (
                    "\nLikely cause: which tile goes where: tile kt is stored into buffer "
                    "kt % 2 and multiplied from it, while the registers receive tile kt + 1 "
                    "(k0 = (kt + 1) * BK)")
            raise ExerciseError(text) from None
    tiles = 3
    with barrier_audit() as audit:
        a, b = harness.make_operands(BM, BN, tiles * BK)
        with _answer("my_double"):
            run(a, b, torch.empty(BM, BN))
    passed = sorted(set(audit.epochs.final.values()))
    if passed != [tiles]:
        raise ExerciseError(
            f"the threads passed {', '.join(map(str, passed))} barriers for {tiles} tiles: two "
            "buffers need exactly one per tile (after store_regs: the buffer refilled next was "
            "last read before the previous tile's barrier)")
    a, b = harness.make_operands(BM, BN, 2 * BK)
    c = torch.empty(BM, BN)
    with counters.trace(A=a, B=b, C=c) as tr:
        run(a, b, c)
    mine = [x for x in tr.accesses if x.block[:2] == (0, 0) and x.warp == 0 and x.lane == 0]
    next_tile = next((n for n, x in enumerate(mine) if x.space == "global" and x.array == "A"
                      and x.op == "load" and (x.addr // 4) % (2 * BK) >= BK), None)
    first_math = next((n for n, x in enumerate(mine) if x.space == "shared" and x.op == "load"),
                      None)
    if next_tile is None or first_math is None or next_tile > first_math:
        raise ExerciseError(
            "the next tile's global loads start after this tile's multiply-adds: call "
            "load_regs for tile kt + 1 right after the barrier, before the math, so that the "
            "loads are in flight while the FMAs run (the point of the second buffer)")
    return (f"{report}; one barrier per tile, the next tile's loads in flight during the "
            "math, no buffer race")


# ------------------------------------------------------------------ lesson 05
def ex05_warp_tile(run, FM, FN):
    """Lesson 05, exercise 1: the warp's tensor-core step."""
    from . import ptx
    try:
        report = check_product(run, "my_wmma", (torch.float16,), cases=_small_suite(
            ("square", "ragged", "M=1", "K=1", "A transposed")))
    except ExerciseError as e:
        text = str(e)
        if "\nLikely cause:" in text and "TODO" not in text and HINTS["zero"] not in text:
            text = text.split("\nLikely cause:")[0] + (
                "\nLikely cause: the fragment offsets: fragment i of A starts at row i * 16, "
                "column kk of sA; fragment j of B at row kk, column j * 16 of sB; the product "
                "(i, j) pairs rA[i] with rB[j] into acc[i, j]. Or a layout: sA and sB are "
                "row-major, so every load and the product name \"row\" (a \"col\" multiplies "
                "by the transposed tile)")
        elif "wmma_load" in text and "is outside the shared array" in text:
            which = "wmma_load_a" if "wmma_load_a" in text else "wmma_load_b"
            text = (f"my_wmma: {which} reads a 16x16 tile that starts outside sA or sB "
                    f"({_short(text.split('IndexError: ')[-1], 200)}): the fragment offsets: "
                    "fragment i of A starts at row i * 16, column kk of sA; fragment j of B "
                    "at row kk, column j * 16 of sB")
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


_QUADRANTS = {(0, 0): "top-left", (8, 0): "bottom-left", (0, 8): "top-right",
              (8, 8): "bottom-right"}


def _mma_a_regs(lane):
    """mma.m16n8k16's A operand (PTX ISA, 'Matrix fragments for mma.m16n8k16'): register j
    of ``lane`` holds the two halves (row, col) and (row, col + 1) of the 16x16 tile."""
    g, t = lane // 4, lane % 4
    return [(g + 8 * (j % 2), 2 * t + 8 * (j // 2)) for j in range(4)]


def ex05_ldmatrix(ldmatrix_address):
    """Lesson 05, exercise 3: the row each lane hands ``ldmatrix.x4`` so that the four
    8x8 matrices land in the registers where ``mma.m16n8k16`` expects A's quarters. The
    answer is run through an emulation of ldmatrix (lanes 8j..8j+7 give the rows of matrix
    j; lane l receives row l // 4, halves 2(l % 4) and 2(l % 4) + 1 of each matrix)."""
    addr = []
    for lane in range(32):
        with _answer("ldmatrix_address", seconds=5):
            rc = ldmatrix_address(lane)
        if (not isinstance(rc, tuple) or len(rc) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in rc)):
            raise ExerciseError(f"ldmatrix_address({lane}) = {rc!r}: return a pair of ints, "
                                "(row, column) of the 16x16 tile, in elements")
        r, c = rc
        if not (0 <= r < 16 and 0 <= c < 16):
            raise ExerciseError(f"ldmatrix_address({lane}) = {rc}: outside the 16x16 tile "
                                "(rows and columns 0..15, counted in halves, not bytes)")
        if c % 8:
            raise ExerciseError(f"ldmatrix_address({lane}) = {rc}: a row of an 8x8 matrix is "
                                "8 halves (16 bytes) starting at column 0 or 8 of the tile")
        addr.append(rc)
    for j in range(4):
        rows = addr[8 * j:8 * j + 8]
        want = _mma_a_regs(0)[j]                # the quarter register j must hold
        top = (min(r for r, _ in rows), rows[0][1])
        if len({c for _, c in rows}) != 1 or sorted(r for r, _ in rows) != list(
                range(top[0], top[0] + 8)) or top[0] % 8:
            raise ExerciseError(
                f"lanes {8 * j}..{8 * j + 7} point at {rows}: they give the 8 rows of one "
                f"8x8 matrix (register {j} of every lane), 8 consecutive rows of one "
                "quarter of the tile, in the same columns")
        if top != want:
            raise ExerciseError(
                f"lanes {8 * j}..{8 * j + 7} point at the {_QUADRANTS.get(top, str(top))} "
                f"quarter, so register {j} receives it; mma.m16n8k16 expects the "
                f"{_QUADRANTS[want]} quarter there (R0 top-left, R1 bottom-left, R2 top-right, "
                "R3 bottom-right): the order of the matrices is wrong")
        for i, (r, c) in enumerate(rows):
            if r != top[0] + i:
                lane = 4 * i
                raise ExerciseError(
                    f"lane {8 * j + i} points at row {r}, so lane {lane}'s register {j} "
                    f"receives row {r}; mma expects row {_mma_a_regs(lane)[j][0]} there: lane "
                    f"8j + i gives row i of matrix j")
    ways = {ld: _ldmatrix_ways(ld * 2) for ld in (16, 24)}     # one phase, rows ld halves apart
    return ("ldmatrix_address: the four 8x8 matrices land where mma.m16n8k16 expects A; "
            f"each phase reads 8 rows of 16 bytes ({ways[16]}-way with rows of 16 halves, "
            f"{ways[24]}-way padded to 24)")


_k05 = {}


def k05_helpers(BM, BN, BK):
    """(load_tiles, mma_step): the two halves of a k-step of the exercises' one-warp WMMA
    kernel, as device functions, so that each exercise writes one half and gets the other
    done. ``load_tiles(A, B, sA, sB, bm, bn, k0, lane)`` copies the BM x BK tile of A at
    (bm, k0) and the BK x BN tile of B at (k0, bn) into shared memory, zeros outside A and
    B; ``mma_step(sA, sB, rA, rB, acc, kk, LDA, LDB)`` adds the 16-deep slice kk of the
    tiles' product into the FM x FN accumulator fragments."""
    key = (BM, BN, BK)
    if key not in _k05:
        _numba_globals()
        from . import ptx as _ptx
        FM, FN = BM // 16, BN // 16

        @cuda.jit(device=True)
        def load_tiles(A, B, sA, sB, bm, bn, k0, lane):
            M, K = A.shape
            N = B.shape[1]
            for e in range(lane, BM * BK, 32):
                r, c = e // BK, e % BK
                sA[r, c] = A[bm + r, k0 + c] if bm + r < M and k0 + c < K else 0
            for e in range(lane, BK * BN, 32):
                r, c = e // BN, e % BN
                sB[r, c] = B[k0 + r, bn + c] if k0 + r < K and bn + c < N else 0

        @cuda.jit(device=True)
        def mma_step(sA, sB, rA, rB, acc, kk, LDA, LDB):
            for i in range(FM):
                _ptx.wmma_load_a(rA[i], sA, (i * 16, kk), LDA, "row")
            for j in range(FN):
                _ptx.wmma_load_b(rB[j], sB, (kk, j * 16), LDB, "row")
            for i in range(FM):
                for j in range(FN):
                    _ptx.wmma_mma(acc[i, j], rA[i], rB[j], "row", "row")

        _k05[key] = (load_tiles, mma_step)
    return _k05[key]


@contextlib.contextmanager
def _nan_shared():
    """Shared arrays of the numba kernels launched inside start filled with NaN (simulator;
    integer arrays with -1): an element a kernel reads before writing is then as undefined
    as on a GPU, and shows in the result. One array per source line, as the simulator."""
    import numpy as np

    def nan_array(shape, dtype, frame):
        return np.full(shape, np.nan if dtype.kind == "f" else -1, dtype)

    with shared_arrays(nan_array):
        yield


def ex05_tiles(run, BM, BN, BK):
    """Lesson 05, exercise 4: the copy of the block's A and B tiles into padded shared
    memory, with zeros past every edge. Shared memory starts as NaN, so a tail left unwritten
    shows; the copy must split the tile among the 32 lanes (each element copied once)."""
    from . import counters
    cases = _small_suite(("square", "ragged", "K=1", "M=1", "A transposed"))
    report = []
    for case in cases:
        try:
            with _nan_shared():
                report.append(check_product(run, "my_tiles", (torch.float16,), [case]))
        except ExerciseError as e:
            text = str(e)
            if "\nLikely cause:" not in text or "TODO" in text:
                raise
            head = text.split("\nLikely cause:")[0]
            if case.name == "square":
                cause = ("the copy itself (no edge in this shape): element (r, c) of A's tile "
                         "is A[bm + r, k0 + c], stored at sA[r, c]; the tile is BK wide "
                         "(LDA only spaces its rows) and B's is BN wide")
            elif "still NaN" in text:         # read from shared memory never written
                cause = ("a missing zero fill: some elements of a tile past the edge of A or B "
                         "are never written, and the tensor core multiplies what shared memory "
                         "held (NaN here, anything on a GPU; 0 x NaN is NaN). Write 0 to every "
                         "element of both tiles that lies outside A or B")
            else:
                cause = ("a missing zero fill in the K tail: past K, the last tile keeps the "
                         "previous tile's values, which the tensor core adds into C. Write 0 to "
                         "every element of both tiles that lies outside A or B")
            raise ExerciseError(f"{head}\nLikely cause: {cause}") from None
    a, b = harness.make_operands(BM, BN, 2 * BK, torch.float16)
    c = torch.empty(BM, BN, dtype=torch.float16)
    with counters.trace(A=a, B=b, C=c) as t:
        run(a, b, c)
    stores = sum(1 for x in t.accesses if x.space == "shared" and x.op == "store")
    want = 2 * (BM * BK + BK * BN)          # 2 k-steps, each element of both tiles once
    if stores > want:
        raise ExerciseError(
            f"{stores} stores into shared memory for two k-steps of one block, where the two "
            f"tiles hold {want}: lanes copy the same elements. Split the work: lane l copies "
            "elements l, l + 32, l + 64... of each tile")
    return (f"{report[0].kernel}: correct on {len(report)} shapes (float16), shared memory "
            "starting as NaN; each element of a tile copied once per k-step")


def _tile_work(BM, BN, BK, WM, WN):
    warps = (BM // WM) * (BN // WN)
    FM, FN, steps = WM // 16, WN // 16, BK // 16
    loads = (FM + FN) * steps
    return dict(warps=warps, loads=loads, mmas=FM * FN * steps,
                smem_bytes=warps * loads * 16 * 16 * 2)


def ex05_tile_work(tile_work):
    """Lesson 05, exercise 5: the tensor-core work of one block tile per BK step (warps,
    fragment loads and wmma_mma per warp, bytes the fragment loads read from shared
    memory), for many tile configurations."""
    configs = [(128, 128, 32, 64, 32), (128, 128, 32, 32, 64), (64, 64, 16, 32, 32),
               (128, 256, 32, 64, 64), (256, 128, 64, 64, 64), (32, 32, 16, 16, 16),
               (64, 128, 16, 64, 32), (128, 64, 48, 32, 32)]
    why = {
        "warps": "one warp per WM x WN warp tile: (BM / WM) x (BN / WN)",
        "loads": "per 16-deep slice a warp loads each of its WM / 16 A fragments and WN / 16 "
                 "B fragments once, and reuses them for every product: (WM/16 + WN/16) x "
                 "BK/16",
        "mmas": "one wmma_mma per 16 x 16 fragment of the warp tile per 16-deep slice: "
                "WM/16 x WN/16 x BK/16",
        "smem_bytes": "each warp reads its own fragments from shared memory, 16 x 16 fp16 "
                      "(512 bytes) per load: warps x loads x 512, more than the tiles hold "
                      "when several warps read the same rows of A or columns of B",
    }
    for cfg in configs:
        want = _tile_work(*cfg)
        with _answer("tile_work", seconds=5):
            got = tile_work(*cfg)
        if not isinstance(got, dict) or set(got) != set(want):
            raise ExerciseError(f"tile_work{cfg} = {got!r}: return a dict with the keys "
                                f"{', '.join(want)}")
        for key in want:
            if got[key] != want[key]:
                more = ""
                if key == "mmas" and got[key] == want[key] // (cfg[2] // 16) and cfg[2] > 16:
                    more = f" (one per 16-deep slice: BK = {cfg[2]} is {cfg[2] // 16} slices)"
                if key == "loads" and got[key] == 2 * want["mmas"]:
                    more = " (two loads per product: each fragment is loaded once and reused)"
                raise ExerciseError(f"tile_work(BM={cfg[0]}, BN={cfg[1]}, BK={cfg[2]}, "
                                    f"WM={cfg[3]}, WN={cfg[4]})[{key!r}] = {got[key]!r}, "
                                    f"expected {want[key]}{more}: {why[key]}")
    g = _tile_work(128, 128, 32, 64, 32)
    tile_bytes = (128 * 32 + 32 * 128) * 2
    return (f"tile_work: right on {len(configs)} configurations; lesson 05's GPU tile "
            f"(128 x 128 x 32, warps of 64 x 32): {g['warps']} warps, {g['loads']} loads and "
            f"{g['mmas']} wmma_mma per warp per step, {g['smem_bytes']} bytes of fragment "
            f"loads from {tile_bytes} bytes of tiles")


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


def _budget_cause(pipeline_smem, BM, BN, BK):
    """What a wrong pipeline_smem gets wrong, from how it answers a few probes (the formula
    itself is not given away)."""
    def f(stages, pad):
        with _answer("pipeline_smem", seconds=10):
            return pipeline_smem(BM, BN, BK, stages, pad=pad)
    one, two = f(1, 0), f(2, 0)
    if two != 2 * one:
        return "each stage holds a tile of A and a tile of B: the budget grows with the stages"
    plain = BM * BK + BK * BN
    if one == 4 * plain:
        return "2 bytes an element (fp16), not 4"
    if one == plain:
        return "a count of elements, not of bytes: 2 bytes an element"
    if one != 2 * plain:
        return ("the tiles' sizes: one stage holds a BM x BK tile of A and a BK x BN tile of B, "
                "with no padding when pad = 0")
    extra = f(1, 8) - one
    if extra == 0:
        return "the padding is left out: every row is pad elements longer"
    if extra == BM * 8 * 2:
        return "the padding of B is left out: the padding lengthens every row of both tiles"
    if extra == BK * 8 * 2:
        return "the padding of A is left out: the padding lengthens every row of both tiles"
    return "the padding: it lengthens every row of both tiles, by pad elements"


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
                                        f"{got!r}, expected {want}: "
                                        + _budget_cause(pipeline_smem, BM, BN, BK))
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


# Exercise 3: the N-stage pipeline. The check launches the learner's kernel itself (tiles
# of 32 x 32 x 16, one warp per block, operands zero-padded to whole tiles).
_MS_TILE = (32, 32, 16)


def _ms_launch(kernel, a, b, c):
    BM, BN, BK = _MS_TILE
    M, K = a.shape
    N = b.shape[1]
    Mp, Np, Kp = _cdiv(M, BM) * BM, _cdiv(N, BN) * BN, _cdiv(K, BK) * BK
    A = torch.zeros(Mp, Kp, dtype=a.dtype)
    A[:M, :K] = a
    B = torch.zeros(Kp, Np, dtype=b.dtype)
    B[:K, :N] = b
    Cp = torch.full((Mp, Np), float("nan"), dtype=c.dtype)
    kernel[(Np // BN, Mp // BM), 32](engines.as_numba(A), engines.as_numba(B),
                                     engines.as_numba(Cp), Kp // BK)
    c.copy_(Cp[:M, :N])


_ONCE = ("every tile is copied once, by the prologue or by one step of the loop (how many "
         "tiles must be in flight when step 0 computes, and how far ahead of t is the tile "
         "that step t issues?)")


class _TileLog:
    """Which K-tile each copy belongs to and which tile each tensor-core read finds in its
    stage, per thread (beside :func:`pipeline_audit`, whose intrinsics it wraps again)."""

    def __init__(self, audit, BM, BK):
        self.audit, self.BM, self.BK = audit, BM, BK
        self.lock = threading.Lock()
        self.copies = defaultdict(lambda: defaultdict(int))   # block -> (operand, chunk) -> n
        self.held = {}                                       # (block, thread, stage) -> tile
        self.seq = defaultdict(list)                         # (block, thread) -> tiles read
        self.depth = 0          # most groups with copies in flight during a read, any thread

    def tile_of(self, dst, si):
        # sA is (STAGES, BM, LDA): K runs along the source's columns; sB along its rows
        a_side = int(dst.shape[1]) == self.BM
        return ("A" if a_side else "B"), int(si[1] if a_side else si[0]) // self.BK

    def issue(self, dst, di, si):
        blk, tid, _ = _me()
        side, tile = self.tile_of(dst, si)
        with self.lock:
            self.copies[blk][(side, tuple(int(i) for i in si))] += 1
            self.held[(blk, tid, int(di[0]))] = tile

    def read(self, idx):
        blk, tid, _ = _me()
        tile = self.held.get((blk, tid, int(idx[0])))
        flying = sum(1 for g in self.audit._state()["groups"] if g)
        with self.lock:
            self.depth = max(self.depth, flying)
            seq = self.seq[(blk, tid)]
            if not seq or seq[-1] != tile:
                seq.append(tile)

    def problem(self, k_tiles, chunks_per_tile):
        """The first copy or stage-order mistake, as a message, or None."""
        for blk, seen in self.copies.items():
            twice = sorted((self.tile_of_key(side, si), side)
                           for (side, si), n in seen.items() if n > 1)
            if twice:
                return (f"block {blk[:2]}: K-tile {twice[0][0]} of {twice[0][1]} is copied twice: "
                        f"{_ONCE}")
            tiles = defaultdict(int)
            for (s, si), n in seen.items():
                tiles[self.tile_of_key(s, si)] += n
            missing = [t for t in range(k_tiles) if tiles.get(t, 0) < chunks_per_tile]
            if missing:
                return (f"block {blk[:2]}: K-tile {missing[0]} is never copied (of "
                        f"{k_tiles} tiles): {_ONCE}")
        for (blk, tid), seq in sorted(self.seq.items()):
            if seq != list(range(k_tiles)):
                t = next((i for i, (x, y) in enumerate(zip(seq, range(k_tiles))) if x != y),
                         min(len(seq), k_tiles))
                got = seq[t] if t < len(seq) else None
                return (f"the ring-buffer stage index: thread {tid} of block {blk[:2]} computes "
                        f"on a stage holding K-tile {got} at step {t} (it should hold tile {t}): "
                        "tile t lives in stage t % STAGES")
        return None

    def tile_of_key(self, side, si):
        return (si[1] if side == "A" else si[0]) // self.BK


@contextlib.contextmanager
def _tile_log(audit, BM, BK):
    from . import ptx
    log = _TileLog(audit, BM, BK)
    names = ("cp_async16", "cp_async16_zfill", "cp_async_ca")
    audited = {n: getattr(ptx, n) for n in names if hasattr(ptx, n)}

    def wrap_copy(fn):
        def copy(dst, di, src, si, *rest):
            fn(dst, di, src, si, *rest)
            log.issue(dst, di, si)
        return copy

    audit_read = audit.read

    def read(arr, idx):
        log.read(idx)
        audit_read(arr, idx)

    for n, fn in audited.items():
        setattr(ptx, n, wrap_copy(fn))
    audit.read = read
    try:
        yield log
    finally:
        for n, fn in audited.items():
            setattr(ptx, n, fn)
        del audit.read


def ex06_multistage(make_multistage):
    """Lesson 06, exercise 3: the prologue and loop of an N-stage pipeline, built with 3 and
    4 stages. Each K-tile copied once, tile t read from stage t % STAGES, no race under
    random landing, and STAGES - 1 tiles in flight while the tensor cores compute."""
    from . import ptx
    BM, BN, BK = _MS_TILE
    long_k = harness.Case("long K", 24, 40, 100,
                          hint="the pipeline over 7 tiles: is every tile waited for?")
    cases = _small_suite(("ragged", "K=1")) + [long_k]
    chunks = BM * BK // 8 + BK * BN // 8          # 16-byte chunks of A and B in one K-tile
    for stages, seeds in ((3, (None, 1)), (4, (2, 3))):
        with _answer(f"make_multistage({stages})", seconds=20):
            kernel = make_multistage(stages)
        depth = 0
        for seed in seeds:
            for case in cases:
                ctx = (ptx.cp_async_landing("random", seed=seed) if seed is not None
                       and hasattr(ptx, "cp_async_landing") else contextlib.nullcontext())
                with ctx, pipeline_audit() as audit, _tile_log(audit, BM, BK) as log:
                    try:
                        check_product(lambda a, b, c: _ms_launch(kernel, a, b, c),
                                      f"make_multistage({stages})", (torch.float16,), [case],
                                      audit=audit)
                        err = None
                    except ExerciseError as e:
                        err = e
                mine = log.problem(_cdiv(case.K, BK), chunks)
                if mine:
                    raise ExerciseError(f"make_multistage({stages}), {case}: {mine}")
                if err is not None:
                    raise err
                if case is long_k:
                    depth = max(depth, log.depth)
        if depth != stages - 1:
            raise ExerciseError(
                f"make_multistage({stages}) is right, but {HINTS['wait'].split(':')[0]} or the "
                f"issue: at most {depth} tile{'s' if depth != 1 else ''} in flight while the "
                "tensor cores compute, where "
                f"{stages} stages keep {stages - 1} in flight (the wait should leave every tile "
                "after t in flight, and the next tile is issued before compute)")
    return (f"make_multistage: correct with 3 and 4 stages on {len(cases)} shapes (float16); "
            "each tile copied once and read from its stage, STAGES - 1 tiles in flight, no race "
            "found")


# Exercise 4: the 128-byte swizzle, against ptx_hopper.swizzled_offset.
def _swizzled_byte(row, col, rows):
    from .ptx_hopper import swizzled_offset
    return (col // 64) * rows * 128 + swizzled_offset(row * 128 + (col % 64) * 2)


def ex06_swizzle(swizzled_byte):
    """Lesson 06, exercise 4: the byte offset of element (row, col) of an fp16 tile stored
    in 128-byte-swizzle atoms (8 rows x 64 columns), as wgmma and TMA read it."""
    import random
    from collections import Counter
    rng = random.Random(6)
    shapes = [(8, 64), (16, 128), (64, 64), (64, 256), (128, 64)]
    samples = [(r, c, rows) for rows, cols in shapes[:3] for r in range(rows)
               for c in range(cols)]
    samples += [(rng.randrange(rows), rng.randrange(cols), rows) for rows, cols in shapes
                for _ in range(400)]
    with _answer("swizzled_byte", seconds=20):
        got = {s: swizzled_byte(*s) for s in samples}
    for s, off in got.items():
        if not isinstance(off, int) and not (hasattr(off, "__index__")):
            raise ExerciseError(f"swizzled_byte{s} = {off!r}: a byte offset is an integer "
                                "(use // and %, not /)")
    bad = [(s, got[s], _swizzled_byte(*s)) for s in samples if got[s] != _swizzled_byte(*s)]
    if not bad:
        return (f"swizzled_byte: right on {len(samples)} elements of {len(shapes)} tiles; "
                "8 rows of a chunk column in 8 different groups of 4 banks")
    (row, col, rows), off, want = bad[0]
    where = f"swizzled_byte({row}, {col}, rows={rows}) = {off}, expected {want}"
    # name the mistake from the answer's shape on whole atoms
    for (r, c, rs), o in got.items():
        if c % 8 < 7 and (r, c + 1, rs) in got and got[(r, c + 1, rs)] - o != 2:
            raise ExerciseError(f"{where}: elements {c} and {c + 1} of row {r} are "
                                f"{got[(r, c + 1, rs)] - o} bytes apart: 2 bytes an element "
                                "(fp16), and the byte inside a 16-byte chunk, (col % 8) * 2, "
                                "is not swizzled")
    for (r, c, rs), o in got.items():
        if r < 8 and o // (rs * 128) != c // 64:      # the first atom: no row % 8 question
            raise ExerciseError(f"{where}: column {c} lies in 64-column block {c // 64}, which "
                                f"starts at byte {c // 64} x rows x 128 = {c // 64 * rs * 128}; "
                                f"the answer puts it at {o} (the 64-column blocks lie one after "
                                "the other, each rows x 128 bytes)")
    for (r, c, rs), o in got.items():
        if o % (rs * 128) // 128 != r:
            raise ExerciseError(f"{where}: element ({r}, {c}) lands in row {o % (rs * 128) // 128} "
                                "of its block: the XOR uses the row inside the 8-row atom "
                                "(row % 8), so that a chunk never leaves its 128-byte row")
    for rows, cols in shapes[:3]:
        for c in range(0, cols, 8):
            for r0 in range(0, rows, 8):
                places = Counter(got[(r, c, rows)] % 128 // 16 for r in range(r0, r0 + 8))
                if len(places) < 8:
                    raise ExerciseError(
                        f"{where}: no swizzle: the 8 rows {r0}..{r0 + 7} of column chunk "
                        f"{c // 8} sit in {len(places)} chunk position(s) of their rows: "
                        f"{max(places.values())} of them share the same 4 banks (a bank "
                        f"conflict of {max(places.values())} ways when the tensor cores read "
                        "them); chunk c of row r goes to chunk c XOR (r % 8)")
    raise ExerciseError(f"{where}: conflict-free, but not the hardware's swizzle: chunk c of "
                        "row r is stored at chunk c XOR (r % 8) (an XOR, not a rotation)")


# Exercise 5: a wgmma matrix descriptor (128-byte swizzle), and the one of a B tile laid out
# as in exercise 4.
_DESC_FIELDS = (("bits 0-13 (the start address)", 0),
                ("bits 16-29 (the leading byte offset, LBO)", 16),
                ("bits 32-45 (the stride byte offset, SBO)", 32))


def _desc_fields(d):
    return [(d >> shift) & 0x3FFF for _, shift in _DESC_FIELDS] + [d >> 62]


def ex06_descriptor(matrix_descriptor, b_descriptor):
    """Lesson 06, exercise 5: the 64-bit matrix descriptor wgmma reads its operands through,
    field by field, then a B tile's descriptor, checked against exercise 4's layout."""
    import random
    from .ptx_hopper import swizzled_offset
    rng = random.Random(65)
    cases = [(0, 16, 1024), (1024, 8192, 1024), (2080, 16, 1024)]
    cases += [(16 * rng.randrange(1 << 14), 16 * rng.randrange(1, 1 << 14),
               16 * rng.randrange(1, 1 << 14)) for _ in range(200)]
    for addr, lbo, sbo in cases:
        with _answer("matrix_descriptor", seconds=10):
            d = matrix_descriptor(addr, lbo, sbo)
        if not isinstance(d, int):
            raise ExerciseError(f"matrix_descriptor({addr}, {lbo}, {sbo}) = {d!r}: a descriptor "
                                "is a 64-bit integer (use // or >>, not /)")
        where = f"matrix_descriptor(addr={addr}, lbo={lbo}, sbo={sbo}) = {d:#x}"
        if d < 0 or d >> 64:
            raise ExerciseError(f"{where}: not a 64-bit pattern")
        got = _desc_fields(d)
        for (name, _shift), value, field in zip(_DESC_FIELDS, (addr, lbo, sbo), got):
            if field != value >> 4:
                units = (" (in 16-byte units: the value >> 4)"
                         if field == value & 0x3FFF or field == (value << 4) & 0x3FFF else "")
                raise ExerciseError(f"{where}: {name} hold {field}, expected {value} >> 4 = "
                                    f"{value >> 4}{units}")
        if got[3] != 1:
            raise ExerciseError(f"{where}: bits 62-63 (the swizzle mode) hold {got[3]}: 1 for "
                                "the 128-byte swizzle")
        stray = d & ~((0x3FFF) | (0x3FFF << 16) | (0x3FFF << 32) | (3 << 62))
        if stray:
            raise ExerciseError(f"{where}: bits outside the four fields are set ({stray:#x}): a "
                                "field shifted to the wrong place?")
    for rows in (16, 64, 128):
        addr = 1024 * rng.randrange(1, 100)
        with _answer("b_descriptor", seconds=10):
            d = b_descriptor(addr, rows)
        where = f"b_descriptor({addr}, rows={rows})"
        if not isinstance(d, int) or d < 0 or d >> 64:
            raise ExerciseError(f"{where} = {d!r}: not a 64-bit descriptor")
        start, lbo, sbo, mode = _desc_fields(d)
        if start != addr >> 4 or mode != 1:
            raise ExerciseError(f"{where}: start address {start * 16} and swizzle mode {mode}, "
                                f"expected {addr} and 1 (build it with matrix_descriptor)")
        if sbo * 16 != 1024:
            raise ExerciseError(f"{where}: SBO = {sbo * 16} bytes, but the stride byte offset "
                                "is the step from one 8-row group of k-rows to the next: one "
                                "whole atom of the swizzle")
        if lbo * 16 != rows * 128:
            raise ExerciseError(f"{where}: LBO = {lbo * 16} bytes, but the leading byte offset "
                                "is the step from one 64-column block to the next, and a block "
                                "holds all the tile's k-rows of its 64 columns")
        # every element found where exercise 4's layout puts it
        for k in range(rows):
            for n in range(256):
                off = (k // 8) * sbo * 16 + (k % 8) * 128 + (n // 64) * lbo * 16 + 2 * (n % 64)
                if start * 16 + swizzled_offset(off) != addr + _swizzled_byte(k, n, rows):
                    raise ExerciseError(f"{where}: element ({k}, {n}) is not where the tile "
                                        "is stored")
    return ("matrix_descriptor: every field right on 203 descriptors; b_descriptor: every "
            "element of 16-, 64- and 128-row B tiles found where exercise 4 stores it")


# Exercises 6 and 7: a ring of stages handed over mbarriers (y = A @ x). One block of 96
# threads per 64 rows of A: thread 0 (warp 0) fills the ring with TMA, warps 1 and 2 (one
# row of the box per thread) consume it. Stage s holds a 64 x 64 box of A (128-byte swizzle)
# in sA and 64 elements of x in sx; full[s] has 1 arrival + the stage's bytes, empty[s] one
# arrival per consumer thread. Each exercise writes one side and is given the other
# (k06_fill_ring, k06_drain_ring), so that neither exercise shows the other's answer.
_RING_ROWS, _RING_STAGES, _RING_THREADS = 64, 3, 96
_k06_ring = {}


def _k06_ring_helpers(ROWS, STAGES):
    """(fill_ring, drain_ring, add_row) of exercises 6 and 7's ring, built once."""
    if (ROWS, STAGES) != (_RING_ROWS, _RING_STAGES):
        raise ValueError(f"the exercises' ring has ROWS = {_RING_ROWS} and STAGES = "
                         f"{_RING_STAGES} (the check launches it so), got {ROWS}, {STAGES}")
    key = (ROWS, STAGES)
    if key not in _k06_ring:
        _numba_globals()
        from . import ptx_mbarrier as mbar
        from . import ptx_tma as tmacopy
        from .ptx_hopper import swizzle128
        BOX = ROWS * 64
        NBYTES = 2 * BOX + 2 * 64

        @cuda.jit(device=True)
        def add_row(sA, sx, s, r):
            # byte b of a copy's destination lands at swizzle128(b), b counted from the
            # array's start (1024-byte aligned): the 16-byte chunk XOR the 128-byte row's
            # index in its group of 8; x's piece of stage s is row s of its array
            acc = float32(0.0)
            for c in range(64):
                a = sA[swizzle128((s * ROWS + r) * 128 + 2 * c) // 2]
                x = sx[swizzle128(s * 128 + 2 * c) // 2]
                acc += float32(a) * float32(x)
            return acc

        @cuda.jit(device=True)
        def fill_ring(sA, sx, full, empty, tA, tx, row0, k_tiles):
            for kt in range(k_tiles):
                s = kt % STAGES
                mbar.mbarrier_wait(empty, s, ((kt // STAGES) & 1) ^ 1)
                mbar.mbarrier_arrive_expect_tx(full, s, NBYTES)
                tmacopy.tma_load_2d(sA, s * BOX, tA, kt * 64, row0, full, s)
                tmacopy.tma_load_2d(sx, s * 64, tx, kt * 64, 0, full, s)

        @cuda.jit(device=True)
        def drain_ring(sA, sx, full, empty, r, k_tiles):
            acc = float32(0.0)
            for kt in range(k_tiles):
                s = kt % STAGES
                mbar.mbarrier_wait(full, s, (kt // STAGES) & 1)
                acc += add_row(sA, sx, s, r)
                mbar.mbarrier_arrive(empty, s)
            return acc

        _k06_ring[key] = (fill_ring, drain_ring, add_row)
    return _k06_ring[key]


def k06_fill_ring(ROWS, STAGES):
    """Exercise 6's producer, a device function ``fill_ring(sA, sx, full, empty, tA, tx,
    row0, k_tiles)`` run by one thread: for each k-tile kt it waits until the consumers have
    released stage kt % STAGES, announces the stage's bytes on ``full`` and starts the TMA
    copies of A's ROWS x 64 box at (row0, kt * 64) into ``sA`` and of x's 64 elements at
    kt * 64 into ``sx``."""
    return _k06_ring_helpers(ROWS, STAGES)[0]


def k06_drain_ring(ROWS, STAGES):
    """Exercise 7's consumers, a device function ``drain_ring(sA, sx, full, empty, r,
    k_tiles)`` run by each consumer thread: for each k-tile it waits until its stage is full,
    adds row ``r`` of the stage's box times x's piece, and releases the stage on ``empty``;
    returns the float32 sum."""
    return _k06_ring_helpers(ROWS, STAGES)[1]


def k06_add_row(ROWS, STAGES):
    """A device function ``add_row(sA, sx, s, r)``: row ``r`` of stage ``s``'s box of A
    times stage ``s``'s 64 elements of x, in float32, read through the 128-byte swizzle the
    TMA copies land in."""
    return _k06_ring_helpers(ROWS, STAGES)[2]




class _RingArray(RecordedArray):
    """A shared stage array of the ring whose reads the audit logs. A RecordedArray, so that
    the TMA emulation sees through it to the array."""

    def __init__(self, arr, name, audit):
        WatchedArray.__init__(self, arr, name)
        self._audit = audit
        self._stage_len = max(1, arr.size // _RING_STAGES)

    def access(self, idx, store):
        self._audit.touch(self, idx, store)

    def record_wide(self, op, idx, nbytes):
        return self._arr


class _RingAudit:
    """What each thread of the ring did, in its program order: its mbarrier operations (from
    ``ptx_mbarrier.record()``), the stages it read (the stage arrays are watched) and the
    TMA copies it issued (which k-tile, into which stage, completing on which barrier)."""

    def __init__(self, events):
        self.events = events                  # ptx_mbarrier.record()'s list, in order
        self.lock = threading.Lock()
        self.reads = defaultdict(list)        # thread -> [(block, pos, stage, tile)]
        self.copies = []                      # (pos, block, thread, side, stage, bi, col, row)
        self.tile = {}                        # (array id, stage) -> k-tile last copied there
        self.arrays = []
        self.starts = []                      # len(events) when each block started

    def touch(self, arr, idx, store):
        try:
            i = int(idx[0] if isinstance(idx, tuple) else idx)
        except (TypeError, ValueError):
            return
        blk, tid, _ = _me()
        stage = i // arr._stage_len
        entry = (int(blk[0]), len(self.events), stage, self.tile.get((id(arr), stage)))
        log = self.reads[tid]
        if not log or log[-1] != entry:
            log.append(entry)

    def copy(self, dst, di, col, row, bi):
        blk, tid, _ = _me()
        if not isinstance(dst, _RingArray):
            return
        stage = int(di) // dst._stage_len
        side = "A" if dst._arr.size > _RING_STAGES * 64 else "x"
        with self.lock:
            self.tile[(id(dst), stage)] = int(col) // 64
            self.copies.append((len(self.events), blk, tid, side, stage, int(bi), int(col),
                                int(row)))

    def stream(self, tid, block):
        """Thread ``tid``'s barrier events and reads in block ``block`` (the grid's
        ``block``-th, as the simulator runs them one after the other), merged in the
        thread's program order: ('event', event) and ('read', stage, k-tile there)."""
        lo = self.starts[block] if block < len(self.starts) else len(self.events)
        hi = self.starts[block + 1] if block + 1 < len(self.starts) else len(self.events)
        reads = [r[1:] for r in self.reads.get(tid, []) if r[0] == block]
        out, i = [], 0
        for e in self.events[lo:hi]:
            if e["thread"] != tid:
                continue
            while i < len(reads) and reads[i][0] <= e["seq"]:
                out.append(("read",) + reads[i][1:])
                i += 1
            out.append(("event", e))
        out += [("read",) + r[1:] for r in reads[i:]]
        return out


def _bar(e):
    """('full', 2) from an event's barrier name 'full[2]'."""
    name = e["barrier"]
    if not name.endswith("]"):
        return name, -1
    head, _, idx = name[:-1].rpartition("[")
    return head, int(idx)


_RING_NOW = []          # the ring audit in progress, if any


def _ring_block_started():
    if _RING_NOW:
        _RING_NOW[0].starts.append(len(_RING_NOW[0].events))


def _ring_no_stall(live):
    return None


@contextlib.contextmanager
def _ring_audit():
    """Watch the ring of exercises 6 and 7 (simulator only): the float stage arrays of the
    kernels launched inside are :class:`_RingArray`, ``ptx_tma.tma_load_2d`` notes each copy,
    and ``ptx_mbarrier.record()`` every barrier operation."""
    import numpy as np

    from . import ptx_mbarrier as mbar
    from . import ptx_tma as tmacopy
    real_tma = tmacopy.tma_load_2d
    with mbar.record() as events:
        audit = _RingAudit(events)

        def shared_array(shape, dtype, frame):
            if dtype.kind == "f":           # a stage array: NaN until written
                res = _RingArray(np.full(shape, np.nan, dtype), "stage", audit)
                audit.arrays.append(res)
                return res
            return np.zeros(shape, dtype)   # barriers stay plain: their names are read there

        def tma_load_2d(dst, di, tmap, col, row, bars, bi):
            real_tma(dst, di, tmap, col, row, bars, bi)
            audit.copy(dst, di, col, row, bi)

        from . import sim_scheduler
        sim_scheduler.add_hooks(_ring_block_started, _ring_no_stall)   # (added once)
        tmacopy.tma_load_2d = tma_load_2d
        _RING_NOW[:] = [audit]
        try:
            with shared_arrays(shared_array):
                yield audit
        finally:
            _RING_NOW[:] = []
            tmacopy.tma_load_2d = real_tma


_RING_CASES = (("the ring wraps twice: 7 k-tiles, one block", 64, 448),
               ("ragged: M = 70 (two blocks), K = 197", 70, 197),
               ("M = 1, one k-tile", 1, 40))


def _ring_launch(kernel, a, x):
    """y = A @ x with exercise 6's or 7's kernel: tensor maps of A (boxes 64 x 64) and of x
    as a 1 x K row (boxes 1 x 64), their rows padded to 16-byte multiples; y NaN-poisoned."""
    from . import ptx_tma as tmacopy
    M, K = a.shape
    K8 = _cdiv(K, 8) * 8
    ap = torch.zeros(M, K8, dtype=torch.float16)
    ap[:, :K] = a
    xp = torch.zeros(1, K8, dtype=torch.float16)
    xp[0, :K] = x
    tA = tmacopy.tensor_map_2d(ap[:, :K], _RING_ROWS)
    tx = tmacopy.tensor_map_2d(xp[:, :K], 1)
    y = torch.full((M,), float("nan"), dtype=torch.float32)
    kernel[_cdiv(M, _RING_ROWS), _RING_THREADS](engines.as_numba(tA.array),
                                               engines.as_numba(tx.array),
                                               engines.as_numba(y), M, K)
    return y


def _ring_consumer_problem(audit, k_tiles, blocks, finished):
    """The first mistake of a consumer thread of exercise 6, as a message, or None: the
    stage it reads at each step, a wait that returned for the wrong phase (parity), a stage
    read before its wait or after its release."""
    S = _RING_STAGES
    for e in audit.events:          # first what upsets every other thread's phases
        if e["thread"] >= 32 and e["op"] in ("arrive", "expect_tx") and _bar(e)[0] == "full":
            s = _bar(e)[1]
            return (f"consumer thread {e['thread']} arrives on full[{s}]: full[s] counts the "
                    "producer's arrival and the copies' bytes, and a consumer's arrival "
                    "completes its phases before the tile is there; a consumer releases the "
                    f"stage with mbarrier_arrive on empty[{s}]")
    for b in range(blocks):
        for tid in range(32, _RING_THREADS):
            hold, released, let_go = {}, defaultdict(int), set()
            steps, fresh = [], True
            for item in audit.stream(tid, b):
                if item[0] == "event":
                    e = item[1]
                    name, s = _bar(e)
                    fresh = True
                    if e["op"] == "wait" and name == "full":
                        hold[s] = e["phase"]
                        let_go.discard(s)
                    elif e["op"] == "arrive" and name == "empty":
                        if s not in hold:
                            return (f"the stage index: consumer thread {tid} arrives on "
                                    f"empty[{s}] but holds no tile of stage {s} (it did not "
                                    f"wait on full[{s}] since its last release): release the "
                                    "stage it waited for and read")
                        del hold[s]
                        released[s] += 1
                        let_go.add(s)
                    continue
                _, s, _tile = item
                if fresh or s != steps[-1]:
                    step = len(steps)
                    if step < k_tiles and s != step % S:
                        return (f"the stage index: at step kt = {step} consumer thread {tid} "
                                f"reads stage {s}; k-tile kt is in stage kt % STAGES = "
                                f"{step % S}")
                    steps.append(s)
                    fresh = False
                if s not in hold:
                    if s in let_go:
                        return (f"consumer thread {tid} reads stage {s} after it released it "
                                f"(mbarrier_arrive on empty[{s}]): once every consumer has "
                                "arrived, the producer may overwrite the stage while this "
                                "thread still reads it (a race). Release a stage after "
                                "reading it")
                    return (f"consumer thread {tid} reads stage {s} without waiting on "
                            f"full[{s}] first: its tile may not have landed (wait on "
                            f"full[{s}], then read)")
                if hold[s] != released[s]:
                    got = hold[s]
                    return (f"a wrong parity: at step {len(steps) - 1} consumer thread {tid} "
                            f"reads stage {s} in round {released[s]}, so phase {released[s]} "
                            f"of full[{s}] must have completed, but its wait returned for "
                            f"phase {got}"
                            + (" (the phase before the first, which counts as complete at "
                               "once)" if got == -1 else "")
                            + ": in round r = kt // STAGES the wait on full[s] passes parity "
                            "r & 1")
            if finished and len(steps) != k_tiles:
                return (f"consumer thread {tid} read {len(steps)} stages, where K holds "
                        f"{k_tiles} k-tiles: one stage per k-tile")
    return None


def _ring_tile_problem(audit, k_tiles, blocks, learner):
    """Which k-tile each consumer found in the stage it read at each step (the copies name
    it): k-tile kt at step kt, or a message."""
    for b in range(blocks):
        for tid in range(32, _RING_THREADS):
            step, fresh, last = -1, True, None
            for item in audit.stream(tid, b):
                if item[0] == "event":
                    fresh = True
                    continue
                _, s, tile = item
                if fresh or s != last:
                    step, fresh, last = step + 1, False, s
                if tile is not None and tile != step and step < k_tiles:
                    if learner == "producer":
                        return (f"the stage index: at step kt = {step} the consumers wait on "
                                f"full[{s}] and find k-tile {tile} in stage {s}: the producer "
                                "puts k-tile kt into stage kt % STAGES and completes it on "
                                "full[kt % STAGES]")
                    return (f"the stage index: at step kt = {step} consumer thread {tid} reads "
                            f"stage {s}, which holds k-tile {tile}; k-tile kt is in stage "
                            "kt % STAGES")
    return None


def _ring_producer_problem(audit, k_tiles, blocks, K):
    """The first mistake of exercise 7's producer, as a message, or None: a copy into one
    stage completing on another stage's barrier, a box at the wrong coordinates, a stage
    refilled before the consumers released it."""
    for e in audit.events:
        name, s = _bar(e)
        if e["thread"] == 0 and e["op"] == "arrive":
            return (f"the producer arrives on {name}[{s}] with mbarrier_arrive: its one "
                    f"arrival on full[s] per round is mbarrier_arrive_expect_tx, which "
                    f"announces the stage's bytes and arrives (full[s] expects 1 arrival); "
                    f"empty[s] is the consumers' to arrive on")
    order = defaultdict(int)
    for _pos, blk, _tid, side, stage, bi, col, row in audit.copies:
        n = order[(blk, side)]
        order[(blk, side)] += 1
        if stage != bi:
            return (f"the stage index: the copy of {side} into stage {stage} completes on "
                    f"full[{bi}]: the copies of k-tile kt go into stage kt % STAGES and "
                    "complete on full[kt % STAGES]")
        want_row = blk[0] * _RING_ROWS if side == "A" else 0
        if row != want_row or col != n * 64:
            return (f"the box coordinates: block {blk[0]}'s copy number {n} of {side} starts at "
                    f"(row {row}, column {col}), expected (row {want_row}, column {n * 64}): "
                    "tma_load_2d takes the column, then the row; k-tile kt starts at column "
                    "kt * 64, and this block's rows of A at row blockIdx.x * 64 (x is one row)")
    for b in range(blocks):
        waited, copies = {}, defaultdict(int)
        for item in audit.stream(0, b):
            if item[0] != "event":
                continue
            e = item[1]
            name, s = _bar(e)
            if e["op"] == "wait" and name == "empty":
                waited[s] = e["phase"]
            elif e["op"] == "copy" and name == "full":
                r = copies[s] // 2              # two copies a round: A's box, x's piece
                copies[s] += 1
                if r >= 1 and waited.get(s, -2) < r - 1:
                    if s in waited:
                        got = waited[s]
                        return (f"a wrong parity: the producer refills stage {s} for round {r} "
                                f"after a wait on empty[{s}] that returned for phase {got}"
                                + (" (the phase before the first, which counts as complete "
                                   "at once)" if got == -1 else "")
                                + f", where round {r} needs the consumers' release of round "
                                f"{r - 1}, phase {r - 1}: in round r = kt // STAGES the wait "
                                "on empty[s] passes the parity of phase r - 1, (r & 1) ^ 1, "
                                "so that round 0 does not block")
                    return (f"the producer refills stage {s} for round {r} before the "
                            f"consumers released round {r - 1} of it: it must wait on "
                            f"empty[{s}] (for phase {r - 1}) before it copies into the "
                            "stage, or it overwrites a tile the consumers still read")
    return None


def _deadlock_lines(err):
    """[(threads, parity, barrier name, stage, arrivals pending, bytes outstanding)] from an
    MbarrierDeadlock's message."""
    pat = re.compile(r"(\d+) thread\(s\) wait with parity (\d) on mbarrier (\w+)\[(\d+)\].*?"
                     r"(\d+) of \d+ arrivals pending, (-?\d+) transaction bytes outstanding")
    return [(int(n), int(p), name, int(s), int(a), int(t))
            for n, p, name, s, a, t in pat.findall(str(err))]


def _ring_stuck(err, audit, learner):
    """What an MbarrierDeadlock or MbarrierTxError of the ring says about the learner's
    side (the other side is the helper's, known right)."""
    from .ptx_mbarrier import MbarrierTxError
    text = str(err)
    if isinstance(err, MbarrierTxError) and learner == "consumer":
        return (f"an mbarrier received what its phase did not expect ({text}): the consumers "
                "wait on full[s] and arrive on empty[s], once per stage they read")
    overrun = re.search(r"full\[(\d+)\].*no arrival pending", text)
    if isinstance(err, MbarrierTxError) and overrun:
        # the producer announced a stage's next round before its last one was even complete
        s = overrun.group(1)
        waits = [e for e in audit.events if e["op"] == "wait" and _bar(e)[0] == "empty"
                 and e["thread"] == 0]
        if not waits:
            return (f"the producer announces stage {s} again before the consumers released "
                    f"it: it never waits on empty. Before it refills stage s it must wait on "
                    f"empty[s] for the consumers' release of the round before, or it "
                    f"overwrites a tile they still read. The simulator's report: {text}")
        return (f"a wrong parity: the producer's wait on empty[{s}] passed before the "
                f"consumers released the stage, so it announced the stage's next round while "
                f"the last one was still unread. In round r = kt // STAGES the wait passes the "
                f"parity of phase r - 1, (r & 1) ^ 1, so that round 0 does not block. The "
                f"simulator's report: {text}")
    if isinstance(err, MbarrierTxError):
        return (f"the expect_tx byte count: {text.split(': ', 1)[-1]} ({text.split(':')[0]}). "
                "mbarrier_arrive_expect_tx announces every byte the stage's copies will "
                "complete on full[s]: A's box and x's piece, 2 bytes an element")
    lines = _deadlock_lines(err)
    tx = [ln for ln in lines if ln[5] > 0]
    if tx:
        _, _, name, s, _, b = tx[0]
        return (f"the expect_tx byte count: {name}[{s}] still waits for {b} bytes that no copy "
                f"delivers (mbarrier_arrive_expect_tx announced more than the copies of the "
                f"stage bring: count the bytes of A's box and of x's piece, 2 bytes an "
                f"element). The simulator's report:\n{text}")
    consumer_arrives = sum(1 for e in audit.events if e["op"] == "arrive"
                           and _bar(e)[0] == "empty" and e["thread"] >= 32)
    if learner == "consumer":
        if not consumer_arrives:
            return ("a missing release: the producer waits on empty[s] for the consumers to "
                    "release a stage, and no consumer ever arrives on empty: after reading "
                    "stage s, every consumer thread arrives on empty[s] (mbarrier_arrive). "
                    f"The simulator's report:\n{text}")
        return ("the ring stops (a deadlock): every thread waits for a phase that nothing "
                "will complete. A wait on full[s] with a wrong parity (round r = kt // STAGES "
                "waits for phase r: parity r & 1), or a stage not released after its read. "
                f"The simulator's report:\n{text}")
    producer_waits = [ln for ln in lines if ln[2] == "empty" and ln[0] == 1]
    if producer_waits:
        _, p, name, s, pending, _ = producer_waits[0]
        return (f"a wrong parity: the producer waits with parity {p} on empty[{s}], for a "
                f"phase that the consumers never complete ({pending} arrivals pending: they "
                f"wait for a tile it has not copied). In round r = kt // STAGES the producer "
                f"needs the consumers' release of round r - 1, and in round 0 the ring is "
                f"empty: that wait must pass at once (the phase before the first, parity "
                f"1). The simulator's report:\n{text}")
    return ("the ring stops (a deadlock): the consumers wait for a tile the producer never "
            "announced and copied (one mbarrier_arrive_expect_tx and the copies on full[s] "
            f"per k-tile). The simulator's report:\n{text}")


def _ring_check(kernel, what, learner):
    """Run exercise 6's or 7's kernel on the cases (copies landing late, and at random
    moments on the longest case) under the ring audit; the result checked against float64."""
    from . import ptx
    from .ptx_mbarrier import MbarrierDeadlock, MbarrierTxError
    gen = torch.Generator().manual_seed(67)
    runs = [(c, None) for c in _RING_CASES] + [(_RING_CASES[0], seed) for seed in (1, 2)]
    for (name, M, K), seed in runs:
        a = torch.randn(M, K, generator=gen).half()
        x = torch.randn(K, generator=gen).half()
        k_tiles, blocks = _cdiv(K, 64), _cdiv(M, _RING_ROWS)
        where = f"{what}, {name}" + (f", copies landing at random (seed {seed})"
                                     if seed is not None else "")
        ctx = (ptx.cp_async_landing("random", seed=seed) if seed is not None
               else contextlib.nullcontext())
        err, y = None, None
        with ctx, _ring_audit() as audit, _answer(what, seconds=60):
            try:
                y = _ring_launch(kernel, a, x)
            except (MbarrierDeadlock, MbarrierTxError) as e:
                err = e
            except IndexError as e:
                if learner == "producer" and "tma_load_2d" in str(e):
                    raise ExerciseError(f"{where}: {e}: the stage index: stage s of the ring "
                                        "starts at element s * ROWS * 64 of sA and s * 64 of "
                                        "sx, with s = kt % STAGES") from None
                raise
        if learner == "consumer":
            problem = _ring_consumer_problem(audit, k_tiles, blocks, err is None)
        else:
            problem = _ring_producer_problem(audit, k_tiles, blocks, K)
        problem = problem or _ring_tile_problem(audit, k_tiles, blocks, learner)
        if problem:
            raise ExerciseError(f"{where}: {problem}")
        if err is not None:
            raise ExerciseError(f"{where}: {_ring_stuck(err, audit, learner)}")
        ref = a.double() @ x.double()
        bound = 1e-4 * (a.double().abs() @ x.double().abs()) + 1e-6
        bad = ~((y.double() - ref).abs() <= bound)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ExerciseError(f"{where}: y[{i}] = {float(y[i]):.6g}, expected "
                                f"{float(ref[i]):.6g} ({int(bad.sum())} of {M} rows wrong)"
                                + (": never written (NaN)" if math.isnan(float(y[i])) else ""))
    return len(runs)


def ex06_ring_consumer(kernel):
    """Lesson 06, exercise 6: the consumers' loop of a ring (wait on full, read, release on
    empty), with fill_ring as the producer."""
    n = _ring_check(kernel, "consumer loop", "consumer")
    return (f"consumer loop: y = A @ x right on {len(_RING_CASES)} shapes, {n} runs (copies "
            "landing late and at random); every read of a stage between its full phase and "
            "its release, in stage order")


def ex06_ring_producer(kernel):
    """Lesson 06, exercise 7: the producer's loop of a ring (wait on empty, expect_tx, the
    copies), with drain_ring as the consumers."""
    n = _ring_check(kernel, "producer loop", "producer")
    return (f"producer loop: y = A @ x right on {len(_RING_CASES)} shapes, {n} runs (copies "
            "landing late and at random); every stage refilled after its release, its bytes "
            "announced exactly")


# ------------------------------------------------------------------ lesson 07
def _grouped(pid, num_pid_m, num_pid_n, g):
    from .common import grouped_order
    return grouped_order(pid, num_pid_m, num_pid_n, g)


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
                    outside = [t for t in tiles if not (0 <= t[0] < num_pid_m
                                                        and 0 <= t[1] < num_pid_n)]
                    twice = len(tiles) - len(seen)
                    raise ExerciseError(
                        f"grid {num_pid_m} x {num_pid_n} tiles, group_size_m={g}: tiles "
                        f"{missing[:4]} are never computed"
                        + (f", {twice} computed twice" if twice else "")
                        + (f", programs get tiles outside the grid {outside[:4]}" if outside
                           else "")
                        + (" (is the last, ragged group handled?)" if num_pid_m % g else ""))
                p = next(i for i, (x, y) in enumerate(zip(tiles, want)) if x != y)
                rowmajor = tiles == [(q // num_pid_n, q % num_pid_n)
                                     for q in range(num_pid_m * num_pid_n)]
                raise ExerciseError(
                    f"{HINTS['order']}: grid {num_pid_m} x {num_pid_n}, group_size_m={g}: "
                    f"program {p} gets tile {tiles[p]}, the grouped order gives {want[p]}"
                    + (" (that is row-major order: " if rowmajor else " (")
                    + "inside a group, consecutive programs walk down a column of tiles)")
    return "my_grouped_order: the grouped order on 440 grids, ragged groups included"


def ex07_kernel(kernel):
    """Lesson 07, exercise 2: the Triton kernel (grouped mapping + masked K loop)."""
    from . import interp_poison
    from .kernels import k07_triton_swizzle as k07

    def run(a, b, c):
        bounds.allow(a, b, c)
        k07.matmul(a, b, c, kernel=kernel)

    with interp_poison.bounded_loads() as bounds, interp_poison.poison_masked_loads() as poison:
        try:
            report = check_product(run, "my_kernel", (torch.float16, torch.float32),
                                   _small_suite(("square", "rectangular", "ragged", "M=1",
                                                 "K=1", "A transposed")))
        except ExerciseError as e:
            text = str(e)
            if bounds.outside and "TODO" not in text:
                text = text.split("\nLikely cause:")[0] + (
                    "\nLikely cause: the K mask: the mask on the K-tile loads lets through "
                    f"{bounds.outside} lanes past the end of A or B (read as NaN here, stray "
                    "memory on a GPU): mask with the K position of the tile's elements, "
                    "k * BLOCK_SIZE_K + offs_k < K, not with offs_k alone")
            elif poison.poisoned and ("NaN" in text or "nan" in text):
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


def _strips(M, N, BM, BN, g, programs, order, *, whole_grid=False, floor=False):
    """(distinct pid_m, distinct pid_n) among the first programs, and some wrong variants."""
    num_pid_m, num_pid_n = (M // BM, N // BN) if floor else (_cdiv(M, BM), _cdiv(N, BN))
    count = num_pid_m * num_pid_n if whole_grid else min(programs, num_pid_m * num_pid_n)
    tiles = [order(p, num_pid_m, num_pid_n, g) for p in range(count)]
    return len({m for m, _ in tiles}), len({n for _, n in tiles})


def _column_major(pid, num_pid_m, num_pid_n, group_size_m):
    return pid % num_pid_m, pid // num_pid_m


def ex07_wave(first_wave):
    """Lesson 07, exercise 3: the L2 model of the first wave, for the tile order it is given
    (the grouped order, and a column-major one that no copy of the lesson's function fits)."""
    from .kernels import k07_triton_swizzle as k07
    grids = 0
    for order, name in ((_grouped, "grouped"), (_column_major, "column-major")):
        for M, N in [(8192, 8192), (4096, 4096), (16384, 2048), (500, 700), (1024, 65536)]:
            for g in (1, 4, 8):
                for programs in (132, 7):
                    grids += 1
                    want = (k07.first_wave(M, N, 128, 256, g, programs) if order is _grouped
                            else _strips(M, N, 128, 256, g, programs, order))
                    with _answer("my_first_wave", seconds=20):
                        got = tuple(first_wave(M, N, 128, 256, g, programs, order))
                    if got == tuple(want):
                        continue
                    args = (M, N, 128, 256, g, programs, order)
                    if order is _column_major and got == k07.first_wave(M, N, 128, 256, g,
                                                                        programs):
                        cause = ("the order passed in is not used: count the tiles that "
                                 "order(pid, ...) gives, whatever the order")
                    elif got == _strips(*args[:4], 1, programs, order) and g > 1:
                        cause = (f"{HINTS['order']}: these are the strips of group_size_m = 1 "
                                 "(row-major): pass group_size_m on to order")
                    elif got == _strips(*args, whole_grid=True):
                        cause = ("these are the strips of the whole grid, not of the first "
                                 "wave: only the first `programs` programs run at once")
                    elif got == tuple(reversed(want)):
                        cause = ("A and B swapped: A's strips are the distinct pid_m, B's the "
                                 "distinct pid_n")
                    elif got == _strips(*args, floor=True):
                        cause = (f"{HINTS['grid']}: a partial tile is a tile, "
                                 "the grid is triton.cdiv(M, BM) x triton.cdiv(N, BN)")
                    else:
                        cause = ("count the distinct pid_m and pid_n among the tiles of "
                                 "programs 0 .. programs - 1 (fewer when the grid is smaller)")
                    raise ExerciseError(f"{M} x {N}, GROUP_SIZE_M={g}, {programs} programs, "
                                        f"{name} order: got {got} (A strips, B strips), "
                                        f"expected {tuple(want)}: {cause}")
    rows = first_wave(8192, 8192, 128, 256, 1, 132, _grouped)
    grouped = first_wave(8192, 8192, 128, 256, 8, 132, _grouped)
    return (f"my_first_wave: right on {grids} grids and waves. 8192 x 8192, one wave of 132: "
            f"row-major {rows[0]} + {rows[1]} strips, grouped {grouped[0]} + {grouped[1]}")


def ex07_program_of(program_of):
    """Lesson 07, exercise 4: the inverse of the grouped order, (pid_m, pid_n) -> pid, in
    closed form (a search over programs is too slow on a large grid)."""
    import random
    grids = 0
    for num_pid_m in range(1, 12):
        for num_pid_n in range(1, 9):
            for g in (1, 2, 3, 4, 8):
                grids += 1
                want = {_grouped(p, num_pid_m, num_pid_n, g): p
                        for p in range(num_pid_m * num_pid_n)}
                with _answer("my_program_of", seconds=20):
                    got = {t: program_of(*t, num_pid_m, num_pid_n, g) for t in want}
                bad = [(t, got[t], p) for t, p in want.items() if got[t] != p]
                if not bad:
                    continue
                (m, n), pid, p = bad[0]
                rowmajor = all(got[(i, j)] == i * num_pid_n + j for i, j in want)
                ragged = all(got[(i, j)] == (i // g * g) * num_pid_n + j * g + i % g
                             for i, j in want)
                why = (" (that is row-major order)" if rowmajor else
                       " (the grouped order with every group group_size_m rows high: the "
                       "last, ragged group has only num_pid_m - first_pid_m rows)" if ragged else
                       " (the groups above the tile's hold group_size_m * num_pid_n programs "
                       "each; inside a group, consecutive programs walk down a column of tiles)")
                raise ExerciseError(
                    f"{HINTS['order']}: grid {num_pid_m} x {num_pid_n}, group_size_m={g}: "
                    f"my_program_of({m}, {n}, ...) = {pid}, but program {p} computes tile "
                    f"({m}, {n}) in the grouped order{why}")
    # a large grid, tiles sampled: a closed form answers at once, a search does not
    rng = random.Random(7)
    num_pid_m, num_pid_n, g = 3001, 2003, 8
    pids = [rng.randrange(num_pid_m * num_pid_n) for _ in range(300)]
    with _answer(f"my_program_of on {len(pids)} tiles of a 3001 x 2003 grid (compute the "
                 "program from the tile's group in a few operations, without a search over "
                 "programs)", seconds=5):
        for p in pids:
            t = _grouped(p, num_pid_m, num_pid_n, g)
            got = program_of(*t, num_pid_m, num_pid_n, g)
            if got != p:
                raise ExerciseError(f"{HINTS['order']}: grid {num_pid_m} x {num_pid_n}, "
                                    f"group_size_m={g}: my_program_of{t} = {got}, expected {p}")
    nine = {t: program_of(*t, 9, 9, 3) for t in ((0, 8), (8, 0), (8, 8))}
    return (f"my_program_of: the inverse of the grouped order on {grids + 1} grids, ragged "
            f"groups included. 9 x 9 tiles, group_size_m = 3: tile (0, 8) is program "
            f"{nine[(0, 8)]}, (8, 0) is {nine[(8, 0)]}, (8, 8) is {nine[(8, 8)]}")


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
    if getattr(tuned, "_do_bench", "unknown") is None:
        raise ExerciseError("no do_bench given: Triton's own benchmark times configs on a GPU "
                            "driver, which Triton's interpreter does not have; give "
                            "do_bench=k08.cpu_timer")
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


# The most shared memory one program may use, by compute capability (bytes; the CUDA C++
# Programming Guide's "maximum amount of shared memory per thread block").
_SMEM_LIMIT08 = {(8, 0): 163 * 1024, (8, 6): 99 * 1024, (8, 9): 99 * 1024, (9, 0): 227 * 1024}


def _stage_buffers08(num_stages, capability):
    """Buffers (one tile of A and one of B each) Triton allocates for ``num_stages`` >= 2
    when tl.dot runs on the tensor cores (fp16, bf16, fp32 as TF32): one per stage on Hopper,
    where wgmma reads shared memory while the next copies are issued; one fewer on Ampere and
    Ada, where mma.sync reads registers (lesson 07 reads both from the compiler's IR; Triton
    3.9's compiler gives the same counts for fp32 as TF32, and num_stages - 1 on sm_90 too
    for fp32 with input_precision="ieee", which runs on the FMA units)."""
    return num_stages if tuple(capability) >= (9, 0) else num_stages - 1


@contextlib.contextmanager
def _own_count08(k08):
    """Inside the block, lesson 08's own buffer count refuses to be called: the exercise is
    to count the buffers and bytes, not to ask the package."""
    def refused(name):
        def call(*args, **kwargs):
            raise ExerciseError(f"my_prune calls k08.{name}: count the stage buffers and their "
                                "bytes in your own code (that count is the exercise)")
        return call
    names = ("stage_buffers", "smem_bytes", "smem_limit")
    saved = {n: getattr(k08, n) for n in names}
    try:
        for n in names:
            setattr(k08, n, refused(n))
        yield
    finally:
        for n, f in saved.items():
            setattr(k08, n, f)


def ex08_prune(prune):
    """Lesson 08, exercise 3: prune the configs whose stage buffers do not fit, for the GPU
    architecture given as ``capability`` (the buffer count and the limit both depend on it)."""
    from .kernels import k08_triton_autotune as k08
    configs = [k08.make_config(128, 256, 64, 8, 3), k08.make_config(128, 256, 64, 8, 4),
               k08.make_config(128, 256, 64, 8, 5), k08.make_config(256, 256, 64, 8, 4),
               k08.make_config(128, 128, 128, 8, 3), k08.make_config(64, 64, 32, 4, 6),
               k08.make_config(128, 64, 32, 4, 2), k08.make_config(128, 128, 64, 4, 4)]

    def tile(c):
        kw = c.kwargs
        return (kw["BLOCK_SIZE_M"] + kw["BLOCK_SIZE_N"]) * kw["BLOCK_SIZE_K"]

    def kept(cc, size, buffers=_stage_buffers08, limit=None):
        limit = _SMEM_LIMIT08[cc] if limit is None else limit
        return [k08.label(c) for c in configs
                if buffers(c.num_stages, cc) * tile(c) * size <= limit]

    cases = [(cc, dtype) for cc in ((9, 0), (8, 0), (8, 6))
             for dtype in (torch.float16, torch.float32)]
    sizes = {dtype: torch.empty(0, dtype=dtype).element_size() for _, dtype in cases}
    got = {}
    for cc, dtype in cases:
        with _answer("my_prune", seconds=10), _own_count08(k08):
            got[cc, dtype] = [k08.label(c) for c in prune(
                list(configs), {"a_ptr": torch.empty(1, dtype=dtype)}, capability=cc)]
    wrong = [(cc, dtype) for cc, dtype in cases if got[cc, dtype] != kept(cc, sizes[dtype])]
    if wrong:
        # which typical mistake explains every answer?
        models = [
            (lambda cc, size: kept(cc, size, buffers=lambda n, c: n),
             "on Ampere and Ada (sm_80, sm_86, sm_89) Triton allocates num_stages - 1 buffers "
             "(mma.sync takes its operands from registers, so the stage being computed needs "
             "no buffer of its own); num_stages buffers is Hopper's count"),
            (lambda cc, size: kept(cc, size, buffers=lambda n, c: n - 1),
             "on Hopper (sm_90) each of the num_stages stages has its own buffer: wgmma reads "
             "its operands from shared memory while the next copies are issued"),
            (lambda cc, size: kept(cc, size, buffers=lambda n, c: 1),
             "num_stages: the stage buffers are counted as one"),
        ]
        models += [(lambda cc, size, s=s: kept(cc, s),
                    "the element size: bytes = elements x named_args['a_ptr'].dtype.itemsize")
                   for s in (1, 2, 4)]
        models += [(lambda cc, size, lim=lim: kept(cc, size, limit=lim),
                    "the limit: SMEM_LIMIT[capability] depends on the GPU, the limit of another "
                    "GPU was used") for lim in sorted(set(_SMEM_LIMIT08.values()))]
        cause = next((why for model, why in models
                      if all(got[k] == model(k[0], sizes[k[1]]) for k in cases)),
                     "buffers x (BLOCK_SIZE_M + BLOCK_SIZE_N) x BLOCK_SIZE_K x element size, at "
                     "most SMEM_LIMIT[capability] bytes (<=), with num_stages buffers on sm_90 and "
                     "num_stages - 1 on sm_80, sm_86, sm_89")
        cc, dtype = wrong[0]
        raise ExerciseError(f"sm_{cc[0]}{cc[1]}, {str(dtype).replace('torch.', '')}: kept "
                            f"{got[cc, dtype]}, expected {kept(cc, sizes[dtype])}. Likely cause: "
                            f"{cause}")
    with _answer("my_prune", seconds=10), _own_count08(k08):
        fp16 = {"a_ptr": torch.empty(1, dtype=torch.float16)}
        got = [k08.label(c) for c in prune(list(configs), fp16)]
    if got != kept((9, 0), 2):
        raise ExerciseError(f"without a capability: kept {got}, expected {kept((9, 0), 2)} (the "
                            "default capability is (9, 0), an H100/H200)")
    return "my_prune: stage buffers counted for sm_90, sm_80 and sm_86, in fp16 and fp32 (TF32)"


def _tma_cases08():
    """(what, tensor, can a descriptor read it in place) on the engine's device."""
    gen = torch.Generator().manual_seed(8)
    dev = engines.device()

    def r(*shape, dtype=torch.float16):
        return torch.randn(*shape, generator=gen).to(dtype).to(dev)
    f32 = torch.float32
    return [
        ("a contiguous fp16 40 x 64", r(40, 64), True),
        ("a contiguous fp16 40 x 24 (rows of 48 bytes)", r(40, 24), True),
        ("a contiguous fp32 40 x 4 (rows of 16 bytes)", r(40, 4, dtype=f32), True),
        ("columns 0..22 of an fp16 40 x 64 (23 columns, rows 128 bytes apart)",
         r(40, 64)[:, :23], True),
        ("rows 8.. of an fp32 48 x 20 (rows 80 bytes apart, the first at byte 640)",
         r(48, 20, dtype=f32)[8:], True),
        ("a contiguous fp16 40 x 23 (rows of 46 bytes)", r(40, 23), False),
        ("a contiguous fp32 40 x 5 (rows of 20 bytes)", r(40, 5, dtype=f32), False),
        ("a transposed fp16 view, 64 x 40 .t() (strides (1, 40))", r(64, 40).t(), False),
        ("every second column of an fp16 40 x 64 (strides (64, 2))", r(40, 64)[:, ::2], False),
        ("the slice [1:, 1:] of an fp16 41 x 72 (its first element 146 bytes past the "
         "buffer's aligned start)", r(41, 72)[1:, 1:], False),
    ]


def ex08_tma(tma_operand):
    """Lesson 08, exercise 4: an operand a TMA descriptor can read: in place when its last
    stride is 1 and its row stride and base are multiples of 16 bytes, else a copy with rows
    padded to 16 bytes, viewed with the true shape. Then the persistent TMA kernel runs on
    the answer's operands."""
    import triton
    from .kernels import k08_triton_tma as k08t
    for what, t, ready in _tma_cases08():
        size = t.element_size()
        with _answer("tma_operand", seconds=10):
            got = tma_operand(t)
        if not isinstance(got, torch.Tensor):
            raise ExerciseError(f"{what}: tma_operand returned {type(got).__name__}, not a tensor")
        if ready:
            if got.data_ptr() != t.data_ptr() or got.stride() != t.stride() or got.shape != t.shape:
                raise ExerciseError(
                    f"{what}: a descriptor can read it in place (last stride 1, rows "
                    f"{t.stride(0) * size} bytes apart, base 16-byte aligned), but tma_operand "
                    "copied it: use it in place, no copy (this is the case that is timed). Likely "
                    "cause: the test counts elements instead of bytes (stride(0) x "
                    "element_size()), or looks at the shape instead of the row stride")
            continue
        if tuple(got.shape) != tuple(t.shape):
            raise ExerciseError(f"{what}: returned shape {tuple(got.shape)}, not {tuple(t.shape)}: "
                                "return the padded buffer as a view with the true shape "
                                "(buf[:, :cols]): the descriptor keeps the true shape, so the "
                                "padding is never read")
        if got.dtype != t.dtype:
            raise ExerciseError(f"{what}: returned {got.dtype}, not {t.dtype}")
        if got.stride(1) != 1:
            raise ExerciseError(f"{what}: the result's last stride is {got.stride(1)}: a "
                                "descriptor needs the last stride 1 (a transposed view must be "
                                "copied)")
        if got.data_ptr() % 16:
            raise ExerciseError(f"{what}: the result's first element is at an address "
                                f"{got.data_ptr() % 16} bytes past a multiple of 16: a descriptor "
                                "needs a 16-byte-aligned base address (check t.data_ptr() % 16)")
        if got.stride(0) * size % 16:
            raise ExerciseError(f"{what}: the result's rows are {got.stride(0) * size} bytes "
                                "apart: a descriptor needs a multiple of 16 bytes; pad each row "
                                f"({16 // size} elements of {size} bytes are 16 bytes)")
        if not torch.equal(got, t):
            raise ExerciseError(f"{what}: the result holds other values: copy t into the padded "
                                "view (view.copy_(t))")
    # the persistent TMA kernel of the lesson on the answer's operands: ragged K, B transposed
    gen = torch.Generator().manual_seed(9)
    dev = engines.device()
    a = torch.randn(40, 23, generator=gen).half().to(dev)
    b = torch.randn(29, 23, generator=gen).half().to(dev).t()
    c = torch.full((40, 29), float("nan"), dtype=torch.float16, device=dev)
    cfg = k08t.SIM_CONFIG
    with _answer("tma_operand"):
        a2, b2 = tma_operand(a), tma_operand(b)
        out = k08t.tma_view(c, copy=False)
        a_desc, b_desc, c_desc = k08t.descriptors(a2, b2, out, cfg)
        tiles = triton.cdiv(40, cfg.BM) * triton.cdiv(29, cfg.BN)
        k08t.tma_persistent_kernel[(min(k08t.SIM_SMS, tiles),)](
            a_desc, b_desc, c_desc, 40, 29, 23, BLOCK_SIZE_M=cfg.BM, BLOCK_SIZE_N=cfg.BN,
            BLOCK_SIZE_K=cfg.BK, GROUP_SIZE_M=k08t.GROUP_SIZE_M, NUM_SMS=k08t.SIM_SMS,
            INPUT_PRECISION="tf32", num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        c.copy_(out)
    ok, _, _ = harness.compare(c, harness.reference(a, b), a, b, torch.float16)
    if not ok:
        raise ExerciseError("the TMA kernel on your operands (A 40 x 23, B transposed) gives a "
                            "wrong product: the copies must hold t's values, viewed with t's shape")
    return ("tma_operand: 5 operands read in place, 5 copied into rows padded to 16 bytes; the "
            "persistent TMA kernel right on them")


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
                                f"the bias ({HINTS['mask']}, or other=0.0)")
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


def _partial_launch09(kernel, a, b, k_per_split):
    """Launch a first pass of split-K: grid (tiles of M, tiles of N, slices), 16 x 16 x 16
    tiles; the workspace (S, M, N) fp32 starts as NaN."""
    M, K = a.shape
    N = b.shape[1]
    S = _cdiv(K, k_per_split)
    ws = torch.full((S, M, N), float("nan"), dtype=torch.float32, device=a.device)
    kernel[(_cdiv(M, 16), _cdiv(N, 16), S)](
        a, b, ws, M, N, K, k_per_split, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        ws.stride(0), ws.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return ws


def _slices09(a, b, K, k_per_split, bounds=None):
    """float64 partial sums of a @ b over K[s * k_per_split : ...]; ``bounds(lo, hi)`` may
    move each slice's columns (models of typical mistakes)."""
    S = _cdiv(K, k_per_split)
    out = []
    for s in range(S):
        lo, hi = s * k_per_split, min(K, (s + 1) * k_per_split)
        lo, hi = (lo, hi) if bounds is None else bounds(lo, hi)
        out.append(a[:, lo:hi].double() @ b[lo:hi].double())
    return torch.stack(out)


def ex09_splitk_partial(kernel):
    """Lesson 09, exercise 4: the first pass of split-K. Program (pid_m, pid_n, pid_k) sums
    its tile over K[pid_k * K_PER_SPLIT : (pid_k + 1) * K_PER_SPLIT] (the last slice is
    shorter) in fp32 and stores the partial in ws[pid_k]. A and B are views into larger
    buffers, so a read past K finds numbers, not zeros; masked-off lanes of a load without
    other= come back NaN in Triton's interpreter, as undefined as on a GPU."""
    from . import interp_poison
    gen = torch.Generator().manual_seed(3)
    M, N, K = 37, 29, 200
    big_a, big_b = _rand(gen, 48, 256), _rand(gen, 256, 48)
    a, b = big_a[:M, :K], big_b[:K, :N]
    for kps in (64, 80, 208):
        S = _cdiv(K, kps)
        want = _slices09(a, b, K, kps)
        with interp_poison.poison_masked_loads() as poison, _answer("my_splitk_partial"):
            ws = _partial_launch09(kernel, a, b, kps)
        where = f"K = {K}, K_PER_SPLIT = {kps} ({S} slices, the last {K - (S - 1) * kps} long)"
        nan = ws.isnan().flatten(1)
        if bool(nan.all()):
            raise ExerciseError(f"{where}: nothing was written (all NaN): {HINTS['todo']}, or "
                                "the partial is never stored")
        if bool(nan.any()) and poison.poisoned:
            bad = [s for s in range(S) if bool(nan[s].any())]
            raise ExerciseError(
                f"{where}: NaN in slices {bad}. Likely cause: {HINTS['other']}: the lanes the "
                "K mask switches off are undefined on a GPU (NaN here) and reach tl.dot; give "
                "both loads other=0.0")
        unwritten = [s for s in range(S) if bool(nan[s].all())]
        if unwritten:
            if unwritten == list(range(1, S)):
                raise ExerciseError(f"{where}: only ws[0] was written: each program stores its "
                                    "partial in its own slice of the workspace, at ws_ptr + "
                                    "pid_k * stride_ws")
            raise ExerciseError(f"{where}: slices {unwritten} of the workspace were never "
                                "written: store at ws_ptr + pid_k * stride_ws")
        if bool(nan.any()):
            bad = [s for s in range(S) if bool(nan[s].any())]
            raise ExerciseError(f"{where}: NaN in slices {bad}: a load outside A or B "
                                f"({HINTS['mask']})")
        good = [_close(ws[s], want[s]) for s in range(S)]
        if all(good):
            continue
        rel = max(((ws[s].double() - want[s]).abs() / (want[s].abs() + 1)).max().item()
                  for s in range(S))
        if rel < 3e-2:
            raise ExerciseError(f"{where}: errors of the size of fp16 rounding (up to {rel:.2g} "
                                f"of a value). Likely cause: {HINTS['accumulator']}: accumulate "
                                "in fp32 (tl.zeros(..., dtype=tl.float32)) and store the fp32 "
                                "partial as it is")
        whole = a.double() @ b.double()
        if S > 1 and all(_close(ws[s], whole) for s in range(S)):
            raise ExerciseError(f"{where}: every slice holds the whole product A @ B: a program "
                                "sums only its own slice of K, K[pid_k * K_PER_SPLIT : "
                                "(pid_k + 1) * K_PER_SPLIT]")
        first = _slices09(a, b, K, kps, bounds=lambda lo, hi: (0, hi - lo))
        if S > 1 and all(_close(ws[s], first[s]) for s in range(S)):
            raise ExerciseError(f"{where}: every slice holds a partial sum over the first "
                                "columns of A: the pointers must start at the slice's first k, "
                                "k_start = pid_k * K_PER_SPLIT")
        if all(good[:-1]):
            lo = (S - 1) * kps
            over = _slices09(big_a[:M], big_b[:, :N], K, kps,
                             bounds=lambda lo, hi: (lo, lo + _cdiv(hi - lo, 16) * 16))
            short = _slices09(a, b, K, kps, bounds=lambda lo, hi: (lo, lo + (hi - lo) // 16 * 16))
            if _close(ws[-1], over[-1]):
                raise ExerciseError(
                    f"{where}: the last slice, K[{lo}:{K}], read past K. Likely cause: "
                    f"{HINTS['mask']} on the K tail: mask against what is left of this slice "
                    "(k_len - k * BLOCK_K, with k_len = min(K - k_start, K_PER_SPLIT)), not "
                    "against K or K_PER_SPLIT")
            if _close(ws[-1], short[-1]):
                raise ExerciseError(
                    f"{where}: the last slice, K[{lo}:{K}], left out its K tail: an off-by-one "
                    "in the K tail: the loop takes cdiv(k_len, BLOCK_K) steps, the last one "
                    "masked")
            raise ExerciseError(f"{where}: the last, shorter slice K[{lo}:{K}] is wrong: the "
                                f"K tail ({HINTS['mask']} against what is left of the slice)")
        s = good.index(False)
        err = (ws[s].double() - want[s]).abs().max().item()
        raise ExerciseError(f"{where}: slice {s} is wrong (largest error {err:.3g}). Likely "
                            "cause: the slice's bounds (k_start = pid_k * K_PER_SPLIT, k_len = "
                            "min(K - k_start, K_PER_SPLIT)) or the K masks")
    # partial sums near 1024 that cancel inside a slice: right in fp32, not in fp16
    K = 128
    a, b = big_a[:M, :K].clone(), big_b[:K, :N].clone()
    for k0 in (0, 64):
        a[:, k0], b[k0], a[:, k0 + 16], b[k0 + 16] = 32.0, 32.0, 32.0, -32.0
    with interp_poison.poison_masked_loads(), _answer("my_splitk_partial"):
        ws = _partial_launch09(kernel, a, b, 64)
    want = _slices09(a, b, K, 64)
    if not all(_close(ws[s], want[s]) for s in range(2)):
        err = (ws.double() - want).abs().max().item()
        raise ExerciseError(f"K = 128, two slices whose partial sums pass 1024 and come back: "
                            f"largest error {err:.3g}. Likely cause: {HINTS['accumulator']}: "
                            "accumulate in fp32 (tl.zeros(..., dtype=tl.float32)); fp16 steps "
                            "by 1.0 near 1024")
    return ("my_splitk_partial: 3 splits of K = 200 (short last slices, reads past K would find "
            "numbers), each program its own slice, fp32 partials")
