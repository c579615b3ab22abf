"""Lesson 06's demonstrations: what a cp.async pipeline computes when a rule is broken.

The pipeline's rules, shown on the smallest kernel that has them: ``column_sums`` streams
T tiles of 8 x 64 halves through two shared buffers (double buffering, as in
``k06_double_buffer``) and sums each column; thread i copies the 16-byte chunk i of every
tile and sums column i, which other threads copied, so the barrier matters.

* :func:`column_sums` - the rules kept: wait for the tile, barrier, copy the next tile into
  the buffer every warp has finished reading, then read;
* :func:`column_sums_missing_wait` - forgets ``cp_async_wait_group``: it reads a buffer
  whose copies have not landed (wrong on every engine);
* :func:`column_sums_early_copy` - issues the next copy before the barrier: a fast thread
  overwrites the buffer slower threads are still reading. A race: right when every copy
  lands at its wait (the simulator's default), wrong when copies land at random moments
  between issue and wait (``ptx.cp_async_landing("random", seed)``), as they may on a GPU.

:func:`missing_wait_demo` runs ``copy_timeline`` (one copy, read before and after its
wait) and the first two kernels, :func:`early_copy_demo` the first and the third in both
landing modes; both on the simulator, in a child process where this one runs a GPU
(:func:`gemm_lessons.common.run_on_simulator`), so they print the same everywhere.

The lesson reads its longer kernels a part at a time: :func:`show_part` prints the part of
a kernel's source (what ``gl.show_source`` prints) that starts at the first line holding
one text and ends before the next line holding another (section comments such as
``# -- epilogue``), and :func:`show_diff_part` the diff of that part between two steps
(``gl.show_diff`` restricted to it, with the line numbers of the whole sources).

The order of the tiles. A persistent grid of G blocks (one per SM) walks the tiles in
waves: block b takes tiles b, b + G, b + 2 G, ..., so at any moment the G blocks work on G
consecutive tile indices, and ``grouped_block(tile, M, N, BM, BN, GROUP_M)`` (the kernels'
own function) says which tile of the output an index is. The blocks of one wave walk K
roughly together, so a k-tile of A or B that several of them read comes from DRAM once and
from L2 after that, if the wave's working set stays in L2 for that long.

:func:`wave_panels` counts, for one wave, the distinct row panels of A (BM rows) and
column panels of B (BN columns) its tiles read; :func:`order_footprint` sums over every
wave the bytes those panels hold: what L2 has to fetch from DRAM when every panel is read
from DRAM once per wave, against what the SMs read (every tile its own panels).
``GROUP_M = 1`` is the row-major order: a wave takes whole rows of tiles, so it reads few
panels of A and every panel of B.
"""
from __future__ import annotations

import difflib
import re
import warnings
from dataclasses import dataclass

import torch
from numba import cuda, float32
from numba.types import float16

from .. import engines, ptx
from ..api import source_text
from ..common import NOMINAL_SMS, cdiv, run_on_simulator
from ..kernels.tc_common import grouped_block
from ..ptx import (WMMA_SMEM_ALIGN, cp_async16, cp_async_commit_group,
                   cp_async_wait_group, f16_to_f32)

__all__ = ["cluster_audit_demo", "copy_timeline", "column_sums", "column_sums_missing_wait",
           "column_sums_early_copy", "run_column_sums", "missing_wait_demo",
           "early_copy_demo", "dropped_store_wait_demo", "broken_turn_demo", "show_part",
           "show_diff_part", "tile_origins", "wave_panels", "OrderFootprint", "order_footprint"]

ROWS, COLS = 8, 64            # one tile: 8 rows of 64 halves, 64 chunks of 16 bytes
TILE = ROWS * COLS
BUFFERS = 2 * TILE            # two tiles in shared memory (a constant: numba needs one)
NT = 64                       # threads: thread i copies chunk i, sums column i


@cuda.jit
def copy_timeline(G, out):
    # one thread, one asynchronous copy: what does shared memory hold before the wait?
    s = cuda.shared.array(8, float16, alignment=WMMA_SMEM_ALIGN)
    if cuda.threadIdx.x == 0:
        for i in range(8):
            s[i] = -1.0                      # what the buffer held before
        cp_async16(s, 0, G, 0)               # start copying G[0:8] into s[0:8]
        cp_async_commit_group()
        out[0] = s[0]                        # read too early
        cp_async_wait_group(0)
        out[1] = s[0]                        # read after the wait


