"""The checks of lesson 02 (shared-memory tiling): ``exercises/02_*.ipynb``."""
from __future__ import annotations

import math
from collections import defaultdict

import torch

from .. import engines, harness
from .guards import ExerciseError, HINTS, hidden, run_answer
from .audits import barrier_audit, nan_shared
from .refusal import no_package_calls, refuse_package_kernel
from .products import (LaunchRecorder, bind_numba, ceil_div, check_product, launch_dims,
                       launching, sim_launch, small_suite)


def _numba_globals():
    """Bind ``cuda`` and ``float32`` as globals of this module (see
    :func:`products.bind_numba`)."""
    bind_numba(globals())


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
    sim_launch(_ref_k02(), (ceil_div(N, T02), ceil_div(M, T02)), (T02, T02), a, b, c)


_ZERO_FILL = ("a missing zero fill: {stale}. Every thread that owns an element of sA or sB "
              "writes it for every k0: A[row, k0 + tx] inside A, else 0, at sA[tx, ty] (and "
              "the same for sB), or the product takes in whatever the tile held")


def _tile_shapes(audit, T, BK):
    """A sentence if the kernel's shared tiles are not sA of T x BK and sB of BK x T."""
    got = sorted(audit.shapes.values())
    if got == [(BK, T), (BK, T)]:
        return None
    return (f"my_tiled declares the shared arrays {', '.join(map(str, got)) or 'none'}: the "
            f"exercise's K-tile is BK = T // 2 = {BK} deep and A's tile is stored transposed, "
            f"so sA (k, m) and sB (k, n) are both BK x T = {BK} x {T} (the lesson's kernel, "
            "with T x T tiles, is not this exercise)")


def ex02_tile_loop(kernel, T=T02):
    """Lesson 02, exercise 1: the body of the tile loop (loads, barriers, multiply-adds) of
    a kernel whose K-tile is BK = T // 2 deep and whose A tile is stored transposed (sA[k,
    m]). Shared memory starts as NaN, so a tile element left unwritten (a missing zero fill)
    shows; the shared arrays must be the exercise's two BK x T tiles."""
    refuse_package_kernel(kernel, "my_tiled")
    BK = T // 2

    def run(a, b, c):
        M, N = c.shape
        sim_launch(kernel, (ceil_div(N, T), ceil_div(M, T)), (T, T), a, b, c)

    with barrier_audit() as probe:             # one small launch: the shared tiles first
        try:
            with run_answer("my_tiled"):
                a, b = harness.make_operands(T, T, BK)
                run(a, b, torch.empty(T, T))
        except ExerciseError:
            pass                                # the product check names what went wrong
    shapes = _tile_shapes(probe, T, BK) if probe.shapes else None
    if shapes:
        raise ExerciseError(shapes)
    err = None
    with barrier_audit() as audit:
        try:
            order = ("square", "K=1", "ragged", "M=1", "A transposed")   # the quick ones first
            cases = sorted(small_suite(order), key=lambda c: order.index(c.name))
            report = check_product(run, "my_tiled", cases=cases, audit=audit,
                                   threads_per_block=T * T)
        except ExerciseError as e:
            err = e
    if err is None:
        return str(report)
    text = str(err)
    if (audit.stale and audit.race is None and "\nLikely cause:" in text
            and HINTS["barrier"] not in text and HINTS["barrier_skipped"] not in text):
        text = (text.split("\nLikely cause:")[0] + "\nLikely cause: "
                + _ZERO_FILL.format(stale=audit.stale))
    elif (audit.race is None and not audit.stale and "\nLikely cause:" in text
          and HINTS["barrier"] not in text and HINTS["barrier_skipped"] not in text):
        why = _tile_read(run, T, BK)
        if why:
            text = text.split("\nLikely cause:")[0] + "\nLikely cause: " + why
    raise ExerciseError(text) from None


