"""The checks of lesson 05 (WMMA tensor cores): ``exercises/05_*.ipynb``."""
from __future__ import annotations

import contextlib
import threading
from collections import defaultdict

import torch

from .. import harness
from .guards import ExerciseError, HINTS, run_answer, shorten
from .audits import nan_shared
from .products import bind_numba, check_product, launched_kernels, small_suite
from .refusal import no_package_calls, refuse_package_helpers, refuse_package_kernel


def _numba_globals():
    """Bind ``cuda`` and ``float32`` as globals of this module (see
    :func:`products.bind_numba`)."""
    bind_numba(globals())


_WARP_TILE = ("the fragment offsets and layouts of this exercise's transposed tiles: sA holds "
              "A's tile k-major (sA[k, m]) and sB B's tile n-major (sB[n, k]), so fragment i "
              "of A starts at row kk, column i * 16 of sA and fragment j of B at row j * 16, "
              "column kk of sB; both are read as \"col\" (the transpose of what memory "
              "holds), in the loads and in the product; acc[i, j] pairs rA[i] with rB[j]")


@contextlib.contextmanager
def _layouts():
    """{("wmma_load_a" | "wmma_load_b" | "wmma_mma", layout...)}: the layouts the WMMA calls
    inside were given; and ("ld", load, ld, row) where a load's leading dimension is not the
    length of the shared array's rows."""
    from .. import ptx
    seen, lock = set(), threading.Lock()
    real = {n: getattr(ptx, n) for n in ("wmma_load_a", "wmma_load_b", "wmma_mma")}

    def load(name):
        def f(frag, arr, idx, ld, layout):
            with lock:
                seen.add((name, layout))
                if int(ld) != arr.shape[-1]:      # the stride between the rows it reads
                    seen.add(("ld", name, int(ld), arr.shape[-1]))
            return real[name](frag, arr, idx, ld, layout)
        return f

    def mma(acc, a, b, la, lb):
        with lock:
            seen.add(("wmma_mma", la, lb))
        return real["wmma_mma"](acc, a, b, la, lb)

    ptx.wmma_load_a, ptx.wmma_load_b, ptx.wmma_mma = load("wmma_load_a"), load("wmma_load_b"), mma
    try:
        yield seen
    finally:
        for n, f in real.items():
            setattr(ptx, n, f)


def _kernels_of(run, what, allowed, dtype=torch.float16):
    """Run ``run`` once on a small product; refuse the kernel it launches if it is the
    package's own or uses a helper of the package other than ``allowed``."""
    from .. import ptx
    a, b = harness.make_operands(32, 32, 16, dtype)
    with launched_kernels() as seen, nan_shared():
        try:
            with run_answer(what):
                run(a, b, torch.empty(32, 32, dtype=dtype))
        except ExerciseError:
            pass                            # the product check names what went wrong
    allowed = list(allowed) + [ptx.wmma_load_a, ptx.wmma_load_b, ptx.wmma_mma,
                               ptx.wmma_store_d]
    for k in {id(k): k for k in seen}.values():
        refuse_package_kernel(k, what)
        refuse_package_helpers(k, what, allowed=allowed)


