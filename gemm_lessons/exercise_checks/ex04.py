"""The checks of lesson 04 (register tiling): ``exercises/04_*.ipynb``."""
from __future__ import annotations

import threading
from collections import defaultdict

import torch

from .. import harness
from .guards import ExerciseError, HINTS, run_answer
from .audits import barrier_audit, nan_shared, thread_epoch
from .products import bind_numba, check_product, launched_kernels, small_suite
from .refusal import no_package_calls, refuse_package_helpers, refuse_package_kernel


def _numba_globals():
    """Bind ``cuda`` and ``float32`` as globals of this module (see
    :func:`products.bind_numba`)."""
    bind_numba(globals())


_k04 = {}


def k04_store_strided(TM, TN, TROWS, TCOLS):
    """Exercise 1's other half: ``store_tile(C, acc, row0, col0)`` writes a thread's tile of
    C in the strided register tile (thread (tm, tn) owns rows tm + i * TROWS and columns
    tn + j * TCOLS of the block tile): ``acc[i, j]`` at ``(row0 + i * TROWS, col0 + j *
    TCOLS)``, inside C only."""
    key = ("store", TM, TN, TROWS, TCOLS)
    if key not in _k04:
        _numba_globals()

        @cuda.jit(device=True)
        def store_tile(C, acc, row0, col0):
            for i in range(TM):
                r = row0 + i * TROWS
                for j in range(TN):
                    c = col0 + j * TCOLS
                    if r < C.shape[0] and c < C.shape[1]:
                        C[r, c] = acc[i, j]

        _k04[key] = store_tile
    return _k04[key]


def k04_outer_step(TM, TN, TCOLS):
    """Exercise 2's other half: ``outer_step(sA, sB, rA, rB, acc, k, tm, tn)`` adds one k's
    outer product into ``acc`` in exercise 2's register tile: thread (tm, tn) owns rows
    tm * TM + i (blocked) and columns tn + j * TCOLS (strided) of the block tile."""
    key = ("outer", TM, TN, TCOLS)
    if key not in _k04:
        _numba_globals()

        @cuda.jit(device=True)
        def outer_step(sA, sB, rA, rB, acc, k, tm, tn):
            for i in range(TM):                 # the A fragment in registers, then column by
                rA[i] = sA[tm * TM + i, k]      # column: one value of B times the fragment
            for j in range(TN):
                b_kj = sB[k, tn + j * TCOLS]
                for i in range(TM):
                    acc[i, j] += rA[i] * b_kj

        _k04[key] = outer_step
    return _k04[key]


def _kernels_of(run, what, allowed):
    """Run ``run`` once on a small product and refuse the kernel it launches if it is the
    package's own, or uses a helper of the package other than ``allowed``."""
    a, b = harness.make_operands(16, 16, 4)
    with launched_kernels() as seen:
        try:
            with run_answer(what):
                run(a, b, torch.empty(16, 16))
        except ExerciseError:
            pass                            # the product check names what went wrong
    for k in {id(k): k for k in seen}.values():
        refuse_package_kernel(k, what)
        refuse_package_helpers(k, what, allowed=allowed)


_STRIDED = ("the strided layout: acc[i, j] is row tm + i * TROWS, column tn + j * TCOLS of the "
            "block tile (rA[i] from that row of sA, rB[j] from that column of sB)")
_ROWS_BLOCKED = ("this exercise's layout: acc[i, j] is row tm * TM + i (blocked), column "
                 "tn + j * TCOLS (strided) of the block tile, which starts at (m0, n0) of C")


def _layout_hint(e, layout=_STRIDED):
    text = str(e)
    if ("\nLikely cause:" in text and "never written" not in text and "inf in C" not in text
            and "barrier" not in text and "TODO" not in text):
        text = text.split("\nLikely cause:")[0] + "\nLikely cause: " + layout
    return ExerciseError(text)


