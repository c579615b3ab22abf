"""The checks of lesson 06 (cp.async double buffering): ``exercises/06_*.ipynb``."""
from __future__ import annotations

import contextlib
import math
import re
import threading
from collections import defaultdict

import torch

from .. import engines, harness
from .._ptx_plumbing import RecordedArray, WatchedArray, shared_arrays
from .guards import ExerciseError, HINTS, run_answer
from .audits import nan_shared, pipeline_audit, thread_epoch
from .products import bind_numba, ceil_div, check_product, small_suite
from .refusal import no_package_calls, refuse_package_helpers, refuse_package_kernel


def _numba_globals():
    """Bind ``cuda`` and ``float32`` as globals of this module (see
    :func:`products.bind_numba`)."""
    bind_numba(globals())


def _landing_modes():
    """The cp.async landing modes to run the pipeline under: the default (at the wait) and,
    where ptx offers it, a few seeds of the random mode."""
    from .. import ptx
    modes = [None]
    if hasattr(ptx, "cp_async_landing"):
        modes += [("random", s) for s in (1, 2, 3)]
    return modes


class _StepLog:
    """Beside :func:`pipeline_audit`, each thread's program order: a read with no barrier
    since the thread's wait, a copy with no barrier since its last read (a refill while
    others may read), a read of the stage its newest copy is filling (the stage index: no
    wait could have landed a copy issued after it), a wait with no copy issued since the last
    one; and the most groups with copies in flight at a wait. These name the cause where the
    audit's races, seen from another thread, could name the other barrier."""

    def __init__(self, audit):
        self.audit = audit
        self.at_wait = 0
        self.problem = None
        self.threads = {}

    def _me(self):
        blk, tid, ep = thread_epoch()
        st = self.threads.setdefault((blk, tid), {"commits": 0, "waits": 0, "wait_ep": None,
                                                  "read_ep": None})
        return blk, tid, ep, st

    def _flag(self, text):
        if self.problem is None:
            self.problem = text
            self.audit.problem = text       # the cause, over a race seen from elsewhere

    def issue(self):
        _, tid, ep, st = self._me()
        if st["read_ep"] is not None and ep == st["read_ep"]:
            self._flag(f"{HINTS['barrier']} before the next issue: thread {tid} starts a copy "
                       "with no barrier since it last computed, so it refills a buffer that "
                       "other threads may still be reading (a barrier after compute)")

    def commit(self):
        self._me()[3]["commits"] += 1

    def wait(self):
        _, tid, ep, st = self._me()
        gs = self.audit._state()["groups"]
        self.at_wait = max(self.at_wait, sum(1 for g in gs if g))
        st["waits"] += 1
        st["wait_ep"] = ep
        if st["commits"] <= st["waits"]:
            self._flag(f"no copy is issued before the wait of a step (thread {tid}): here the "
                       "step starts the next tile's copy first, issue(t + 1) first (then "
                       "issue(t + STAGES - 1) first with STAGES stages), before its wait")

    def read(self, arr, idx):
        blk, tid, ep, st = self._me()
        if st["wait_ep"] is not None and ep == st["wait_ep"]:
            self._flag(f"{HINTS['barrier']} between the wait and the read: thread {tid} reads "
                       "a stage with no barrier since its wait (each thread waits only for its "
                       "own copies; cuda.syncthreads() makes everyone's visible)")
        st["wait_ep"] = None
        st["read_ep"] = ep
        stage = int(idx[0])
        sts = self.audit._state()
        newest = {id(r) for r in (sts["groups"][-1] if sts["groups"] else [])}
        newest |= {id(r) for r in sts["pending"]}
        recs = list(self.audit.chunks.get((blk, id(arr), stage), {}).values())
        if st["commits"] >= 2 and any(r["thread"] == tid and r["landed"] is None
                                      and id(r) in newest for r in recs):
            self._flag(f"the stage index: thread {tid} computes on stage {stage}, which the "
                       "copy it issued last (the next tile's) is still filling: step t "
                       "computes on tile t's stage, t % STAGES")


@contextlib.contextmanager
def _step_log(audit):
    log = _StepLog(audit)
    real = {n: getattr(audit, n) for n in ("read", "wait", "issue", "commit")}

    def read(arr, idx):
        log.read(arr, idx)
        real["read"](arr, idx)

    def wait(n):
        log.wait()
        real["wait"](n)

    def issue(dst, di):
        log.issue()
        real["issue"](dst, di)

    def commit():
        log.commit()
        real["commit"]()

    audit.read, audit.wait, audit.issue, audit.commit = read, wait, issue, commit
    try:
        yield log
    finally:
        for n, f in real.items():
            setattr(audit, n, f)


