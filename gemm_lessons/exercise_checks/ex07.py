"""The checks of lesson 07 (Triton tile order): ``exercises/07_*.ipynb``."""
from __future__ import annotations

import torch

from .. import harness
from .guards import ExerciseError, HINTS, run_answer
from .products import ceil_div, check_product, small_suite


def _grouped(pid, num_pid_m, num_pid_n, g):
    from ..common import grouped_order
    return grouped_order(pid, num_pid_m, num_pid_n, g)


def ex07_order(order):
    """Lesson 07, exercise 1: the grouped tile order (a bijection, grouped, ragged)."""
    for num_pid_m in range(1, 12):
        for num_pid_n in range(1, 9):
            for g in (1, 2, 3, 4, 8):
                with run_answer("my_grouped_order", seconds=20):
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
    from .. import interp_poison
    from ..kernels import k07_triton_swizzle as k07

    def run(a, b, c):
        bounds.allow(a, b, c)
        k07.matmul(a, b, c, kernel=kernel)

    with interp_poison.bounded_loads() as bounds, interp_poison.poison_masked_loads() as poison:
        try:
            report = check_product(run, "my_kernel", (torch.float16, torch.float32),
                                   small_suite(("square", "rectangular", "ragged", "M=1",
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
        with run_answer("my_kernel"):
            run(a, b, c)
        ok, _, _ = harness.compare(c, harness.reference(a, b), a, b, torch.float16)
        if not ok:
            raise ExerciseError(f"K = 21 is wrong when the operands continue past K: "
                                f"{HINTS['mask']} on the K-tile loads (offs_k < k_left)")
    # the tile order: 10 x 3 tiles of 16 x 16, GROUP_SIZE_M = 8 (row-major differs)
    a, b = harness.make_operands(160, 48, 16, torch.float16)
    c = torch.full((160, 48), float("nan"), dtype=torch.float16)
    with interp_poison.record_stores(c) as rec, run_answer("my_kernel"):
        run(a, b, c)
    if rec.active:
        cfg = k07.config_for(torch.float16)
        BM, BN = cfg[0], cfg[1]
        got = []
        for _pid, offs in rec.order():
            first = min(offs)
            got.append((first // 48 // BM, first % 48 // BN))
        nm, nn = ceil_div(160, BM), ceil_div(48, BN)
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
    num_pid_m, num_pid_n = (M // BM, N // BN) if floor else (ceil_div(M, BM), ceil_div(N, BN))
    count = num_pid_m * num_pid_n if whole_grid else min(programs, num_pid_m * num_pid_n)
    tiles = [order(p, num_pid_m, num_pid_n, g) for p in range(count)]
    return len({m for m, _ in tiles}), len({n for _, n in tiles})


def _column_major(pid, num_pid_m, num_pid_n, group_size_m):
    return pid % num_pid_m, pid // num_pid_m


def ex07_wave(first_wave):
    """Lesson 07, exercise 3: the L2 model of the first wave, for the tile order it is given
    (the grouped order, and a column-major one that no copy of the lesson's function fits)."""
    from ..kernels import k07_triton_swizzle as k07
    grids = 0
    for order, name in ((_grouped, "grouped"), (_column_major, "column-major")):
        for M, N in [(8192, 8192), (4096, 4096), (16384, 2048), (500, 700), (1024, 65536)]:
            for g in (1, 4, 8):
                for programs in (132, 7):
                    grids += 1
                    want = (k07.first_wave(M, N, 128, 256, g, programs) if order is _grouped
                            else _strips(M, N, 128, 256, g, programs, order))
                    with run_answer("my_first_wave", seconds=20):
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
                with run_answer("my_program_of", seconds=20):
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
    with run_answer(f"my_program_of on {len(pids)} tiles of a 3001 x 2003 grid (compute the "
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