@cuda.jit
def column_sums(G, T, out):
    # out[c] = sum over the T tiles of G (row-major, T * ROWS x COLS) of column c
    s = cuda.shared.array(BUFFERS, float16, alignment=WMMA_SMEM_ALIGN)  # two buffers
    tid = cuda.threadIdx.x
    acc = float32(0.0)
    cp_async16(s, tid * 8, G, tid * 8)                 # tile 0 into buffer 0
    cp_async_commit_group()
    for t in range(T):
        cp_async_wait_group(0)                         # tile t has landed (my copies)
        cuda.syncthreads()                             # ... everyone's; the other buffer
        if t + 1 < T:                                  #     is read by no one now
            cp_async16(s, (t + 1) % 2 * TILE + tid * 8, G, (t + 1) * TILE + tid * 8)
        cp_async_commit_group()
        for r in range(ROWS):
            acc += f16_to_f32(s[t % 2 * TILE + r * COLS + tid])
    cp_async_wait_group(0)
    out[tid] = acc


@cuda.jit
def column_sums_missing_wait(G, T, out):
    # BROKEN: column_sums without cp_async_wait_group in the loop
    s = cuda.shared.array(BUFFERS, float16, alignment=WMMA_SMEM_ALIGN)
    tid = cuda.threadIdx.x
    acc = float32(0.0)
    cp_async16(s, tid * 8, G, tid * 8)
    cp_async_commit_group()
    for t in range(T):
        cuda.syncthreads()                             # orders the threads, not the copies
        if t + 1 < T:
            cp_async16(s, (t + 1) % 2 * TILE + tid * 8, G, (t + 1) * TILE + tid * 8)
        cp_async_commit_group()
        for r in range(ROWS):
            acc += f16_to_f32(s[t % 2 * TILE + r * COLS + tid])
    cp_async_wait_group(0)
    out[tid] = acc


@cuda.jit
def column_sums_early_copy(G, T, out):
    # BROKEN: column_sums with the next copy issued before the barrier
    s = cuda.shared.array(BUFFERS, float16, alignment=WMMA_SMEM_ALIGN)
    tid = cuda.threadIdx.x
    acc = float32(0.0)
    cp_async16(s, tid * 8, G, tid * 8)
    cp_async_commit_group()
    for t in range(T):
        cp_async_wait_group(0)
        if t + 1 < T:                                  # others may still read tile t - 1
            cp_async16(s, (t + 1) % 2 * TILE + tid * 8, G, (t + 1) * TILE + tid * 8)
        cp_async_commit_group()
        cuda.syncthreads()
        for r in range(ROWS):
            acc += f16_to_f32(s[t % 2 * TILE + r * COLS + tid])
    cp_async_wait_group(0)
    out[tid] = acc


def run_column_sums(name="column_sums", T=16, seed=0):
    """Run one of the three kernels on T seeded random tiles; returns (correct, the largest
    error of a column sum, relative to the largest column sum)."""
    kernel = {"column_sums": column_sums, "column_sums_missing_wait": column_sums_missing_wait,
              "column_sums_early_copy": column_sums_early_copy}[name]
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(T * ROWS, COLS, generator=gen).half()
    ref = g.double().sum(0)
    dev = engines.device()
    g_dev = g.to(dev).reshape(-1)
    out = torch.full((COLS,), float("nan"), dtype=torch.float32, device=dev)
    with warnings.catch_warnings():    # a broken kernel may add stale NaNs (simulator)
        warnings.simplefilter("ignore", RuntimeWarning)
        kernel[1, NT, engines.numba_stream()](engines.as_numba(g_dev), T,
                                              engines.as_numba(out))
    err = float((out.double().cpu() - ref).abs().max() / ref.abs().max())
    ok = bool(torch.isfinite(out).all()) and err < 1e-5
    return ok, (err if err == err else float("inf"))


def _missing_wait_here():
    with ptx.cp_async_landing("wait"):             # every copy lands at its wait
        g = torch.arange(1, 9, dtype=torch.float16)
        out = torch.zeros(2, dtype=torch.float16)
        copy_timeline[1, 32](engines.as_numba(g), engines.as_numba(out))
        sums = {name: run_column_sums(name)[0] for name in
                ("column_sums", "column_sums_missing_wait")}
    return {"before": float(out[0]), "after": float(out[1]), "correct": sums}


