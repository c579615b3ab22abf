"""Shared-memory bank pictures and tables for lessons 03 and 04, from the simulator's traces
(:mod:`gemm_lessons.counters`).

* :func:`simulate_launcher` runs any launcher with any tile configuration once in the
  simulator (in a child process when this process drives a GPU), so a lesson can count the
  bank conflicts of the configuration a GPU runs, with the same numbers everywhere;
* :func:`shared_names` gives the traced shared arrays their names in the kernel source
  (``sA``, ``sB``) instead of ``shared@kernel:line``;
* :func:`ways_table` prints ways (passes) per warp request, array by array;
* :func:`lane_bank_plot` draws one warp request: which bank each lane's word is in.

Shared memory has 32 banks of 4-byte words (word ``w`` in bank ``w % 32``). A warp request
takes as many passes ("ways") as its busiest bank has distinct words; lanes that read the
same word share one pass (a broadcast).
"""
from __future__ import annotations

import importlib
import inspect
import re

import numpy as np

from . import counters
from .common import run_on_simulator

__all__ = ["simulate_launcher", "shared_names", "ways", "passes", "ways_table",
           "lane_bank_grid", "lane_bank_plot"]


def _run_here(target, config, M, N, K, seed):
    import torch
    from . import harness
    module, func = target.split(":")
    launch = getattr(importlib.import_module(module), func)
    a, b = harness.make_operands(M, N, K, seed=seed)
    c = torch.empty(M, N)
    with counters.trace(A=a, B=b, C=c) as t:
        launch(a, b, c, **config)
    return t


def simulate_launcher(target, config, M, N, K, *, seed=0):
    """Trace one launch of ``target`` (``"module:function"``, a launcher taking
    ``(a, b, c, **config)``) on seeded M x N x K inputs in the simulator; returns the
    :class:`counters.Trace`. On a GPU it runs in a child process with the simulator on."""
    return run_on_simulator("gemm_lessons.banks:_run_here", target, dict(config),
                            M, N, K, seed)


def shared_names(module):
    """{'shared@function:line': variable name} for the ``cuda.shared.array`` lines of a
    kernel module (the names a trace uses -> the names in the source)."""
    lines = inspect.getsource(module).splitlines()
    out = {}
    func = None
    for i, line in enumerate(lines, start=1):
        m = re.match(r"\s*def (\w+)\(", line)
        if m:
            func = m.group(1)
        m = re.match(r"\s*(\w+)\s*=\s*cuda\.shared\.array\(", line)
        if m and func:
            out[f"shared@{func}:{i}"] = m.group(1)
    return out


def ways(trace, module=None):
    """{array name: {'load': mean ways, 'store': mean ways}}, arrays named as in the source
    when ``module`` (the kernel's module) is given."""
    names = shared_names(module) if module is not None else {}
    return {names.get(k, k): v for k, v in trace.shared_summary().items()}


def passes(trace, module=None):
    """{array name: {op: (passes, ideal)}}: the mean passes (ways) per warp request and the
    fewest passes its bytes allow (distinct 4-byte words / 32, rounded up). A 128-bit access
    by 32 lanes moves 512 bytes: 4 passes even without a conflict; passes > ideal means a
    conflict."""
    names = shared_names(module) if module is not None else {}
    out = {}
    for key in trace.arrays("shared"):
        row = {}
        for op in ("load", "store"):
            reqs = list(trace.requests("shared", key, op).values())
            if reqs:
                w = np.mean([counters.bank_ways(r) for r in reqs])
                ideal = np.mean([-(-sum(len(v) for v in counters.banks_of_request(r).values())
                                   // counters.N_BANKS) for r in reqs])
                row[op] = (float(w), float(ideal))
        out[names.get(key, key)] = row
    return out


def ways_table(rows):
    """Print ``[(label, trace, module), ...]`` as one line per kernel: ways of every
    shared array's loads and stores."""
    for label, trace, module in rows:
        parts = []
        for name, ops in ways(trace, module).items():
            parts.append(f"{name} loads {ops.get('load', 0):.0f}-way, "
                         f"stores {ops.get('store', 0):.0f}-way")
        print(f"{label:<22}" + ";  ".join(parts))


def _request(trace, array, op, module, index):
    names = shared_names(module) if module is not None else {}
    key = next((k for k, v in names.items() if v == array), array)
    reqs = trace.requests("shared", key, op)
    if not reqs:
        raise ValueError(f"no shared {op}s of {array!r} in this trace; arrays: "
                         f"{[names.get(k, k) for k in trace.arrays('shared')]}")
    return sorted(reqs.items())[index][1]


def lane_bank_grid(trace, array, op="load", *, module=None, index=0):
    """A 32 x 32 array for one warp request (the ``index``-th of ``array``'s ``op``s):
    entry [lane, bank] is 1 + the rank of the word that lane touches in that bank (1 for
    the first distinct word, 2 for the second...), NaN where the lane is not in that bank.
    The largest entry is the request's ways."""
    req = _request(trace, array, op, module, index)
    grid = np.full((32, 32), np.nan)
    words_in_bank = {}
    for acc in sorted(req, key=lambda a: a.lane):
        word = acc.addr // counters.BANK_BYTES
        bank = word % counters.N_BANKS
        seen = words_in_bank.setdefault(bank, [])
        if word not in seen:
            seen.append(word)
        grid[acc.lane, bank] = seen.index(word) + 1
    return grid


def lane_bank_plot(ax, trace, array, op="load", *, module=None, index=0, title=None,
                   vmax=32):
    """Draw :func:`lane_bank_grid` on ``ax``: one mark per lane, in the column of its bank,
    coloured by which distinct word of that bank it needs (the pass it is served in, 1 to
    ``vmax``: the same scale on every panel)."""
    grid = lane_bank_grid(trace, array, op, module=module, index=index)
    w = int(np.nanmax(grid))
    im = ax.imshow(grid, cmap="viridis", vmin=1, vmax=vmax, aspect="equal",
                   interpolation="nearest")
    ax.set_xlabel("bank")
    ax.set_ylabel("lane")
    ax.set_xticks(range(0, 32, 4))
    ax.set_yticks(range(0, 32, 4))
    ax.set_title(title or f"{array} {op}: {w}-way", fontsize=10)
    return im