def _tile_read(run, T, BK):
    """A sentence when one launch (a single T x T block, two K-tiles) gives the product of
    a known misreading of the tiles in the multiply-adds: sA[k, tx] (the column's index),
    sA[ty % BK, k] (A's tile read as (m, k)) or both tiles' indices swapped. The tiles as the loads leave them are
    taken from A (sA[kk, m] = A[m, k0 + kk]); each candidate sums what the misread elements
    hold."""
    a, b = harness.make_operands(T, T, 2 * BK)
    c = torch.full((T, T), float("nan"))
    try:
        with run_answer("my_tiled"):
            run(a, b, c)
    except ExerciseError:
        return None
    A, B = a.double(), b.double()
    tiles = [A[:, k0:k0 + BK].t() for k0 in range(0, 2 * BK, BK)]     # sA of each K-tile
    rows = [B[k0:k0 + BK, :] for k0 in range(0, 2 * BK, BK)]          # sB of each K-tile
    ty = torch.arange(T)[:, None].expand(T, T)
    tx = torch.arange(T)[None, :].expand(T, T)
    by_col = sum(sA[:, tx].permute(1, 2, 0).mul(sB.t()[tx]).sum(-1)
                 for sA, sB in zip(tiles, rows))                     # sA[k, tx]
    by_row = sum(sum(sA[ty % BK, k] * sB[k, tx] for k in range(BK))
                 for sA, sB in zip(tiles, rows))                     # sA[ty % BK, k]
    swapped = sum(sum(sA[k, tx] * sB[k, ty] for k in range(BK))
                  for sA, sB in zip(tiles, rows))                    # sA[k, tx] * sB[k, ty]
    got = c.double()
    if torch.allclose(got, swapped, rtol=1e-4, atol=1e-4):
        return ("the tile indices swapped in the multiply-adds: A's tile read at the "
                "column's index tx and B's at the row's index ty; thread (tx, ty) computes "
                "row ty and column tx of the block's tile of C")
    if torch.allclose(got, by_col, rtol=1e-4, atol=1e-4):
        return ("the multiply-adds read A's tile at sA[k, tx]: tx is the thread's column of "
                "C, but the element of A it needs is in its own row, ty (the tile is stored "
                "(k, m): the row of C is its second index)")
    if torch.allclose(got, by_row, rtol=1e-4, atol=1e-4):
        return ("the multiply-adds read A's tile as (m, k), sA[ty % BK, k]: the tile is "
                f"stored transposed, {BK} x {T} = (k, m), so the element (m = ty, k) is at "
                "index [k, ty] (sA[ty % BK, k] is A's element in row k, column ty % BK of "
                "the K-tile)")
    return None


