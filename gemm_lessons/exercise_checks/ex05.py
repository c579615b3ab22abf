"""The checks of lesson 05 (WMMA tensor cores): ``exercises/05_*.ipynb``."""
from __future__ import annotations

import threading

import torch

from .. import harness
from .guards import ExerciseError, HINTS, run_answer, shorten
from .audits import nan_shared
from .products import bind_numba, check_product, small_suite


def _numba_globals():
    """Bind ``cuda`` and ``float32`` as globals of this module (see
    :func:`products.bind_numba`)."""
    bind_numba(globals())


def ex05_warp_tile(run, FM, FN):
    """Lesson 05, exercise 1: the warp's tensor-core step."""
    from .. import ptx
    try:
        report = check_product(run, "my_wmma", (torch.float16,), cases=small_suite(
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
                    f"({shorten(text.split('IndexError: ')[-1], 200)}): the fragment offsets: "
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
            with run_answer("smallest_pad", seconds=3):
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
        with run_answer("ldmatrix_address", seconds=5):
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
        from .. import ptx as _ptx
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


def ex05_tiles(run, BM, BN, BK):
    """Lesson 05, exercise 4: the copy of the block's A and B tiles into padded shared
    memory, with zeros past every edge. Shared memory starts as NaN, so a tail left unwritten
    shows; the copy must split the tile among the 32 lanes (each element copied once)."""
    from .. import counters
    cases = small_suite(("square", "ragged", "K=1", "M=1", "A transposed"))
    report = []
    for case in cases:
        try:
            with nan_shared():
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
        with run_answer("tile_work", seconds=5):
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