def ex05_warp_tile(run, BM, BN, BK):
    """Lesson 05, exercise 1: the warp's tensor-core step on transposed tiles (sA[k, m],
    sB[n, k]), which the given ``load_tiles`` fills; shared memory starts as NaN. The
    layouts each WMMA call names are recorded; the kernel may call only that helper."""
    from .. import ptx
    FM, FN = BM // 16, BN // 16
    _kernels_of(run, "my_wmma", [k05_load_tiles(BM, BN, BK)])
    try:
        with _layouts() as used, nan_shared():
            report = check_product(run, "my_wmma", (torch.float16,), cases=small_suite(
                ("square", "ragged", "M=1", "K=1", "A transposed")))
    except ExerciseError as e:
        text = str(e)
        wrong = sorted(str(u) for u in used if "row" in u)
        lds = sorted(u for u in used if u[0] == "ld")
        if lds and "TODO" not in text:
            _, name, ld, row = lds[0]
            text = text.split("\nLikely cause:")[0] + (
                f"\nLikely cause: the leading dimension: {name} is given {ld}, but the rows "
                f"of the shared array it reads are {row} elements apart (LDA = BM + 8 for "
                "sA[k, m], LDB = BK + 8 for sB[n, k]: the padded row, not the tile's width)")
        elif "\nLikely cause:" in text and "TODO" not in text and HINTS["zero"] not in text:
            text = text.split("\nLikely cause:")[0] + "\nLikely cause: " + (
                f"a layout: {', '.join(wrong)} reads a tile as memory holds it, but these "
                "tiles are stored transposed; " if wrong else "") + _WARP_TILE
        elif "wmma_load" in text and "is outside the shared array" in text:
            which = "wmma_load_a" if "wmma_load_a" in text else "wmma_load_b"
            text = (f"my_wmma: {which} reads a 16x16 tile that starts outside sA or sB "
                    f"({shorten(text.split('IndexError: ')[-1].split('): ')[0], 200)}): "
                    + _WARP_TILE)
        raise ExerciseError(text) from None
    calls, lock, real = [0], threading.Lock(), ptx.wmma_mma

    def counted(*args):
        with lock:
            calls[0] += 1
        return real(*args)

    ptx.wmma_mma = counted
    try:
        a, b = harness.make_operands(32, 32, 32, torch.float16)
        with nan_shared():
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
            try:
                with run_answer("smallest_pad", seconds=3), no_package_calls("smallest_pad"):
                    got = smallest_pad(row, elem)
            except ExerciseError as e:
                if HINTS["timeout"] not in str(e):
                    raise
                raise ExerciseError(
                    f"smallest_pad({row}, {elem}) never returned (no pad it tried made rows of "
                    f"{elem}-byte elements conflict-free): the step between the paddings it "
                    f"tries. Rows stay 16-byte aligned with pads of 16 // elem_bytes = {step} "
                    f"elements; a step of more bytes than 16 (8 elements of {elem} bytes are "
                    f"{8 * elem}) keeps every row start on the same few banks, and the loop "
                    "runs for ever") from None
            answers.add(want)
            if got != want:
                more = ""
                if isinstance(got, int) and got % step:
                    more = f" ({got} is not a multiple of {step} elements: rows must stay 16-byte aligned)"
                elif isinstance(got, int) and got > want:
                    more = " (not the smallest)"
                elif isinstance(got, int) and _ldmatrix_ways(row + got) == 1:
                    more = (f" (rows {(row + got) * elem} bytes apart leave a "
                            f"{_ldmatrix_ways((row + got) * elem)}-way conflict: ways() takes "
                            f"the row's bytes, (row + pad) * elem_bytes, not its {row + got} "
                            "elements)")
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
        with run_answer("ldmatrix_address", seconds=5), no_package_calls("ldmatrix_address"):
            rc = ldmatrix_address(lane)
        if (not isinstance(rc, tuple) or len(rc) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in rc)):
            raise ExerciseError(f"ldmatrix_address({lane}) = {rc!r}: return a pair of ints, "
                                "(row, column) of the 16x16 tile, in elements")
        r, c = rc
        if not (0 <= r < 16 and 0 <= c < 16):
            with run_answer("ldmatrix_address", seconds=5):
                side_by_side = [ldmatrix_address(q)[1] for q in (8, 16, 24)] == [8, 16, 24]
            why = ("the four 8x8 matrices are the tile's quarters, two down and two across "
                   "(columns 0..7 and 8..15), not four side by side" if side_by_side
                   else "rows and columns 0..15, counted in halves, not bytes")
            raise ExerciseError(f"ldmatrix_address({lane}) = {rc}: outside the 16x16 tile "
                                f"({why})")
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


def k05_load_tiles(BM, BN, BK):
    """Exercise 1's other half: ``load_tiles(A, B, sA, sB, bm, bn, k0, lane)`` copies the
    BM x BK tile of A at (bm, k0) into ``sA`` transposed (``sA[k, m]``) and the BK x BN
    tile of B at (k0, bn) into ``sB`` transposed (``sB[n, k]``), zeros outside A and B."""
    key = ("load", BM, BN, BK)
    if key not in _k05:
        _numba_globals()

        @cuda.jit(device=True)
        def load_tiles(A, B, sA, sB, bm, bn, k0, lane):
            M, K = A.shape
            N = B.shape[1]
            for e in range(lane, BM * BK, 32):      # k-major: A's column k0 + kk is row kk
                kk, m = e // BM, e % BM
                inside = bm + m < M and k0 + kk < K
                sA[kk, m] = A[bm + m, k0 + kk] if inside else 0
            for e in range(lane, BK * BN, 32):      # n-major: B's column bn + n is row n
                n, kk = e // BK, e % BK
                inside = k0 + kk < K and bn + n < N
                sB[n, kk] = B[k0 + kk, bn + n] if inside else 0

        _k05[key] = load_tiles
    return _k05[key]


def k05_mma_step(BM, BN, BK):
    """Exercise 4's other half: ``mma_step(sA, sB, rA, rB, acc, kk, LDA, LDB)`` adds the
    16-deep slice kk of the tiles' product into the FM x FN accumulator fragments, for
    row-major tiles (``sA[m, k]``, ``sB[k, n]``), as lesson 05's kernel does."""
    key = ("mma", BM, BN, BK)
    if key not in _k05:
        _numba_globals()
        from .. import ptx as _ptx
        FM, FN = BM // 16, BN // 16

        @cuda.jit(device=True)
        def mma_step(sA, sB, rA, rB, acc, kk, LDA, LDB):
            for i in range(FM):
                top = i * 16                        # fragment i: rows top.. of sA
                _ptx.wmma_load_a(rA[i], sA, (top, kk), LDA, "row")
            for j in range(FN):
                left = j * 16                       # fragment j: columns left.. of sB
                _ptx.wmma_load_b(rB[j], sB, (kk, left), LDB, "row")
            for i in range(FM):
                for j in range(FN):
                    _ptx.wmma_mma(acc[i, j], rA[i], rB[j], "row", "row")

        _k05[key] = mma_step
    return _k05[key]