def ex06_pipeline(run, k_tiles_of_long=7):
    """Lesson 06, exercise 1: the double-buffered loop that issues the next tile first, at
    the top of the step. Correct results under every landing mode, no race found by the
    audit, copies in flight while the tensor cores compute, and two tiles in flight at the
    wait."""
    from .. import ptx
    long_k = harness.Case("long K", 24, 40, 100,
                          hint="the pipeline over 7 tiles: is every tile waited for?")
    cases = small_suite(("square", "ragged", "K=1")) + [long_k]
    report = None
    overlapped = reads = at_wait = 0

    def own_run(a, b, c):
        with no_package_calls("run", allowed=(engines.as_numba,)):
            run(a, b, c)

    for mode in _landing_modes():
        ctx = (ptx.cp_async_landing(mode[0], seed=mode[1]) if mode else contextlib.nullcontext())
        with ctx, nan_shared(), pipeline_audit() as audit, _step_log(audit) as log:
            report = check_product(own_run, "my_pipeline", (torch.float16,), cases,
                                   audit=audit)
        overlapped += audit.reads_overlapped
        reads += audit.reads
        at_wait = max(at_wait, log.at_wait)
        if reads and (overlapped == 0 or at_wait < 2):
            break                       # the order is wrong in every mode: say so now
    if not reads:
        raise ExerciseError("no tensor-core read of a stage was seen: run launches my_pipeline, "
                            "whose compute(s) reads the stages")
    if reads and overlapped == 0:
        raise ExerciseError(
            f"{HINTS['overlap']}: every tensor-core read happened with no copy of this thread "
            "pending. The loop is serial: the copy of tile t + 1 must still be in flight while "
            "compute(t) runs (a wait that leaves no group pending lands it too)")
    if reads and at_wait < 2:
        raise ExerciseError(
            "the copy of tile t + 1 is issued after the wait for tile t: here it starts first, "
            "at the top of the step (issue(t + 1) first), so that two tiles are in flight at "
            f"the wait (at most {at_wait} here) and the wait lands only tile t")
    return f"{report}; the next tile issued first, in flight during compute, no race found"


def _stage_tiles(BM, BN, BK, pad):
    """(rows, padded row length) of the two fp16 tiles of one stage: A's, then B's."""
    return ((BM, BK + pad), (BK, BN + pad))


def _budget(BM, BN, BK, stages, pad):
    return sum(rows * length * 2 for rows, length in _stage_tiles(BM, BN, BK, pad)) * stages


def _budget_cause(pipeline_smem, BM, BN, BK):
    """What a wrong pipeline_smem gets wrong, from how it answers a few probes (the formula
    itself is not given away)."""
    def f(stages, pad):
        with run_answer("pipeline_smem", seconds=10), no_package_calls("pipeline_smem"):
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
                want = _budget(BM, BN, BK, stages, pad)
                with run_answer("pipeline_smem", seconds=10), \
                        no_package_calls("pipeline_smem"):
                    got = pipeline_smem(BM, BN, BK, stages, pad=pad)
                if got != want:
                    raise ExerciseError(f"pipeline_smem({BM}, {BN}, {BK}, {stages}, pad={pad}) = "
                                        f"{got!r}, expected {want}: "
                                        + _budget_cause(pipeline_smem, BM, BN, BK))
    for BM, BN, BK, limit, pad in ((128, 256, 32, 227 * 1024, 8), (128, 128, 32, 48 * 1024, 8),
                                   (64, 64, 64, 100 * 1024, 8), (256, 128, 64, 227 * 1024, 8),
                                   (128, 256, 32, 227 * 1024, 0), (64, 64, 64, 100 * 1024, 0)):
        want = limit // _budget(BM, BN, BK, 1, pad)
        with run_answer("max_stages", seconds=10), no_package_calls("max_stages"):
            got = max_stages(BM, BN, BK, limit=limit, pad=pad)
        if got != want:
            why = "the largest number of stages whose pipeline_smem is at most the limit"
            if pad != 8 and got == limit // _budget(BM, BN, BK, 1, 8):
                why = (f"that is the answer for pad=8, the default: max_stages must pass its "
                       f"own pad (here {pad}) on to pipeline_smem")
            elif isinstance(got, int) and got == want + 1:
                why = (f"{got} stages take {_budget(BM, BN, BK, got, pad)} bytes, more than the "
                       f"limit: one stage too many ({why}; a loop that stops one step late?)")
            elif isinstance(got, int) and got == want - 1:
                why = (f"{want} stages take {_budget(BM, BN, BK, want, pad)} bytes, which fit: "
                       f"one stage too few ({why}: < where <= is meant?)")
            raise ExerciseError(f"max_stages({BM}, {BN}, {BK}, limit={limit}, pad={pad}) = "
                                f"{got!r}, expected {want}: {why}")
    return "pipeline_smem and max_stages: right on 24 configurations"