def ex02_launch(launcher, BM=16, BN=8):
    """Lesson 02, exercise 2: the launcher of a correct BM x BN tiled kernel on a 1-D grid
    whose tiles are numbered down the columns (threadIdx.x over the BN columns of the tile,
    threadIdx.y over its BM rows; block b computes tile b % tiles_m down, b // tiles_m
    across; the kernel is handed tiles_m): its block, its grid and its fourth argument,
    looked at before each launch, and the product on the shape suite."""
    def inspect(config, args):
        grid, block = launch_dims(config[0]), launch_dims(config[1])
        M, N = args[2].shape
        if block != (BN, BM, 1):
            why = (f"the block is transposed: threadIdx.x runs over the BN = {BN} columns of "
                   f"the tile, threadIdx.y over its BM = {BM} rows" if block[:2] == (BM, BN)
                   else f"the kernel expects blocks of BN x BM = {BN} x {BM} threads (x: "
                   "columns, y: rows)")
            raise ExerciseError(f"M={M}, N={N}: the block is {block[:2]}: {why}")
        tiles_m, tiles_n = _fewest02(BM, M), _fewest02(BN, N)
        need = tiles_m * tiles_n
        if len(args) != 4:
            raise ExerciseError(
                f"M={M}, N={N}: the kernel is launched with {len(args)} arguments: it takes "
                "A, B, C and tiles_m, the number of tiles down C (it numbers its tiles down "
                "the columns)")
        if grid[1] > 1 or grid[2] > 1:
            raise ExerciseError(
                f"M={M}, N={N}: the grid is {grid}: the kernel reads only blockIdx.x (a 1-D "
                f"grid): {need} blocks along x, one per tile, {tiles_m} tiles down times "
                f"{tiles_n} across; blocks along y would redo the same tiles")
        if grid[0] < need:
            down = args[3]
            floors = {(M // BM) * (N // BN), max(M // BM, 1) * max(N // BN, 1)}
            if down == tiles_m:             # the count down is right: the one across is not
                floors |= {tiles_m * (N // BN), tiles_m * max(N // BN, 1)}
            if grid[0] in floors:
                why = "integer division rounds down: a partial tile at the edge needs a block too"
            elif grid[0] in (tiles_m, tiles_n, tiles_m + tiles_n):
                why = (f"one block per tile: {tiles_m} tiles down times {tiles_n} across, "
                       "not the tiles along one side")
            elif grid[0] == _fewest02(BN, M) * _fewest02(BM, N):
                why = (f"TILE_M and TILE_N swapped: a tile has {BM} rows (of M) and {BN} "
                       "columns (of N)")
            else:
                why = f"{tiles_m} tiles down times {tiles_n} across, one block each"
            raise ExerciseError(f"M={M}, N={N}: {HINTS['grid']}: {grid[0]} blocks for "
                                f"{need} tiles: {why}")
        down = args[3]
        if down != tiles_m:
            swapped = (f"TILE_M and TILE_N swapped: a tile has {BM} rows (of M) and {BN} "
                       "columns (of N)")
            if down == tiles_n and tiles_n != tiles_m:
                why = (f"that is tiles_n, the tiles across: the kernel numbers its tiles down "
                       f"the columns (block b is tile b % tiles_m down, b // tiles_m across), "
                       f"so it needs the tiles down C, {tiles_m}"
                       + (f" (or {swapped})" if down == _fewest02(BN, M) else ""))
            elif down == _fewest02(BN, M):
                why = swapped
            elif down in (M // BM, max(M // BM, 1)):
                why = ("integer division rounds down: the partial tile at the bottom edge is "
                       "a tile of the column too")
            elif down == M:
                why = f"that is M, the rows: the kernel wants the tiles down C, {tiles_m}"
            else:
                why = f"the kernel wants tiles_m, the tiles down C: {tiles_m}"
            raise ExerciseError(f"M={M}, N={N}: the kernel is handed {down} as tiles_m: {why}")

    kernel = LaunchRecorder(_rect_tiled(BM, BN), inspect)

    run = launching(launcher, kernel)

    with nan_shared():
        return str(check_product(run, "my_launcher", cases=small_suite(
            ("square", "rectangular", "ragged", "M=1", "N=1"))))


def _fewest02(size, extent):
    """The fewest tiles ``size`` long that together cover ``extent`` (found by counting)."""
    return next(k for k in range(1, max(extent, 1) + 1) if k * size >= extent)


_counted02 = {}


def ex02_loads(fn):
    """Lesson 02, exercise 3: the global loads of A and those of B, each per element of C,
    counted by the learner in a trace of the launch it is given (the tiled kernel on shapes
    that are and are not multiples of the tile, and lesson 01's coalesced kernel): a
    formula cannot pass, and neither can the lesson's total of both operands."""
    from .. import counters
    from ..kernels.k01_naive import coalesced
    launches = (("the tiled kernel (T = 16), a ragged shape", _ref_launch02, 20, 36, 8),
                ("the tiled kernel (T = 16)", _ref_launch02, 16, 32, 48),
                ("lesson 01's k01_coalesced", coalesced, 16, 16, 8))
    for what, launcher, M, N, K in launches:
        with run_answer("global_loads_per_element"), no_package_calls(
                "global_loads_per_element", allowed=(harness.make_operands, counters.trace,
                                                     launcher)), hidden(_counted02):
            got = fn(launcher, M, N, K)
        key = (what, M, N, K)
        if key not in _counted02:          # the check's own count, once per process
            a, b = harness.make_operands(M, N, K)
            c = torch.empty(M, N)
            with counters.trace(A=a, B=b, C=c) as t:
                launcher(a, b, c)
            count = defaultdict(int)
            for x in t.accesses:
                count[(x.array, x.space, x.op)] += 1
            _counted02[key] = dict(count)
        count = _counted02[key]
        n_a = count.get(("A", "global", "load"), 0)
        n_b = count.get(("B", "global", "load"), 0)
        want = (n_a / (M * N), n_b / (M * N))
        pair = (isinstance(got, (tuple, list)) and len(got) == 2
                and all(isinstance(v, (int, float)) for v in got))
        if pair and all(math.isclose(g, w) for g, w in zip(got, want)):
            continue
        where = f"{what}, M={M}, N={N}, K={K}"
        if not pair:
            total = (n_a + n_b) / (M * N)
            why = ("that is the loads of both operands together, lesson 02's count: return "
                   "them apart, a pair (loads of A, loads of B)"
                   if isinstance(got, (int, float)) and math.isclose(got, total) else
                   "return a pair (loads of A, loads of B), each per element of C")
            raise ExerciseError(f"{where}: global_loads_per_element returned {got!r}: {why}")
        shared = sum(v for (arr, space, op), v in count.items()
                     if space == "shared" and op == "load")
        stores = sum(v for (arr, space, op), v in count.items() if op == "store")
        mistakes = [
            ((want[1], want[0]), "A and B swapped: the first of the pair counts the loads of A"),
            ((n_a, n_b), "the totals, not per element: divide each by M * N"),
            ((K / T02, K / T02), f"the formula K / T per operand holds for the {T02} x {T02} tiled "
             "kernel on multiples of the tile only: count the loads the launch makes "
             "(t.accesses)"),
            ((K, K), "the formula K per operand holds for lesson 01's kernel only: count the "
             "loads the launch makes (t.accesses)"),
            ((K / N, K / M), "each element of A and of B counted once (distinct addresses): "
             "count every load, an element that several blocks load once per load (that "
             "reuse is what the count shows)"),
        ]
        mistakes += [
            ((want[0] / K, want[1] / K), "divided by K too: per element of C is divided by "
             "M * N, the elements of C, only"),
            ((n_a / M, n_b / N), "divide each by M * N, the elements of C, not by M or N "
             "alone"),
            ((n_a / N, n_b / M), "divide each by M * N, the elements of C, not by M or N "
             "alone"),
        ]
        why = next((w for v, w in mistakes
                    if all(math.isclose(g, x) for g, x in zip(got, v))), None)
        if why is None and math.isclose(sum(got), (n_a + n_b + shared) / (M * N)):
            why = "shared loads counted too: count only the loads of A and of B"
        if why is None and math.isclose(sum(got), (n_a + n_b + stores) / (M * N)):
            why = "stores counted too: count only the accesses whose op is 'load'"
        raise ExerciseError(
            f"{where}: {tuple(got)!r} global loads of (A, B) per element of C, the trace "
            f"counts ({want[0]:g}, {want[1]:g}).\nLikely cause: "
            + (why or "count the accesses to array 'A' and those to array 'B' whose op is "
               "'load', each divided by M * N"))
    return ("global loads of A and of B per element of C, counted: K / T each for the tiled "
            "kernel on multiples of the tile, unequal on a ragged shape; K each for lesson 01's "
            "kernel")


_rect02 = {}


def _rect_tiled(BM, BN, BK=4):
    """A tiled kernel with a BM x BN tile of C per block of BM x BN threads: per K-tile the
    block loads the BM x BK tile of A and the BK x BN tile of B, each element once, and
    stores 0 (loads nothing) for elements outside A or B. Its fourth argument ``down``: 0
    for a 2-D grid (blockIdx.x along the columns, blockIdx.y along the rows); else the grid
    is 1-D, its tiles numbered down the columns: block b computes tile b % down down and
    b // down across."""
    key = (BM, BN, BK)
    if key not in _rect02:
        _numba_globals()

        @cuda.jit
        def rect_tiled(A, B, C, down):
            sA = cuda.shared.array((BM, BK), float32)
            sB = cuda.shared.array((BK, BN), float32)
            M, K = A.shape
            N = B.shape[1]
            tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
            tid = ty * BN + tx
            if down:
                m0, n0 = cuda.blockIdx.x % down * BM, cuda.blockIdx.x // down * BN
            else:
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
        from .. import counters
        kernel = _rect_tiled(BM, BN)
        a, b = harness.make_operands(M, N, K)
        c = torch.full((M, N), float("nan"))
        with counters.trace(A=a, B=b, C=c) as t:
            kernel[(ceil_div(N, BN), ceil_div(M, BM)), (BN, BM)](
                engines.as_numba(a), engines.as_numba(b), engines.as_numba(c), 0)
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
        with run_answer("global_loads"), no_package_calls("global_loads"), hidden(_loads02):
            got = global_loads(M, N, K, BM, BN)
        want = _measured_loads(M, N, K, BM, BN)
        if got == want:
            continue
        # each mistake read from counts, never from a formula of the answer: the same kernel
        # with its tile turned (BM and BN swapped), or run on C grown to whole tiles
        # (masked loads counted), or the operands' elements each once
        cm, cn = ceil_div(M, BM), ceil_div(N, BN)
        ragged = M % BM or N % BN
        number = isinstance(got, (int, float))
        with run_answer("global_loads"), no_package_calls("global_loads"), hidden(_loads02):
            answers = {c: global_loads(*c) for c in cases}
        mistakes = [
            (_measured_loads(M, N, K, BN, BM), "BM and BN swapped: an element of A is loaded "
             "once by each block of its block row, that is once per block column"),
            (_measured_loads(cm * BM, cn * BN, K, BM, BN), "masked loads: a tile element "
             "outside A or B is stored as 0 without a load"),
            (M * K + K * N, "each block loads its own tiles: an element of A is loaded by every "
             "block of its block row"),
        ]
        why = next((w for v, w in mistakes if number and got == v), None)
        if why is None and number and ragged and got < want and all(
                answers[c] == _measured_loads(*c) for c in cases
                if not (c[0] % c[3] or c[1] % c[4])):
            why = ("the block count is rounded up: a partial block column at the right edge "
                   "still loads its rows of A (and a partial block row its columns of B); your "
                   "count is right where the tiles divide C")
        if why is None and number and cm != cn and all(
                answers[c] == _measured_loads(*c) for c in cases
                if ceil_div(c[0], c[3]) == ceil_div(c[1], c[4])):
            why = ("A and B reused by each other's block count: an element of A is loaded "
                   "once by each block of its block row, that is once per block column, and "
                   "an element of B once per block row (your count is right only where C has "
                   "as many block rows as block columns)")
        if why is None and number and BM != BN and answers[cases[0]] == \
                _measured_loads(*cases[0]):
            why = ("right for square tiles only (the lesson's 2K / T): with BM != BN, A and B "
                   "are reused by different factors")
        why = why or ("count per block: the rows of A and the columns of B it covers, inside A "
                      "and B, times K")
        raise ExerciseError(
            f"M={M}, N={N}, K={K}, BM={BM}, BN={BN}: {got!r} global loads, the simulator counts "
            f"{want}.\nLikely cause: {why}")
    return ("global_loads: right on 5 launches (partial edge tiles, masked loads): each "
            "element of A is loaded once per block column, each element of B once per block "
            "row")