def _shared_tiles(t, BM, BN, BK):
    """{thread of block (0, 0): (rows of sA it reads, columns of sB it reads)} from a trace
    of a kernel whose sA is BM x BK and sB BK x BN (declared in that order)."""
    names = sorted({x.array for x in t.accesses if x.space == "shared"},
                   key=lambda n: int(n.rsplit(":", 1)[-1]))
    if len(names) < 2:
        return {}
    sa, sb = names[0], names[1]
    out = defaultdict(lambda: (set(), set()))
    for x in t.accesses:
        if x.space != "shared" or x.op != "load" or x.block[:2] != (0, 0):
            continue
        e = x.addr // 4
        if x.array == sa:
            out[x.warp * 32 + x.lane][0].add(e // BK)
        elif x.array == sb:
            out[x.warp * 32 + x.lane][1].add(e % BN)
    return out


def _swapped_fragments(run_2d, BM, BN, TM, TN):
    """True if the kernel computes acc[i, j] += rA[j] * rB[i] (the fragments' indices
    swapped; TM == TN): C[tm + i*TROWS, tn + j*TCOLS] is then row tm + j*TROWS of A times
    column tn + i*TCOLS of B."""
    if TM != TN:
        return False
    TROWS, TCOLS = BM // TM, BN // TN
    a, b = harness.make_operands(BM, BN, 8)
    c = torch.full((BM, BN), float("nan"))
    run_2d(a, b, c)
    want = torch.empty(BM, BN, dtype=torch.float64)
    ad, bd = a.double(), b.double()
    for tm in range(TROWS):
        for tn in range(TCOLS):
            for i in range(TM):
                for j in range(TN):
                    want[tm + i * TROWS, tn + j * TCOLS] = ad[tm + j * TROWS] @ bd[:, tn + i * TCOLS]
    return bool(torch.allclose(c.double(), want, rtol=1e-4, atol=1e-4))


def _last_k_only(run):
    """Whether ``run`` leaves in C only the last k's outer product (the accumulator
    assigned, not added to), on a 32 x 32 x 32 product."""
    a, b = harness.make_operands(32, 32, 32)
    c = torch.full((32, 32), float("nan"))
    try:
        with run_answer("my_2d"):
            run(a, b, c)
    except ExerciseError:
        return False
    last = a[:, -1:].double() @ b[-1:].double()
    return bool(torch.allclose(c.double(), last, rtol=1e-4, atol=1e-4))


def ex04_outer(run_2d, BM, BN, TM, TN):
    """Lesson 04, exercise 1: fragments and their outer product, in the strided register
    tile that the given ``store_tile`` writes. The kernel may call only that helper; which
    rows of sA and columns of sB each thread reads is checked from a trace."""
    from .. import counters
    TROWS, TCOLS = BM // TM, BN // TN
    _kernels_of(run_2d, "my_2d", [k04_store_strided(TM, TN, TROWS, TCOLS)])
    with barrier_audit() as audit:
        try:
            report = check_product(run_2d, "my_2d", cases=small_suite(
                ("square", "ragged", "M=1", "K=1")), audit=audit)
        except ExerciseError as e:
            err = e
        else:
            err = None
    M = N = 16
    K = 8
    a, b = harness.make_operands(M, N, K)
    c = torch.empty(M, N)
    with counters.trace(A=a, B=b, C=c) as t, run_answer("my_2d"):
        run_2d(a, b, c)
    for th, (rows, cols) in sorted(_shared_tiles(t, BM, BN, 4).items()):
        tm, tn = th // TCOLS, th % TCOLS
        want_r = {tm + i * TROWS for i in range(TM)}
        want_c = {tn + j * TCOLS for j in range(TN)}
        if rows != want_r or cols != want_c:
            blocked = (rows == {tm * TM + i for i in range(TM)}
                       or cols == {tn * TN + j for j in range(TN)})
            raise ExerciseError(
                f"thread {th} (tm={tm}, tn={tn}) reads rows {sorted(rows)} of sA and columns "
                f"{sorted(cols)} of sB; its fragments are rows {sorted(want_r)} and columns "
                f"{sorted(want_c)}: " + (
                    "that is the blocked layout (a contiguous TM x TN tile per thread), but "
                    "store_tile writes " if blocked else "") + _STRIDED)
    if err is not None:
        if "\nLikely cause:" in str(err) and _swapped_fragments(run_2d, BM, BN, TM, TN):
            raise ExerciseError(
                str(err).split("\nLikely cause:")[0] + "\nLikely cause: the fragments' "
                "indices swapped: acc[i, j] += rA[i] * rB[j] (i, the row, indexes rA; j, the "
                "column, rB), not rA[j] * rB[i], which adds each product into the transposed "
                "place") from None
        if "\nLikely cause:" in str(err) and _last_k_only(run_2d):
            raise ExerciseError(
                str(err).split("\nLikely cause:")[0] + "\nLikely cause: C holds the last k's "
                "outer product alone: acc[i, j] += rA[i] * rB[j] adds each k's product into "
                "the accumulator (acc[i, j] = ... replaces it)") from None
        raise _layout_hint(err) from None
    loads = sum(1 for x in t.accesses if x.space == "shared" and x.op == "load")
    per_fma = loads / (M * N * K)
    if per_fma > (TM + TN) / (TM * TN) + 1e-9:
        raise ExerciseError(
            f"{per_fma:.2f} shared loads per multiply-add; a {TM} x {TN} register tile needs "
            f"only {(TM + TN) / (TM * TN):.2f}: load each fragment value once per k, not once "
            "per multiply-add")
    return f"{report}; shared loads per multiply-add: {per_fma:.2f} (lesson 02: 2)"


def ex04_store(run_2d_store, BM, BN, TM, TN):
    """Lesson 04, exercise 2: the masked store of a thread's tile, in the register tile
    that the given ``outer_step`` accumulates (rows blocked, columns strided). The kernel
    may call only that helper; which elements of C each thread stores is checked from a
    trace."""
    from .. import counters
    TCOLS = BN // TN
    _kernels_of(run_2d_store, "my_2d_store", [k04_outer_step(TM, TN, TCOLS)])
    try:
        with nan_shared():
            report = check_product(run_2d_store, "my_2d_store", cases=small_suite(
                ("square", "ragged", "M=1", "N=1", "rectangular")))
    except ExerciseError as e:
        raise _layout_hint(e, _ROWS_BLOCKED) from None
    M, N = 2 * BM, 2 * BN
    a, b = harness.make_operands(M, N, 4)
    c = torch.empty(M, N)
    with counters.trace(A=a, B=b, C=c) as t, run_answer("my_2d_store"):
        run_2d_store(a, b, c)
    for x in t.accesses:
        if x.space != "global" or x.array != "C" or x.op != "store":
            continue
        th = x.warp * 32 + x.lane
        tm, tn = th // TCOLS, th % TCOLS
        r, col = divmod((x.addr - c.data_ptr()) // 4, N)
        m0, n0 = x.block[1] * BM, x.block[0] * BN
        rows = range(m0 + tm * TM, m0 + tm * TM + TM)
        cols = [n0 + tn + j * TCOLS for j in range(TN)]
        if r not in rows or col not in cols:
            raise ExerciseError(
                f"thread {th} (tm={tm}, tn={tn}) of block {x.block[:2]} stores C[{r}, {col}], "
                f"not one of its elements (rows {rows.start}..{rows.stop - 1}, columns "
                f"{cols}): " + _ROWS_BLOCKED)
    return str(report)


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
        with run_answer("reg_budget", seconds=5), no_package_calls("reg_budget"):
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
    multiple of 4 (one float4 each), (4) lets a warp's float4 fragment loads of one k
    run without a bank conflict, and (5) orders the lanes down the columns of the warp tile
    (lane l + 1's first block 4 rows below lane l's, WM / TM lanes a column): the lesson's
    map orders them across the rows."""
    for cfg in _WARP_CONFIGS:
        BM, BN, WM, WN, TM, TN = (cfg[x] for x in ("BM", "BN", "WM", "WN", "TM", "TN"))
        NT = (BM // WM) * (BN // WN) * 32
        where = (f"BM={BM}, BN={BN}, WM={WM}, WN={WN}, TM={TM}, TN={TN} "
                 f"({NT // 32} warps, lanes {WM // TM} x {WN // TN})")
        got = {}
        with run_answer("owner", seconds=10), no_package_calls("owner"):
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
        LM = WM // TM
        for t in range(NT):
            if t % 32 % LM == LM - 1:
                continue
            (r0, c0), (r1, c1) = got[t, 0, 0], got[t + 1, 0, 0]
            if (r1, c1) != (r0 + 4, c0):
                raise ExerciseError(
                    f"{where}: lanes {t % 32} and {t % 32 + 1} of warp {t // 32} start at "
                    f"{(r0, c0)} and {(r1, c1)}: in this exercise consecutive lanes step down "
                    f"the rows, {LM} lanes down a column of the warp tile (lane l's first 4 x 4 "
                    f"block at row 4 * (l % {LM}), column 4 * (l // {LM}) of the warp tile); "
                    "lesson 04's kernel steps across the columns instead")
    return (f"owner: a one-to-one, warp-compact, float4-ready map on {len(_WARP_CONFIGS)} "
            "configurations, lanes down the columns; every fragment load conflict-free")


_k04_double = {}


def k04_double_helpers(BM, BN, BK, TM, TN):
    """(load_regs, store_regs, outer_buf, store_tile, GA, GB) for exercise 5's
    double-buffered kernel, NT = (BM/TM) x (BN/TN) threads, in a third register tile,
    neither exercise 1's nor exercise 2's: thread (tm, tn) owns rows tm + i * TROWS
    (strided) and columns tn * TN + j (blocked) of the block tile.
    ``load_regs(A, B, gA, gB, m0, n0, k0, t)`` brings thread t's share of the tiles at k0
    from global memory into registers gA (GA values) and gB (GB values), zeros outside A
    and B; ``store_regs(sA, sB, buf, gA, gB, t)`` puts them into shared buffer ``buf``
    (``sA[buf, m, k]``, ``sB[buf, k, n]``); ``outer_buf(sA, sB, buf, rA, rB, acc, k, tm,
    tn)`` adds one k's outer product from buffer ``buf``; ``store_tile(C, acc, m0, n0, tm,
    tn)`` writes the thread's tile of C, inside C only."""
    key = (BM, BN, BK, TM, TN)
    if key not in _k04_double:
        _numba_globals()
        TROWS = BM // TM
        NT = TROWS * (BN // TN)
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
                rB[j] = sB[buf, k, tn * TN + j]
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += rA[i] * rB[j]

        @cuda.jit(device=True)
        def store_tile(C, acc, m0, n0, tm, tn):
            for i in range(TM):
                r = m0 + tm + i * TROWS
                if r < C.shape[0]:
                    for j in range(TN):
                        if n0 + tn * TN + j < C.shape[1]:
                            C[r, n0 + tn * TN + j] = acc[i, j]

        _k04_double[key] = (load_regs, store_regs, outer_buf, store_tile, GA, GB)
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


def ex04_double(run, BM, BN, BK, TM, TN):
    """Lesson 04, exercise 5: two shared buffers and one barrier per tile. The product on
    ragged shapes; every buffer access audited (a buffer refilled while it may still be
    read, read before its barrier, read before it was filled); exactly one barrier per
    tile; and the next tile's global loads issued before this tile's multiply-adds."""
    from .. import counters
    _kernels_of(run, "my_double", list(k04_double_helpers(BM, BN, BK, TM, TN)[:4]))
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