def missing_wait_demo():
    """What a kernel that forgets ``cp_async_wait_group`` reads, on the simulator with every
    copy landing at its wait: ``{"before": ..., "after": ..., "correct": {kernel: bool}}``."""
    return run_on_simulator("gemm_lessons.labs.k06:_missing_wait_here")


def _early_copy_here(seed):
    found = {}
    for mode in ("wait", "random"):
        with ptx.cp_async_landing(mode, seed):
            found[mode] = {name: run_column_sums(name)[0] for name in
                           ("column_sums", "column_sums_early_copy")}
    return found


def early_copy_demo(seed=0):
    """``{landing mode: {kernel: correct}}`` for ``column_sums`` and
    ``column_sums_early_copy``, on the simulator with copies landing at their wait and at
    random moments (seeded)."""
    return run_on_simulator("gemm_lessons.labs.k06:_early_copy_here", seed)


def _dropped_store_wait_here():
    from ..kernels import k06_tma_store
    from ..ptx_tma import BulkStoreRace
    a = torch.randn(64, 64, generator=torch.Generator().manual_seed(1)).half()
    b = torch.randn(64, 72, generator=torch.Generator().manual_seed(2)).half()
    found = {}
    for bug in (None, "no_store_wait"):
        out = torch.full((64, 72), float("nan"), dtype=torch.float16)
        try:
            k06_tma_store.run(a, b, None, out, bug=bug, blocks=1)
            err = float((out.double() - a.double() @ b.double()).abs().max())
            found[bug] = "correct" if err < 0.1 else "WRONG"
        except BulkStoreRace as e:           # the simulator's thread prefix dropped
            found[bug] = "BulkStoreRace: " + str(e).split(": ", 1)[-1]
    return found


def dropped_store_wait_demo():
    """``{bug: what happened}`` for ``k06_tma_store`` and its variant that drops the wait for
    the last tile's store before writing the scratch again (``bug='no_store_wait'``), on the
    simulator: one block walks two tiles of a 64 x 72 product (K = 64), so the second tile's
    epilogue writes the scratch the first tile's store reads."""
    return run_on_simulator("gemm_lessons.labs.k06:_dropped_store_wait_here")


def _broken_turn_here():
    from ..kernels import k06_pingpong
    from ..ptx_mbarrier import MbarrierDeadlock
    a = torch.randn(70, 64, generator=torch.Generator().manual_seed(1)).half()
    b = torch.randn(64, 72, generator=torch.Generator().manual_seed(2)).half()
    out = torch.full((70, 72), float("nan"), dtype=torch.float16)
    try:
        k06_pingpong.run(a, b, None, out, bug="turn_parity", blocks=1)
    except MbarrierDeadlock as err:
        return f"{type(err).__name__}: {err}"
    return "no deadlock"


def broken_turn_demo():
    """What the simulator says when ``k06_pingpong``'s first consumer waits for its first
    turn with parity 0 (``bug='turn_parity'``), on one block that walks four tiles of a
    70 x 72 product: the deadlock's message (on a GPU, from a simulator child process: the
    real kernel would hang)."""
    return run_on_simulator("gemm_lessons.labs.k06:_broken_turn_here")


def _cluster_audit_here():
    from ..kernels import k06_cluster
    from ..ptx_mbarrier import MbarrierDeadlock
    from ..ptx_tma import BulkStoreRace
    a = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)).half()
    b = torch.randn(256, 72, generator=torch.Generator().manual_seed(2)).half()
    want = a.double() @ b.double()
    found = {}
    for bug in k06_cluster.BUGS:
        out = torch.full((64, 72), float("nan"), dtype=torch.float16)
        try:
            k06_cluster.run(a, b, None, out, bug=bug, blocks=1)
            err = float((out.double() - want).abs().max())
            found[bug] = "correct" if err < 0.1 else "WRONG"
        except (MbarrierDeadlock, BulkStoreRace) as e:
            what = re.sub(r"^tid=\[[^\]]*\] ctaid=\[[^\]]*\]: ", "", str(e))  # the thread
            found[bug] = f"{type(e).__name__}: {what}"
    return found


def cluster_audit_demo():
    """``{bug: what happened}`` for ``k06_cluster`` and each of its broken variants
    (``k06_cluster.BUGS``), on the simulator (clusters of one block): one block walks the
    two 128 x 64 tiles of a 64 x 72 product with K = 256 (4 k-tiles each, through a ring of
    3 stages), so a stage is refilled, and the second tile's epilogue writes the scratch
    whose store the first issued."""
    return run_on_simulator("gemm_lessons.labs.k06:_cluster_audit_here")