def ex05_tiles(run, BM, BN, BK):
    """Lesson 05, exercise 4: the copy of the block's A and B tiles into padded shared
    memory, a 32-bit word (two halves) per lane and step, with zeros past every edge; the
    kernel may call only the given ``mma_step``. The product, with shared memory starting as
    NaN, so that a tail left unwritten shows; then who copies what, from a trace (each
    element once, a word per lane and step)."""
    from .. import counters
    _kernels_of(run, "my_tiles", [k05_mma_step(BM, BN, BK)])
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
            if case.name == "square" and "still NaN" in text:
                cause = ("elements of a tile that no lane writes (shared memory still NaN, "
                         "and no edge in this shape): lane l copies words l, l + 32, l + 64, "
                         "... (a step of 32, the warp's lanes) up to the tile's last word "
                         "(BM * BK // 2 for A, BK * BN // 2 for B), and word w is the halves "
                         "2w and 2w + 1 of the tile numbered row by row: row 2w // BK, column "
                         "2w % BK of A's tile (BK wide: LDA only spaces sA's rows)")
            elif case.name == "square":
                cause = ("the copy itself (no edge in this shape): element (r, c) of A's tile "
                         "is A[bm + r, k0 + c], stored at sA[r, c]; the tile is BK wide "
                         "(LDA only spaces its rows) and B's is BN wide; word w of a tile holds "
                         "its halves 2w and 2w + 1, numbered row by row")
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
    # then who copies what, in one launch of one k-step
    a, b = harness.make_operands(BM, BN, BK, torch.float16)
    c = torch.empty(BM, BN, dtype=torch.float16)
    with counters.trace(A=a, B=b, C=c) as t, run_answer("my_tiles"):
        run(a, b, c)
    stores = sum(1 for x in t.accesses if x.space == "shared" and x.op == "store")
    want = BM * BK + BK * BN                # each element of both tiles once
    if stores > want:
        raise ExerciseError(
            f"{stores} stores into shared memory for one k-step of one block, where the two "
            f"tiles hold {want}: lanes copy the same elements. Split the work: lane l copies "
            "words l, l + 32, l + 64... of each tile, two halves each")
    words = defaultdict(list)               # (block, lane, array) -> halves stored, in order
    for x in t.accesses:
        if x.space == "shared" and x.op == "store" and x.array.endswith(
                tuple(f":{n}" for n in _sa_sb_lines(t))):
            words[(x.block, x.lane, x.array)].append(x.addr // x.nbytes)
    for (blk, lane, arr), elems in sorted(words.items()):
        pairs = [elems[k:k + 2] for k in range(0, len(elems), 2)]
        bad = next((p for p in pairs if len(p) != 2 or p[1] != p[0] + 1 or p[0] % 2), None)
        if bad is not None:
            raise ExerciseError(
                f"lane {lane} stores the halves {elems[:6]}... of a tile: a lane copies a "
                "32-bit word per step, the two halves 2w and 2w + 1 of word w (w = lane, "
                "lane + 32, ...), one after the other")
    return (f"{report[0].kernel}: correct on {len(report)} shapes (float16), shared memory "
            "starting as NaN; each element of a tile copied once per k-step")


def _sa_sb_lines(t):
    """The source lines of the first two shared arrays the traced kernel declared (sA, sB)."""
    lines = sorted({int(x.array.rsplit(":", 1)[-1]) for x in t.accesses if x.space == "shared"})
    return lines[:2]


def _tile_work(BM, BN, BK, WM, WN):
    """The work of one block and one BK step, counted by walking the loops of a warp-tiled
    WMMA kernel: every warp, every 16-deep slice, every fragment it loads and product it
    takes."""
    per_warp = defaultdict(lambda: {"loads": 0, "mmas": 0})
    bytes_read = 0
    for wm0 in range(0, BM, WM):
        for wn0 in range(0, BN, WN):
            w = per_warp[(wm0, wn0)]
            for _ in range(0, BK, 16):
                frags_a = list(range(wm0, wm0 + WM, 16))
                frags_b = list(range(wn0, wn0 + WN, 16))
                for _frag in frags_a + frags_b:
                    w["loads"] += 1
                    bytes_read += 16 * 16 * 2
                w["mmas"] += len(frags_a) * len(frags_b)
    one = next(iter(per_warp.values()))
    return {"warps": len(per_warp), "loads": one["loads"], "mmas": one["mmas"],
            "smem_bytes": bytes_read}


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
        with run_answer("tile_work", seconds=5), no_package_calls("tile_work"):
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
