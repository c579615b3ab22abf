"""Simulator instruments: what each warp-level memory access costs, counted on a laptop.

In numba's CUDA simulator every CUDA thread is a Python thread, so every ``A[i, k]`` a
kernel executes can be recorded with its thread, its byte address and its size. Grouping
the k-th access of each of the 32 lanes of a warp gives the *warp-level request* that the
hardware would issue, and from its addresses:

* **global memory**: the number of distinct 32-byte *sectors* it touches (4 for 32 lanes
  reading consecutive float32, 32 when the lanes are a row apart);
* **shared memory**: its *bank-conflict degree* ("ways"): shared memory has 32 banks of
  4-byte words (word ``w`` lives in bank ``w % 32``); each bank serves one distinct word per
  cycle, so a request needs as many cycles as its busiest bank has distinct words. Lanes
  reading the same word are served by one broadcast, not a conflict.

Use :func:`trace` around a launch on the simulator::

    with counters.trace() as t:
        gl.matmul(a, b, kernel="k01_naive")
    t.global_summary()     # {array: {'load': sectors/request, 'store': ...}}
    t.shared_summary()     # {array: {'load': ways, ...}}

The recording is approximate where lanes diverge (a lane that skips an access shifts its
later accesses by one), exact for the straight-line code of the lessons.
"""
from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from . import common, engines
from ._ptx_plumbing import RecordedArray, record_wide_access, shared_arrays, unwrap

__all__ = ["trace", "simulate", "Trace", "Access", "sectors_per_request", "bank_ways",
           "banks_of_request", "unwrap", "record_wide_access", "SECTOR_BYTES", "N_BANKS",
           "BANK_BYTES"]

SECTOR_BYTES = 32
N_BANKS = 32
BANK_BYTES = 4


@dataclass(frozen=True)
class Access:
    space: str        # "global" or "shared"
    array: str        # a name: the kernel argument's position ("arg0"...) or "shared@line"
    op: str           # "load" or "store"
    block: tuple
    warp: int
    lane: int
    seq: int          # this lane's n-th access to this array with this op
    addr: int         # byte address (relative to the array's buffer start)
    nbytes: int


