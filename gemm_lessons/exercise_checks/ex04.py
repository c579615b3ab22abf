"""The checks of lesson 04 (register tiling): ``exercises/04_*.ipynb``."""
from __future__ import annotations

import threading
from collections import defaultdict

import torch

from .. import harness
from .guards import ExerciseError, HINTS, run_answer
from .audits import barrier_audit, thread_epoch
from .products import bind_numba, check_product, small_suite


def _numba_globals():
    """Bind ``cuda`` and ``float32`` as globals of this module (see
    :func:`products.bind_numba`)."""
    bind_numba(globals())


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
    from .. import counters
    with barrier_audit() as audit:
        try:
            report = check_product(run_2d, "my_2d", cases=small_suite(
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
        return str(check_product(run_2d_store, "my_2d_store", cases=small_suite(
            ("square", "ragged", "M=1", "N=1", "rectangular"))))
    except ExerciseError as e:
        raise _layout_hint(e) from None


def _reg_budget_truth(threads, blocks):
    """The most registers per thread (0..255) that let ``blocks`` blocks of ``threads``
    reside on one 9.0 SM, by :func:`gemm_lessons.occupancy.occupancy`; None if none do."""
    from ..occupancy import MAX_REGS, occupancy
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
    from ..occupancy import REG_UNIT, occupancy
    cases = [(t, b) for t in (32, 64, 96, 100, 128, 200, 256, 384, 512, 1024)
             for b in (1, 2, 3, 4, 5, 6, 8) if -(-t // 32) * b <= 64]
    for threads, blocks in cases:
        want = _reg_budget_truth(threads, blocks)
        with run_answer("reg_budget", seconds=5):
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
        with run_answer("owner", seconds=10):
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
                blk, tid, ep = thread_epoch()
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
    from .. import counters
    cases = small_suite(("square", "ragged", "K=1", "M=1"))
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
        with run_answer("my_double"):
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