def _part(obj, start, end):
    """(first line's index, lines) of the part of ``obj``'s source from the first line that
    holds ``start`` (the first line if None) to the line before the next one that holds
    ``end`` (the last line if None)."""
    lines = source_text(obj).splitlines()
    name = obj if isinstance(obj, str) else getattr(obj, "__name__", str(obj))
    i = 0
    if start is not None:
        i = next((n for n, line in enumerate(lines) if start in line), None)
        if i is None:
            raise ValueError(f"no line of {name}'s source holds {start!r}")
    j = len(lines)
    if end is not None:
        j = next((n for n in range(i + 1, len(lines)) if end in lines[n]), None)
        if j is None:
            raise ValueError(f"no line of {name}'s source after {start!r} holds {end!r}")
    return i, lines[i:j]


def show_part(obj, start=None, end=None):
    """Print the part of a kernel's source (a registered name, or any function or kernel)
    from the first line that holds the text ``start`` up to, not including, the next line
    that holds ``end``; ``None`` for the start or the end of the source."""
    print("\n".join(_part(obj, start, end)[1]))


def show_diff_part(old, new, start=None, end=None, context=3):
    """Print ``gl.show_diff(old, new)`` for one part of the two sources: the lines of each
    from ``start`` up to ``end`` (as in :func:`show_part`), diffed, with the hunks' line
    numbers those of the whole sources."""
    (i, a), (j, b) = _part(old, start, end), _part(new, start, end)
    name = lambda o: o if isinstance(o, str) else getattr(o, "__name__", str(o))

    def shift(m):                            # a hunk's first lines: in the whole sources
        return f"@@ -{int(m[1]) + i}{m[2] or ''} +{int(m[3]) + j}{m[4] or ''} @@"

    diff = [re.sub(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@", shift, line)
            for line in difflib.unified_diff(a, b, name(old), name(new), n=context,
                                             lineterm="")]
    print("\n".join(diff) if diff else f"{name(old)} and {name(new)}: the same lines here")


# ------------------------------------------------------------------ the order of the tiles
def tile_origins(M, N, BM, BN, group_m):
    """[(first row, first column)] of every tile, in the order of the tile index, as the
    persistent kernels compute it (``grouped_block``'s Python function)."""
    place = grouped_block.py_func
    return [place(t, M, N, BM, BN, group_m) for t in range(cdiv(M, BM) * cdiv(N, BN))]


def wave_panels(M, N, BM, BN, group_m, blocks=NOMINAL_SMS, wave=0):
    """(panels of A, panels of B) that wave ``wave`` of a grid of ``blocks`` reads: the
    distinct tile rows and tile columns among its tiles."""
    tiles = tile_origins(M, N, BM, BN, group_m)[wave * blocks:(wave + 1) * blocks]
    return len({r for r, _ in tiles}), len({c for _, c in tiles})


@dataclass(frozen=True)
class OrderFootprint:
    """One order's count on an M x N x K product of 16-bit operands: ``first_wave`` the
    (A panels, B panels) of the first wave; ``dram_bytes`` the bytes of the panels each wave
    reads, summed over the waves; ``smem_bytes`` the bytes the tiles' loads bring to shared
    memory (every tile reads its BM x K and K x BN panels)."""
    group_m: int
    waves: int
    first_wave: tuple
    dram_bytes: int
    smem_bytes: int

    @property
    def l2_hit_rate(self):
        """The share of the tiles' reads served by L2 under this count."""
        return 1.0 - self.dram_bytes / self.smem_bytes


def order_footprint(M, N, K, BM, BN, group_m, blocks=NOMINAL_SMS, elem_bytes=2):
    """:class:`OrderFootprint` of the walk ``GROUP_M = group_m`` on ``blocks`` blocks."""
    tiles = tile_origins(M, N, BM, BN, group_m)
    dram = 0
    for w in range(0, len(tiles), blocks):
        wave = tiles[w:w + blocks]
        rows, cols = {r for r, _ in wave}, {c for _, c in wave}
        dram += (len(rows) * BM + len(cols) * BN) * K * elem_bytes
    return OrderFootprint(group_m, cdiv(len(tiles), blocks),
                          wave_panels(M, N, BM, BN, group_m, blocks), dram,
                          len(tiles) * (BM + BN) * K * elem_bytes)
