"""The checks of lesson 07 (Triton tile order): ``exercises/07_*.ipynb``."""
from __future__ import annotations

import torch

from .. import harness
from .guards import ExerciseError, HINTS, run_answer
from .products import ceil_div, check_product, small_suite
from .refusal import no_package_calls, refuse_package_helpers, refuse_package_kernel


def _grouped(pid, num_pid_m, num_pid_n, g):
    from ..common import grouped_order
    return grouped_order(pid, num_pid_m, num_pid_n, g)


def _runs07(lesson, g):
    """Lesson 07's order cut into runs: the ranges of consecutive programs that walk one
    column of one group of rows (the snake keeps them, and only turns some around)."""
    runs, start = [], 0
    for p in range(1, len(lesson) + 1):
        if (p == len(lesson) or lesson[p][1] != lesson[start][1]
                or lesson[p][0] // g != lesson[start][0] // g):
            runs.append(range(start, p))
            start = p
    return runs


def _walks07(tiles, lesson, g):
    """How ``tiles`` walks each run of lesson 07's order: [(run, column, the group's rows
    as a set, the learner's columns as a set, the learner's rows in program order)]."""
    return [(run, lesson[run[0]][1], {lesson[p][0] for p in run}, {tiles[p][1] for p in run},
             [tiles[p][0] for p in run]) for run in _runs07(lesson, g)]


def _steps07(rows):
    return {b - a for a, b in zip(rows, rows[1:])}


def _snake_fault(tiles, lesson, g):
    """None if ``tiles`` (the learner's tile of every program) is the snake order, read by
    its properties against lesson 07's order ``lesson``: each run of the lesson's order
    (a column of a group) keeps its column and covers its group's rows, one row a program,
    down in even columns (+1), up in odd ones (-1). Else (program, sentence)."""
    for run, col, group, cols, rows in _walks07(tiles, lesson, g):
        want = 1 if col % 2 == 0 else -1
        if cols != {col}:
            p = next(q for q in run if tiles[q][1] != col)
            return p, (f"program {p} gets tile {tiles[p]}, in column {tiles[p][1]}: it walks "
                       f"column {col} of the group of rows {min(group)}..{max(group)}, as in "
                       "lesson 07's order: a group's programs take its columns in turn, "
                       "height programs each (the column is the position in the group // "
                       "height, the row's place in the column the remainder)")
        if set(rows) != group:
            return run[0], (f"programs {run[0]}..{run[-1]} walk column {col} over rows "
                            f"{rows}: the group's rows are {min(group)}..{max(group)}, each "
                            "once")
        if _steps07(rows) - {want}:
            p = next(i for i, (a, b) in enumerate(zip(rows, rows[1:])) if b - a != want)
            return run[p], (f"programs {run[p]} and {run[p + 1]} get rows {rows[p]} and "
                            f"{rows[p + 1]} of column {col}: column {col} walks "
                            + ("down, from the group's first row" if want > 0
                               else "up, from the group's last row") + ", one row a program")
    return None


def _upward_shift07(tiles, lesson, g):
    """s (1 or -1) if every upward column is walked in the right direction but s rows away
    from its group's rows, and the downward ones are right; else None."""
    shifts = set()
    for run, col, group, cols, rows in _walks07(tiles, lesson, g):
        if cols != {col} or _steps07(rows) - {1 if col % 2 == 0 else -1}:
            return None
        if col % 2 == 0:
            if set(rows) != group:
                return None
        else:
            shifts.add(min(rows) - min(group))
            if set(rows) != {r + min(rows) - min(group) for r in group}:
                return None
    return shifts.pop() if len(shifts) == 1 and shifts <= {1, -1} else None


def _flipped07(tiles, lesson, g):
    """True if every column of every group covers its rows, walked the other way round."""
    return all(
        cols == {col} and set(rows) == group
        and not _steps07(rows) - {-1 if col % 2 == 0 else 1}
        for _, col, group, cols, rows in _walks07(tiles, lesson, g))


def ex07_order(order):
    """Lesson 07, exercise 1: the snake order (lesson 07's groups, odd columns walked up): a
    bijection, ragged last group included. The order is read by its properties against the
    lesson's (same groups and columns; each column walked one row a program, down or up by
    its parity)."""
    grids = 0
    for num_pid_m in range(1, 12):
        for num_pid_n in range(1, 9):
            for g in (1, 2, 3, 4, 8):
                grids += 1
                n = num_pid_m * num_pid_n
                with run_answer("my_snake_order", seconds=20), \
                        no_package_calls("my_snake_order"):
                    tiles = [tuple(order(p, num_pid_m, num_pid_n, g)) for p in range(n)]
                lesson = [_grouped(p, num_pid_m, num_pid_n, g) for p in range(n)]
                fault = _snake_fault(tiles, lesson, g)
                if fault is None:
                    continue
                where = f"grid {num_pid_m} x {num_pid_n} tiles, group_size_m={g}"
                shift = _upward_shift07(tiles, lesson, g)
                if shift is not None and num_pid_m % g == 0:       # no ragged group
                    side = "below" if shift > 0 else "above"
                    raise ExerciseError(
                        f"{where}: in the upward columns every program gets the tile one "
                        f"row {side} the snake order's: off by one: an upward column starts "
                        "at the group's last row, first_pid_m + height - 1, and position p "
                        "down the column is row first_pid_m + height - 1 - p")
                seen = set(tiles)
                missing = [(m, q) for m in range(num_pid_m) for q in range(num_pid_n)
                           if (m, q) not in seen]
                if missing or len(seen) != len(tiles):
                    outside = [t for t in tiles if not (0 <= t[0] < num_pid_m
                                                        and 0 <= t[1] < num_pid_n)]
                    twice = len(tiles) - len(seen)
                    raise ExerciseError(
                        f"{where}: tiles {missing[:4]} are never computed"
                        + (f", {twice} computed twice" if twice else "")
                        + (f", programs get tiles outside the grid {outside[:4]}" if outside
                           else "")
                        + (" (the last group is ragged: it has num_pid_m - first_pid_m rows, "
                           "and an upward column starts at its own last row)"
                           if num_pid_m % g else ""))
                p, what = fault
                if tiles == lesson:
                    why = ("that is lesson 07's order, every column of a group walked down: "
                           "walk the odd columns of a group (1, 3, ...) up, from the group's "
                           "last row to its first")
                elif _flipped07(tiles, lesson, g):
                    why = ("the even columns are walked up and the odd ones down: column 0 of "
                           "a group walks down, from the group's first row")
                elif tiles == [(q // num_pid_n, q % num_pid_n) for q in range(n)]:
                    why = "that is row-major order"
                else:
                    why = ("inside a group, consecutive programs walk down column 0, up column "
                           "1, down column 2...")
                raise ExerciseError(f"{HINTS['order']}: {where}: {what} ({why})")
    return f"my_snake_order: the snake order on {grids} grids, ragged groups included"


def _launch07(kernel, a, b, c):
    """Lesson 07's launch (16 x 16 x 16 tiles on the interpreter, GROUP_SIZE_M = 8)."""
    from ..kernels import k07_triton_swizzle as k07
    k07.matmul(a, b, c, kernel=kernel)


def _stray(kernel, M, N, K, bounds):
    """Lanes of my_kernel's loads that read outside A and B on an M x N x K product (fp16,
    contiguous operands of exactly that size)."""
    a, b = harness.make_operands(M, N, K, torch.float16)
    c = torch.full((M, N), float("nan"), dtype=torch.float16)
    bounds.allow(a, b)
    before = bounds.outside
    with run_answer("my_kernel"):
        _launch07(kernel, a, b, c)
    return bounds.outside - before


def _k_loop_cause(kernel, bounds=None):
    """The K loop's typical mistake, read from one square product (32 x 32 x 32, fp32,
    contiguous, whole tiles: no mask matters) against what each mistake computes; or None.
    ``bounds``: the active :func:`interp_poison.bounded_loads`, told about the operands."""
    a, b = harness.make_operands(32, 32, 32, torch.float32)
    c = torch.full((32, 32), float("nan"))
    if bounds is not None:
        bounds.allow(a, b)
    try:
        with run_answer("my_kernel"):
            _launch07(kernel, a, b, c)
    except ExerciseError:
        return None
    A, B = a.double(), b.double()
    wrong = {
        "A's strides swapped: element (m, k) of A is at a_ptr + m * stride_am + k * stride_ak":
            A.t() @ B,
        "B's strides swapped: element (k, n) of B is at b_ptr + k * stride_bk + n * stride_bn":
            A @ B.t(),
        "the accumulator: only the last K-tile is in C; tl.dot(a, b, acc) (or acc += "
        "tl.dot(a, b)) adds each K-tile's product to acc": A[:, 16:] @ B[16:],
        "the K positions of tile k: k * BLOCK_SIZE_K + offs_k (tile k starts BLOCK_SIZE_K * k "
        "columns into A and rows into B, not k)":
            sum(A[:, k:k + 16] @ B[k:k + 16] for k in (0, 1)),
    }
    got = c.double()
    for why, ref in wrong.items():
        if torch.allclose(got, ref, rtol=1e-3, atol=1e-3):
            return why
    return None


def ex07_kernel(kernel):
    """Lesson 07, exercise 2: the K loop without advancing pointers, its loads masked on M, N
    and K (no wrap-around of the rows and columns past the edge)."""
    from .. import interp_poison
    from ..kernels import k07_triton_swizzle as k07
    refuse_package_kernel(kernel, "my_kernel")
    refuse_package_helpers(kernel, "my_kernel", allowed=(k07.grouped_pid,))
    with interp_poison.bounded_loads() as bounds:
        if bounds.active:
            for M, N, K, what in ((40, 32, 32, "rows"), (32, 40, 32, "columns"),
                                  (32, 32, 40, "k")):
                if _stray(kernel, M, N, K, bounds):
                    if what == "rows":
                        raise ExerciseError(
                            f"M = {M} (a partial last row of tiles): the A loads read rows past "
                            f"the last row of A (stray memory on a GPU, a crash at worst). "
                            f"{HINTS['mask']} on M: mask A's loads with offs_m[:, None] < M "
                            "as well as with the K position")
                    if what == "columns":
                        raise ExerciseError(
                            f"N = {N} (a partial last column of tiles): the B loads read "
                            f"columns past the last column of B. {HINTS['mask']} on N: mask "
                            "B's loads with offs_n[None, :] < N as well as with the K position")
                    wrong = _k_loop_cause(kernel, bounds)
                    if wrong:
                        raise ExerciseError(f"K = {K}: the loads read outside A or B: {wrong}")
                    raise ExerciseError(
                        f"K = {K} (a partial last K-tile): the loads read past the end of K. "
                        f"{HINTS['mask']} on K: mask with the K position of the tile's "
                        "elements, k * BLOCK_SIZE_K + offs_k < K, not with offs_k alone")

    def run(a, b, c):
        bounds.allow(a, b)
        _launch07(kernel, a, b, c)

    with interp_poison.bounded_loads() as bounds, interp_poison.poison_masked_loads() as poison:
        try:
            report = check_product(run, "my_kernel", (torch.float16, torch.float32),
                                   small_suite(("square", "rectangular", "ragged", "M=1",
                                                 "K=1", "A transposed")))
        except ExerciseError as e:
            text = str(e)
            if bounds.outside and "TODO" not in text:
                text = text.split("\nLikely cause:")[0] + (
                    "\nLikely cause: a missing mask: the loads read "
                    f"{bounds.outside} lanes past the end of A or B: mask A's loads on M and "
                    "K, B's on K and N")
            elif poison.poisoned and ("NaN" in text or "nan" in text):
                text = text.split("\nLikely cause:")[0] + (
                    f"\nLikely cause: {HINTS['other']}: lanes the mask switches off are "
                    "undefined on a GPU (NaN here) and reach tl.dot; give the loads "
                    "other=0.0")
            elif "TODO" not in text and "\nLikely cause:" in text:
                wrong = _k_loop_cause(kernel, bounds)
                if wrong:
                    text = text.split("\nLikely cause:")[0] + "\nLikely cause: " + wrong
            raise ExerciseError(text) from None
        # partial K-tiles inside larger buffers: reads past K would find nonzero values
        big_a, big_b = torch.randn(24, 64).half(), torch.randn(64, 20).half()
        a, b = big_a[:, :21], big_b[:21]
        c = torch.full((24, 20), float("nan"), dtype=torch.float16)
        with run_answer("my_kernel"):
            run(a, b, c)
        ok, _, _ = harness.compare(c, harness.reference(a, b), a, b, torch.float16)
        if not ok:
            raise ExerciseError(f"K = 21 is wrong when the operands continue past K: "
                                f"{HINTS['mask']} on K in the K-tile loads (the tile's K "
                                "positions, k * BLOCK_SIZE_K + offs_k, below K)")
    return f"{report}; loads masked on M, N and K, partial K-tiles inside larger buffers"


_TABLES = {}


def _program_table(num_pid_m, num_pid_n, g, order):
    """A (num_pid_m, num_pid_n) tensor: the program that ``order`` gives each tile (kept:
    the check asks about several waves of each grid)."""
    key = (num_pid_m, num_pid_n, g, order)
    if key not in _TABLES:
        table = torch.full((num_pid_m, num_pid_n), -1, dtype=torch.int64)
        for p in range(num_pid_m * num_pid_n):
            table[order(p, num_pid_m, num_pid_n, g)] = p
        _TABLES[key] = table
    return _TABLES[key]


def _strips(M, N, BM, BN, g, programs, wave, order, *, whole_grid=False, floor=False,
            shift=0):
    """(distinct pid_m, distinct pid_n) of the tiles that wave ``wave`` computes, read from
    the table of programs by tile (a row of tiles is one strip of A, a column one of B); and
    some wrong variants (``shift``: the wave's programs taken that many ids later)."""
    grid = (M // BM, N // BN) if floor else (ceil_div(M, BM), ceil_div(N, BN))
    table = _program_table(*grid, g, order)
    mine = (table >= 0 if whole_grid
            else ((table - shift) // programs == wave) & (table >= shift))
    return int(mine.any(dim=1).sum()), int(mine.any(dim=0).sum())


def _column_major(pid, num_pid_m, num_pid_n, group_size_m):
    return pid % num_pid_m, pid // num_pid_m


def _guarded(order):
    """``order`` refusing a program id outside the grid (the learner's last wave ran past
    it) with the cause."""
    def guarded(pid, num_pid_m, num_pid_n, group_size_m):
        total = num_pid_m * num_pid_n
        if not 0 <= pid < total:
            raise ExerciseError(
                f"order({pid}, {num_pid_m}, {num_pid_n}, ...) asks for program {pid}, but the "
                f"grid has only {total} tiles ({num_pid_m} x {num_pid_n}), programs 0 .. "
                f"{total - 1}: the last wave runs fewer than `programs` programs (and a grid "
                "smaller than a wave runs all of them at once): stop at the grid's last program")
        return order(pid, num_pid_m, num_pid_n, group_size_m)
    return guarded


def ex07_wave(wave_strips):
    """Lesson 07, exercise 3: the L2 model of any wave, for the tile order it is given (the
    grouped order, and a column-major one), the last wave partial."""
    grids = 0
    for order, name in ((_grouped, "grouped"), (_column_major, "column-major")):
        guarded = _guarded(order)
        for M, N in [(8192, 8192), (4096, 4096), (16384, 2048), (500, 700), (1024, 65536)]:
            for g in (1, 4, 8):
                for programs in (132, 7):
                    total = ceil_div(M, 128) * ceil_div(N, 256)
                    waves = ceil_div(total, programs)
                    for wave in sorted({0, 1, waves - 1} & set(range(waves))):
                        grids += 1
                        args = (M, N, 128, 256, g, programs)
                        want = _strips(*args, wave, order)
                        with run_answer("my_wave", seconds=20), \
                                no_package_calls("my_wave", allowed=(guarded,)):
                            got = tuple(wave_strips(*args, wave, guarded))
                        if got == want:
                            continue
                        if wave and got == _strips(*args, 0, order):
                            cause = (f"these are the strips of wave 0: wave {wave} runs "
                                     f"programs {wave} * programs .. {wave + 1} * programs - 1")
                        elif g > 1 and got == _strips(*args[:4], 1, programs, wave, order):
                            cause = (f"{HINTS['order']}: these are the strips of "
                                     "group_size_m = 1 (row-major): pass group_size_m on to "
                                     "order")
                        elif got == _strips(*args, wave, order, whole_grid=True):
                            cause = ("these are the strips of the whole grid, not of one wave: "
                                     "only `programs` programs run at once")
                        elif got == tuple(reversed(want)):
                            cause = ("A and B swapped: A's strips are the distinct pid_m, B's "
                                     "the distinct pid_n")
                        elif got in (_strips(*args, wave, order, shift=1),
                                     _strips(*args, wave, order, shift=-1)):
                            cause = (f"off by one: wave {wave} runs programs {wave} * programs "
                                     f"to {wave + 1} * programs - 1 (ids count from 0: "
                                     "range(wave * programs, min((wave + 1) * programs, "
                                     "programs in the grid)))")
                        elif got == _strips(*args, wave, order, floor=True):
                            cause = (f"{HINTS['grid']}: a partial tile is a tile, "
                                     "the grid is triton.cdiv(M, BM) x triton.cdiv(N, BN)")
                        else:
                            cause = ("count the distinct pid_m and pid_n among the tiles that "
                                     "order() gives the programs of the wave")
                        raise ExerciseError(
                            f"{M} x {N}, GROUP_SIZE_M={g}, {programs} programs a wave, wave "
                            f"{wave} of {waves}, {name} order: got {got} (A strips, B strips), "
                            f"expected {want}: {cause}")
    tiles = ceil_div(8192, 128) * ceil_div(8192, 256)
    waves = ceil_div(tiles, 132)
    first = wave_strips(8192, 8192, 128, 256, 8, 132, 0, _guarded(_grouped))
    last = wave_strips(8192, 8192, 128, 256, 8, 132, waves - 1, _guarded(_grouped))
    return (f"my_wave: right on {grids} waves. 8192 x 8192 in {waves} waves of 132, grouped by "
            f"8: wave 0 reads {first[0]} + {first[1]} strips, wave {waves - 1} (the last "
            f"{tiles - (waves - 1) * 132} programs) {last[0]} + {last[1]}")


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
                with run_answer("my_program_of", seconds=20), \
                        no_package_calls("my_program_of"):
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
    tiles = [_grouped(p, num_pid_m, num_pid_n, g) for p in pids]
    with run_answer(f"my_program_of on {len(pids)} tiles of a 3001 x 2003 grid (compute the "
                    "program from the tile's group in a few operations, without a search over "
                    "programs)", seconds=5), no_package_calls("my_program_of"):
        for p, t in zip(pids, tiles):
            got = program_of(*t, num_pid_m, num_pid_n, g)
            if got != p:
                raise ExerciseError(f"{HINTS['order']}: grid {num_pid_m} x {num_pid_n}, "
                                    f"group_size_m={g}: my_program_of{t} = {got}, expected {p}")
    nine = {t: program_of(*t, 9, 9, 3) for t in ((0, 8), (8, 0), (8, 8))}
    return (f"my_program_of: the inverse of the grouped order on {grids + 1} grids, ragged "
            f"groups included. 9 x 9 tiles, group_size_m = 3: tile (0, 8) is program "
            f"{nine[(0, 8)]}, (8, 0) is {nine[(8, 0)]}, (8, 8) is {nine[(8, 8)]}")