def _flat_offsets(arr: np.ndarray, idx):
    """Byte offsets (from the buffer start) of the elements ``arr[idx]`` touches."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if all(isinstance(i, (int, np.integer)) for i in idx) and len(idx) == arr.ndim:
        off = sum(int(i) * s for i, s in zip(idx, arr.strides))
        return [off]
    # slices (rare in kernels): every element of the view
    view = arr[idx]
    base = view.__array_interface__["data"][0] - arr.__array_interface__["data"][0]
    it = np.nditer(np.zeros(view.shape, np.int8), flags=["multi_index"]) if view.ndim else [None]
    offs = []
    for _ in it:
        mi = it.multi_index if view.ndim else ()
        offs.append(base + sum(i * s for i, s in zip(mi, view.strides)))
    return offs


class Trace:
    """The accesses recorded during a :func:`trace` block."""

    def __init__(self):
        self.accesses: list[Access] = []
        self._lock = threading.Lock()
        self._seq = defaultdict(int)

    def __getstate__(self):        # picklable (for simulate() across processes)
        return {"accesses": self.accesses}

    def __setstate__(self, state):
        self.__init__()
        self.accesses = state["accesses"]

    # -- recording -------------------------------------------------------------------
    def record(self, space, name, op, base_addr, arr, idx):
        """Record the access of this simulated thread to `arr[idx]` (`base_addr`: the
        address the offsets count from; 0 for shared arrays)."""
        th = threading.current_thread()
        tid = getattr(th, "thread_id", None)
        if tid is None:        # not inside a simulated kernel (host code): ignore
            return
        block = tuple(th.blockIdx)
        for off in _flat_offsets(arr, idx):
            key = (space, name, op, block, tid)
            with self._lock:
                seq = self._seq[key]
                self._seq[key] = seq + 1
                self.accesses.append(Access(space, name, op, block, tid // 32, tid % 32, seq,
                                            base_addr + off, arr.itemsize))

    # -- analysis --------------------------------------------------------------------
    def requests(self, space=None, array=None, op=None):
        """{(space, array, op, block, warp, seq): [Access of each lane]}"""
        groups = defaultdict(list)
        for a in self.accesses:
            if (space is None or a.space == space) and (array is None or a.array == array) \
                    and (op is None or a.op == op):
                groups[(a.space, a.array, a.op, a.block, a.warp, a.seq)].append(a)
        return groups

    def arrays(self, space):
        return sorted({a.array for a in self.accesses if a.space == space})

    def _summary(self, space, metric):
        out = {}
        for name in self.arrays(space):
            row = {}
            for op in ("load", "store"):
                reqs = self.requests(space, name, op)
                if reqs:
                    row[op] = float(np.mean([metric(r) for r in reqs.values()]))
            out[name] = row
        return out

    def global_summary(self):
        """{array: {"load": mean sectors per warp request, "store": ...}}"""
        return self._summary("global", sectors_per_request)

    def shared_summary(self):
        """{array: {"load": mean bank-conflict ways per warp request, "store": ...}}"""
        return self._summary("shared", bank_ways)

    def max_shared_ways(self, op=None):
        reqs = self.requests("shared", op=op)
        return max((bank_ways(r) for r in reqs.values()), default=0)


def sectors_per_request(accesses):
    """Distinct 32-byte sectors touched by one warp-level request."""
    secs = set()
    for a in accesses:
        for byte in (a.addr, a.addr + a.nbytes - 1):
            secs.add(byte // SECTOR_BYTES)
    return len(secs)


def banks_of_request(accesses):
    """{bank: set of distinct 4-byte words} for one warp-level shared-memory request."""
    banks = defaultdict(set)
    for a in accesses:
        for word in range(a.addr // BANK_BYTES, (a.addr + a.nbytes - 1) // BANK_BYTES + 1):
            banks[word % N_BANKS].add(word)
    return banks


def bank_ways(accesses):
    """Bank-conflict degree of one warp request: distinct words in its busiest bank."""
    banks = banks_of_request(accesses)
    return max((len(w) for w in banks.values()), default=0)


@contextlib.contextmanager
def trace(**names):
    """Record every global- and shared-memory access of the kernels launched inside.

    Name the global arrays by passing the torch tensors: ``trace(A=a, B=b, C=c)``
    (others are called ``array0``, ``array1``...). Simulator only (on a GPU use ``ncu``:
    the lessons show the matching metrics)."""
    if engines.on_gpu():
        raise RuntimeError("counters.trace() instruments numba's simulator; on a GPU, "
                           "measure with ncu (see the lesson's GPU cell)")
    from numba.cuda.simulator.cudadrv import devicearray as da

    tr = Trace()
    W = da.FakeWithinKernelCUDAArray
    old_get, old_set = W.__getitem__, W.__setitem__
    by_ptr = {t.data_ptr(): n for n, t in names.items()}
    arg_names = {}

    def gname(self):
        ary = self._item._ary
        ptr = ary.__array_interface__["data"][0]
        if ptr not in arg_names:
            arg_names[ptr] = by_ptr.get(ptr, f"array{len(arg_names)}")
        return arg_names[ptr], ary, ptr

    def get(self, idx):
        name, ary, ptr = gname(self)
        tr.record("global", name, "load", ptr, ary, idx)
        return old_get(self, idx)

    def set_(self, idx, val):
        name, ary, ptr = gname(self)
        tr.record("global", name, "store", ptr, ary, idx)
        return old_set(self, idx, val)

    def shared_array(shape, dtype, frame):     # (dynamic shared memory is not recorded)
        name = f"shared@{frame.f_code.co_name}:{frame.f_lineno}"
        return RecordedArray(np.empty(shape, dtype), name, tr)

    W.__getitem__, W.__setitem__ = get, set_
    try:
        with shared_arrays(shared_array):
            yield tr
    finally:
        W.__getitem__, W.__setitem__ = old_get, old_set


def _simulate_here(kernel, M, N, K, dtype, seed, a_layout, b_layout):
    import torch
    from . import api, harness
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    a, b = harness.make_operands(M, N, K, dt, seed=seed, a=a_layout, b=b_layout)
    c = torch.empty(M, N, dtype=dt)
    with trace(A=a, B=b, C=c) as t:
        api.matmul(a, b, kernel, out=c)
    return t


def simulate(kernel, M, N, K, dtype="float32", *, seed=0, a="row", b="row") -> Trace:
    """Run the registered ``kernel`` once on seeded M x N x K inputs in the simulator and
    return its :class:`Trace` (global arrays named A, B, C).

    Works on every engine, so a lesson's counts are the same on a laptop and on a GPU: on
    the simulator it runs here; on a GPU, in a child process with the simulator switched on.
    """
    dtype = common.dtype_name(dtype)
    return common.run_on_simulator("gemm_lessons.counters:_simulate_here", kernel, M, N, K, dtype, seed, a, b)