# Exercise 3: the N-stage pipeline. The check launches the learner's kernel itself (tiles
# of 32 x 32 x 16, one warp per block, operands zero-padded to whole tiles).
_MS_TILE = (32, 32, 16)


def _ms_launch(kernel, a, b, c):
    BM, BN, BK = _MS_TILE
    M, K = a.shape
    N = b.shape[1]
    Mp, Np, Kp = ceil_div(M, BM) * BM, ceil_div(N, BN) * BN, ceil_div(K, BK) * BK
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
        blk, tid, _ = thread_epoch()
        side, tile = self.tile_of(dst, si)
        with self.lock:
            self.copies[blk][(side, tuple(int(i) for i in si))] += 1
            self.held[(blk, tid, int(di[0]))] = tile

    def read(self, idx):
        blk, tid, _ = thread_epoch()
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
    from .. import ptx
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
    from .. import ptx
    BM, BN, BK = _MS_TILE
    long_k = harness.Case("long K", 24, 40, 100,
                          hint="the pipeline over 7 tiles: is every tile waited for?")
    cases = small_suite(("ragged", "K=1")) + [long_k]
    chunks = BM * BK // 8 + BK * BN // 8          # 16-byte chunks of A and B in one K-tile
    for stages, seeds in ((3, (None, 1)), (4, (2, 3))):
        with run_answer(f"make_multistage({stages})", seconds=20):
            kernel = make_multistage(stages)
        refuse_package_kernel(kernel, f"make_multistage({stages})")
        depth = at_wait = 0
        for seed in seeds:
            for case in cases:
                ctx = (ptx.cp_async_landing("random", seed=seed) if seed is not None
                       and hasattr(ptx, "cp_async_landing") else contextlib.nullcontext())
                with ctx, nan_shared(), pipeline_audit() as audit, \
                        _tile_log(audit, BM, BK) as log, _step_log(audit) as steps:
                    try:
                        check_product(lambda a, b, c: _ms_launch(kernel, a, b, c),
                                      f"make_multistage({stages})", (torch.float16,), [case],
                                      audit=audit)
                        err = None
                    except ExerciseError as e:
                        err = e
                mine = log.problem(ceil_div(case.K, BK), chunks)
                if mine:
                    raise ExerciseError(f"make_multistage({stages}), {case}: {mine}")
                if err is not None:
                    raise err
                if case is long_k:
                    depth = max(depth, log.depth)
                    at_wait = max(at_wait, steps.at_wait)
                    if depth != stages - 1 or at_wait < stages:
                        break                   # the depth is wrong whatever the seed
            if depth != stages - 1 or at_wait < stages:
                break
        if depth != stages - 1:
            raise ExerciseError(
                f"make_multistage({stages}) is right, but {HINTS['wait'].split(':')[0]} or the "
                f"issue: at most {depth} tile{'s' if depth != 1 else ''} in flight while the "
                "tensor cores compute, where "
                f"{stages} stages keep {stages - 1} in flight (the wait should leave every tile "
                "after t in flight, and the next tile is issued before compute)")
        if at_wait < stages:
            raise ExerciseError(
                f"make_multistage({stages}): the copy of tile t + STAGES - 1 is issued after the "
                f"wait for tile t: here it starts first, at the top of the step (issue(t + "
                f"STAGES - 1) first), so that {stages} tiles are in flight at the wait (at most "
                f"{at_wait} here) and the wait lands only tile t")
    return (f"make_multistage: correct with 3 and 4 stages on {len(cases)} shapes (float16); "
            "each tile copied once and read from its stage, STAGES - 1 tiles in flight, no race "
            "found")


# Exercise 4: the 128-byte swizzle. The check computes no layout: it measures one. The
# emulated TMA (ptx_tma.tma_load_2d, whose map names the 128-byte swizzle) copies a tile
# whose elements hold their own index into shared memory, one 64-column box after the other,
# and the check reads where each element landed; the same copy with the map's swizzle set to
# none gives the layout of an answer that leaves the swizzle out. The mistakes are named
# from these two measured layouts.
def _tma_landing(rows, cols, swizzle=True):
    """Measured: the byte offset (a rows x cols numpy array) at which the emulated TMA copy
    of a rows x cols fp16 tile, in 64-column boxes of ``rows`` rows stored one after the
    other, leaves each element, with the map's 128-byte swizzle (``swizzle``) or none."""
    import numpy as np
    from numba import int64
    from numba.types import float16

    from .. import ptx_mbarrier as mbar
    from .. import ptx_tma as tmacopy
    _numba_globals()
    n, boxes = rows * cols, cols // 64
    tile = torch.arange(n, dtype=torch.int16).reshape(rows, cols).view(torch.float16)
    tmap = tmacopy.tensor_map_2d(tile, rows)
    if not swizzle:         # the emulated map's 9th word is its swizzle (bytes; 0: none)
        if int(tmap.array[8]) != tmacopy.SWIZZLE_BYTES:
            raise RuntimeError("ptx_tma's emulated tensor map changed: its 9th word is no "
                               "longer the swizzle")
        tmap.array[8] = 0

    def land(tm):
        smem = cuda.shared.array(n, float16)
        bar = cuda.shared.array(1, int64)
        mbar.mbarrier_init(bar, 0, 1)
        mbar.mbarrier_arrive_expect_tx(bar, 0, n * 2)
        for j in range(boxes):
            tmacopy.tma_load_2d(smem, j * rows * 64, tm, j * 64, 0, bar, 0)
        mbar.mbarrier_wait(bar, 0, 0)

    made = {}

    def shared_array(shape, dtype, frame):
        return made.setdefault(dtype.kind, np.zeros(shape, dtype))

    with shared_arrays(shared_array):
        cuda.jit(land)[1, 1](engines.as_numba(tmap.array))
    index = made["f"].view(np.int16).astype(np.int64)
    if sorted(index.tolist()) != list(range(n)):
        raise RuntimeError("the emulated TMA copy did not land every element once")
    place = np.empty(n, np.int64)
    place[index] = 2 * np.arange(n)
    return place.reshape(rows, cols)


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
    with run_answer("swizzled_byte", seconds=20), no_package_calls("swizzled_byte"):
        got = {s: swizzled_byte(*s) for s in samples}
    for s, off in got.items():
        if not isinstance(off, int) and not (hasattr(off, "__index__")):
            raise ExerciseError(f"swizzled_byte{s} = {off!r}: a byte offset is an integer "
                                "(use // and %, not /)")
    widest = {}
    for rows, cols in shapes:
        widest[rows] = max(widest.get(rows, 0), cols)
    # where the copy engine puts each element, with the swizzle and without
    tma = {rows: _tma_landing(rows, cols) for rows, cols in widest.items()}
    plain = {rows: _tma_landing(rows, cols, swizzle=False) for rows, cols in widest.items()}

    def want(s):
        return int(tma[s[2]][s[0], s[1]])

    bad = [(s, got[s], want(s)) for s in samples if got[s] != want(s)]
    if not bad:
        return (f"swizzled_byte: right on {len(samples)} elements of {len(shapes)} tiles; "
                "8 rows of a chunk column in 8 different groups of 4 banks")
    (row, col, rows), off, _ = bad[0]
    where = (f"swizzled_byte({row}, {col}, rows={rows}) = {off}, but the TMA copy with the "
             f"128-byte swizzle puts that element at byte {want(bad[0][0])}")

    def fits(layout):
        return all(got[s] == layout(*s) for s in samples)

    def chunk_column(r0, c, rows):
        places = Counter(got[(r, c, rows)] % 128 // 16 for r in range(r0, r0 + 8))
        return (f"the 8 rows {r0}..{r0 + 7} of column chunk {c // 8} sit in {len(places)} "
                f"chunk position(s) of their rows: {max(places.values())} of them share the "
                f"same 4 banks (a bank conflict of {max(places.values())} ways when the "
                "tensor cores read them); chunk c of row r goes to chunk c XOR (r % 8)")

    # the answer is one of the measured layouts, or one of them halved
    if fits(lambda r, c, rs: int(plain[rs][r, c])):
        raise ExerciseError(f"{where}: no swizzle: every element is where the same copy "
                            f"without the swizzle puts it; {chunk_column(0, 0, 8)}")
    for name, lay in (("with the swizzle", tma), ("without the swizzle", plain)):
        if fits(lambda r, c, rs: int(lay[rs][r, c]) // 2):
            raise ExerciseError(f"{where}: every offset is half the byte at which the copy "
                                f"{name} puts the element: the answer counts elements; an "
                                "offset here is in bytes, 2 bytes an element (fp16)")
    if fits(lambda r, c, rs: int(tma[rs][r, c % 64])):
        raise ExerciseError(f"{where}: every column c is where the copy puts column c % 64: "
                            "the answer stores every 64-column block over the first one (the "
                            "64-column blocks lie one after the other, each rows x 128 bytes)")
    # else the first measured property of the layout that the answer breaks
    for (r, c, rs), o in got.items():        # two neighbours in one 16-byte chunk of the copy
        if (r, c + 1, rs) not in got:
            continue
        a, b = int(tma[rs][r, c]), int(tma[rs][r, c + 1])
        if b - a == 2 and a // 16 == b // 16 and got[(r, c + 1, rs)] - o != 2:
            raise ExerciseError(f"{where}: elements {c} and {c + 1} of row {r} are "
                                f"{got[(r, c + 1, rs)] - o} bytes apart, and 2 bytes in the "
                                "copy: 2 bytes an element (fp16), and the byte inside a "
                                "16-byte chunk, (col % 8) * 2, is not swizzled")
    for (r, c, rs), o in got.items():
        if o % 16 != tma[rs][r, c] % 16:
            raise ExerciseError(f"{where}: element ({r}, {c}) is at byte {o % 16} of its "
                                f"16-byte chunk, and at byte {tma[rs][r, c] % 16} in the copy: "
                                "the swizzle moves whole 16-byte chunks (chunk c XOR (r % 8), "
                                "the chunk's index, not its byte offset, XORed); the byte "
                                "inside the chunk, 2 bytes an element (fp16), stays")
    for (r, c, rs), o in got.items():
        block = int(tma[rs][r, c]) // (rs * 128)
        if r < 8 and o // (rs * 128) != block:     # the first atom: no row % 8 question
            raise ExerciseError(f"{where}: column {c} lies in 64-column block {block}, which "
                                f"the copy puts at bytes {block * rs * 128}.."
                                f"{(block + 1) * rs * 128 - 1}; the answer puts it at {o} "
                                "(the 64-column blocks lie one after the other, each rows x "
                                "128 bytes)")
    moved = [(r, c, rs, o % (rs * 128) // 128, int(tma[rs][r, c]) % (rs * 128) // 128)
             for (r, c, rs), o in got.items()
             if o % (rs * 128) // 128 != tma[rs][r, c] % (rs * 128) // 128]
    for r, c, rs, line, want_line in sorted(moved, key=lambda m: m[0] >= 8):
        if r < 8:                   # in the first atom, row % 8 is the row itself
            raise ExerciseError(f"{where}: element ({r}, {c}) lands in row {line} of its "
                                f"block, and in row {want_line} in the copy: the swizzle "
                                "moves 16-byte chunks inside their 128-byte row, never to "
                                "another row (chunk c of row r goes to chunk c XOR (r % 8) "
                                "of row r)")
        raise ExerciseError(f"{where}: element ({r}, {c}) lands in row {line} of its block, "
                            f"and in row {want_line} in the copy: the XOR uses the row inside "
                            "the 8-row atom (row % 8), so that a chunk never leaves its "
                            "128-byte row")
    for rows, cols in shapes[:3]:
        for c in range(0, cols, 8):
            for r0 in range(0, rows, 8):
                if len({got[(r, c, rows)] % 128 // 16 for r in range(r0, r0 + 8)}) < 8:
                    raise ExerciseError(f"{where}: no swizzle: {chunk_column(r0, c, rows)}")
    raise ExerciseError(f"{where}: conflict-free, but not the hardware's swizzle: chunk c of "
                        "row r is stored at chunk c XOR (r % 8) (an XOR, not a rotation)")


# Exercise 5: reading a wgmma matrix descriptor: its fields in bytes, and the B tile (laid
# out as in exercise 4) that it describes. The check builds the descriptors from known
# fields, with the bits this exercise does not read set at random.
_SWIZZLE_MODE = {128: 1, 64: 2, 32: 3, 0: 0}        # bits 62-63


def _describe(start, lbo, sbo, swizzle, junk):
    return ((start >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32)
            | (_SWIZZLE_MODE[swizzle] << 62) | junk)


def ex06_descriptor(read_descriptor, b_rows):
    """Lesson 06, exercise 5: the fields of the 64-bit matrix descriptor wgmma reads its
    operands through, in bytes, and the k-rows of the B tile a descriptor describes."""
    import random
    rng = random.Random(65)
    free = (0x3 << 14) | (0x3 << 30) | (((1 << 16) - 1) << 46)   # bits no field here reads
    cases = [(0, 16, 1024, 128, 0), (1024, 8192, 1024, 128, 0), (2080, 16, 1024, 64, 0)]
    cases += [(16 * rng.randrange(1 << 14), 16 * rng.randrange(1, 1 << 14),
               16 * rng.randrange(1, 1 << 14), rng.choice((128, 64, 32, 0)),
               rng.getrandbits(64) & free) for _ in range(200)]
    names = ("the start address (bits 0-13)", "the leading byte offset, LBO (bits 16-29)",
             "the stride byte offset, SBO (bits 32-45)", "the swizzle (bits 62-63)")
    for start, lbo, sbo, swizzle, junk in cases:
        d = _describe(start, lbo, sbo, swizzle, junk)
        with run_answer("read_descriptor", seconds=10), no_package_calls("read_descriptor"):
            got = read_descriptor(d)
        want = (start, lbo, sbo, swizzle)
        if not isinstance(got, (tuple, list)) or len(got) != 4:
            raise ExerciseError(f"read_descriptor({d:#x}) = {got!r}: return the four fields, "
                                "(start, lbo, sbo, swizzle)")
        if tuple(got) == want:
            continue
        where = f"read_descriptor({d:#x}) = {tuple(got)}, expected {want}"
        for i, (name, g, w) in enumerate(zip(names, got, want)):
            if g == w:
                continue
            if i == 3:
                why = ("bits 62-63 hold the mode: 1 is the 128-byte swizzle, 2 the 64-byte, "
                       "3 the 32-byte, 0 none; return the swizzle's width in bytes")
            elif g == w >> 4:
                why = "the field counts 16-byte units: shift the value left by 4 for bytes"
            elif g != w and (g >> 4) & 0x3FFF == (w >> 4) and g > w:
                why = ("a field is 14 bits wide (mask 0x3FFF): the bits above it belong to "
                       "something else")
            elif {g, w} == {lbo, sbo} and i in (1, 2):
                why = "LBO and SBO swapped: LBO is bits 16-29, SBO bits 32-45"
            else:
                why = "shift the descriptor right to the field's first bit, then mask 14 bits"
            raise ExerciseError(f"{where}: {name}: {g}, expected {w}: {why}")
    for rows in (8, 16, 64, 128, 256):
        d = _describe(1024 * rng.randrange(1, 100), rows * 128, 1024, 128,
                      rng.getrandbits(64) & free)
        with run_answer("b_rows", seconds=10), no_package_calls("b_rows"):
            got = b_rows(d)
        if got != rows:
            raise ExerciseError(
                f"b_rows({d:#x}) = {got!r}, expected {rows}: in exercise 4's layout a "
                "64-column block holds every k-row of the tile, 128 bytes each, and LBO is the "
                "step from one block to the next: rows = LBO / 128 (SBO is one 8-row atom, "
                "1024 bytes, whatever the tile)")
    return (f"read_descriptor: every field right on {len(cases)} descriptors, with the other "
            "bits set; b_rows: the k-rows of 8- to 256-row B tiles")


# Exercises 6 and 7: a ring of stages handed over mbarriers (y = A @ x). One block of 96
# threads per 64 rows of A: thread 0 (warp 0) fills the ring with TMA, warps 1 and 2 (one
# row of the box per thread) consume it. Stage s holds a 64 x 64 box of A (128-byte swizzle)
# in sA and 64 elements of x in sx; full[s] has 1 arrival + the stage's bytes, empty[s] one
# arrival per consumer thread. Each exercise writes one side and is given the other, so that
# neither shows the other's answer: exercise 6 gets k06_fill_ring, a producer warp without
# TMA (plain copies, 32 arrivals on full[s]), exercise 7 k06_drain_ring, consumers that
# count rounds from kt where exercise 6 keeps a (stage, phase) state.
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
        from .. import ptx_mbarrier as mbar
        from ..ptx_hopper import swizzle128
        BOX = ROWS * 64

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
        def fill_ring(sA, sx, full, empty, A, x, row0, k_tiles, lane):
            # a producer warp without TMA: its 32 lanes copy each stage with plain loads and
            # stores, into the same swizzled places, zeros past the edges, then arrive on
            # full[s] (initialized for 32 arrivals)
            M, K = A.shape[0], A.shape[1]
            for kt in range(k_tiles):
                s = kt % STAGES
                mbar.mbarrier_wait(empty, s, ((kt // STAGES) & 1) ^ 1)
                for e in range(lane, BOX, 32):
                    r, c = e // 64, e % 64
                    v = float32(0.0)
                    if row0 + r < M and kt * 64 + c < K:
                        v = A[row0 + r, kt * 64 + c]
                    sA[swizzle128((s * ROWS + r) * 128 + 2 * c) // 2] = v
                for c in range(lane, 64, 32):
                    v = float32(0.0)
                    if kt * 64 + c < K:
                        v = x[kt * 64 + c]
                    sx[swizzle128(s * 128 + 2 * c) // 2] = v
                mbar.mbarrier_arrive(full, s)

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
    """Exercise 6's producer, a device function ``fill_ring(sA, sx, full, empty, A, x, row0,
    k_tiles, lane)`` run by each lane of warp 0, without TMA: for each k-tile kt the lanes
    wait until the consumers have released stage kt % STAGES, copy A's ROWS x 64 box at
    (row0, kt * 64) and x's 64 elements at kt * 64 into the stage with plain loads and
    stores (in the 128-byte swizzle that :func:`k06_add_row` reads, zeros past the edges),
    and each arrives on ``full`` (32 arrivals complete the phase)."""
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
        if store:                       # the audit follows reads (a producer warp's stores
            return                      # into a stage are its copies)
        try:
            i = int(idx[0] if isinstance(idx, tuple) else idx)
        except (TypeError, ValueError):
            return
        blk, tid, _ = thread_epoch()
        stage = i // arr._stage_len
        entry = (int(blk[0]), len(self.events), stage, self.tile.get((id(arr), stage)))
        log = self.reads[tid]
        if not log or log[-1] != entry:
            log.append(entry)

    def copy(self, dst, di, col, row, bi):
        blk, tid, _ = thread_epoch()
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

    from .. import ptx_mbarrier as mbar
    from .. import ptx_tma as tmacopy
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

        from .. import sim_scheduler
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


def _ring_launch(kernel, a, x, maps=True):
    """y = A @ x with exercise 7's kernel (``maps``: tensor maps of A, boxes 64 x 64, and of
    x as a 1 x K row, boxes 1 x 64, their rows padded to 16-byte multiples) or exercise 6's
    (A and x themselves); y NaN-poisoned."""
    from .. import ptx_tma as tmacopy
    M, K = a.shape
    if not maps:
        y = torch.full((M,), float("nan"), dtype=torch.float32)
        kernel[ceil_div(M, _RING_ROWS), _RING_THREADS](engines.as_numba(a.contiguous()),
                                                       engines.as_numba(x.contiguous()),
                                                       engines.as_numba(y), M, K)
        return y
    K8 = ceil_div(K, 8) * 8
    ap = torch.zeros(M, K8, dtype=torch.float16)
    ap[:, :K] = a
    xp = torch.zeros(1, K8, dtype=torch.float16)
    xp[0, :K] = x
    tA = tmacopy.tensor_map_2d(ap[:, :K], _RING_ROWS)
    tx = tmacopy.tensor_map_2d(xp[:, :K], 1)
    y = torch.full((M,), float("nan"), dtype=torch.float32)
    kernel[ceil_div(M, _RING_ROWS), _RING_THREADS](engines.as_numba(tA.array),
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
                                f"full[{s}] and find k-tile {tile} in stage {s}: k-tile kt "
                                "goes into stage kt % STAGES and completes on that stage's "
                                "full barrier: the producer's state steps one stage per "
                                "k-tile, from stage 0, back to 0 after stage STAGES - 1")
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
        if stage != n % _RING_STAGES:
            return (f"the stage index: block {blk[0]}'s copy of {side} for k-tile {n} goes into "
                    f"stage {stage}; k-tile kt goes into stage kt % STAGES = "
                    f"{n % _RING_STAGES}: the producer's state starts at stage 0 and steps one "
                    "stage per k-tile, back to 0 after stage STAGES - 1")
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
                                f"{r - 1}, phase {r - 1}: in round r the wait on empty[s] "
                                "passes the parity of phase r - 1, so the producer's phase "
                                "starts at 1 (the phase before the first, complete at once: "
                                "round 0 does not block) and flips each time its stage wraps "
                                "to 0")
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
    from ..ptx_mbarrier import MbarrierTxError
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
                f"the last one was still unread. In round r the wait passes the parity of "
                f"phase r - 1: the producer's phase starts at 1, so that round 0 does not "
                f"block, and flips each time its stage wraps to 0 (once a round, not every "
                f"k-tile). The simulator's report: {text}")
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
                f"wait for a tile it has not copied). In round r the producer needs the "
                f"consumers' release of round r - 1, and in round 0 the ring is empty: that "
                f"wait must pass at once (the phase before the first: the producer's phase "
                f"starts at 1, and flips each time its stage wraps to 0). The simulator's "
                f"report:\n{text}")
    return ("the ring stops (a deadlock): the consumers wait for a tile the producer never "
            "announced and copied (one mbarrier_arrive_expect_tx and the copies on full[s] "
            f"per k-tile). The simulator's report:\n{text}")


def _ring_check(kernel, what, learner):
    """Run exercise 6's or 7's kernel on the cases (copies landing late, and at random
    moments on the longest case) under the ring audit; the result checked against float64."""
    from .. import ptx
    from ..ptx_mbarrier import MbarrierDeadlock, MbarrierTxError
    gen = torch.Generator().manual_seed(67)
    # copies landing at random moments: TMA's (exercise 7); exercise 6's producer warp
    # copies with plain stores, done before it arrives
    seeds = (1, 2) if learner == "producer" else ()
    runs = [(c, None) for c in _RING_CASES] + [(_RING_CASES[0], seed) for seed in seeds]
    for (name, M, K), seed in runs:
        a = torch.randn(M, K, generator=gen).half()
        x = torch.randn(K, generator=gen).half()
        k_tiles, blocks = ceil_div(K, 64), ceil_div(M, _RING_ROWS)
        where = f"{what}, {name}" + (f", copies landing at random (seed {seed})"
                                     if seed is not None else "")
        ctx = (ptx.cp_async_landing("random", seed=seed) if seed is not None
               else contextlib.nullcontext())
        err, y = None, None
        with ctx, _ring_audit() as audit, run_answer(what, seconds=60):
            try:
                y = _ring_launch(kernel, a, x, maps=learner == "producer")
            except (MbarrierDeadlock, MbarrierTxError) as e:
                err = e
            except IndexError as e:
                if learner == "producer" and "tma_load_2d" in str(e):
                    raise ExerciseError(f"{where}: {e}: the stage index: stage s of the ring "
                                        "starts at element s * ROWS * 64 of sA and s * 64 of "
                                        "sx, s being the state's stage (0 to STAGES - 1)") from None
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


def _refuse_divided_index(kernel, what, side):
    """Exercises 6 and 7 keep a (stage, phase) state: :class:`ExerciseError` if the kernel's
    source divides its loop's k-tile index (``kt % STAGES``, ``kt // STAGES``: the lessons'
    form, and the helpers')."""
    import ast
    import inspect
    import textwrap
    fn = kernel
    for attr in ("py_func", "__wrapped__"):
        while hasattr(fn, attr) and getattr(fn, attr) is not fn:
            fn = getattr(fn, attr)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return

    def waits(loop):                    # a loop of the ring: it waits on an mbarrier
        return any(isinstance(c, ast.Call) and "mbarrier_wait" in ast.unparse(c.func)
                   for c in ast.walk(loop))

    loops = {n.target.id for n in ast.walk(tree)
             if isinstance(n, ast.For) and isinstance(n.target, ast.Name) and waits(n)}
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if names & loops:
                raise ExerciseError(
                    f"{what} divides the k-tile index (`{ast.unparse(node)}`): this exercise's "
                    f"{side} keeps a state instead, the stage s it uses next and the phase "
                    "its wait passes there, both stepped after each k-tile (as CUTLASS's "
                    "pipelines do), with no division")


def ex06_ring_consumer(kernel):
    """Lesson 06, exercise 6: the consumers' loop of a ring (wait on full, read, release on
    empty) with a (stage, phase) state, with fill_ring, a producer warp without TMA."""
    helpers = _k06_ring_helpers(_RING_ROWS, _RING_STAGES)
    refuse_package_kernel(kernel, "consumer_gemv")
    refuse_package_helpers(kernel, "consumer_gemv", allowed=(helpers[0], helpers[2]))
    _refuse_divided_index(kernel, "consumer_gemv", "consumer")
    _ring_check(kernel, "consumer loop", "consumer")
    return (f"consumer loop: y = A @ x right on {len(_RING_CASES)} shapes; every read of a "
            "stage between its full phase and its release, in stage order")


def ex06_ring_producer(kernel):
    """Lesson 06, exercise 7: the producer's loop of a ring (wait on empty, expect_tx, the
    copies) with a (stage, phase) state, with drain_ring as the consumers."""
    helpers = _k06_ring_helpers(_RING_ROWS, _RING_STAGES)
    refuse_package_kernel(kernel, "producer_gemv")
    refuse_package_helpers(kernel, "producer_gemv", allowed=(helpers[1],))
    _refuse_divided_index(kernel, "producer_gemv", "producer")
    n = _ring_check(kernel, "producer loop", "producer")
    return (f"producer loop: y = A @ x right on {len(_RING_CASES)} shapes, {n} runs (copies "
            "landing late and at random); every stage refilled after its release, its bytes "
            "announced exactly")
