"""The checks of lesson 03 (bank conflicts): ``exercises/03_*.ipynb``."""
from __future__ import annotations

from collections import defaultdict

import torch

from .. import harness
from .guards import ExerciseError, run_answer
from .audits import barrier_audit, nan_shared
from .products import (bind_numba, ceil_div, check_product, launched_kernels, sim_launch,
                       small_suite)
from .refusal import no_package_calls, refuse_package_helpers, refuse_package_kernel


def _numba_globals():
    """Bind ``cuda`` and ``float32`` as globals of this module (see
    :func:`products.bind_numba`)."""
    bind_numba(globals())


def ex03_ways(ways):
    """Lesson 03, exercise 1: the bank-conflict degree of a warp request."""
    import random
    rng = random.Random(3)
    cases = {"consecutive": list(range(32)), "broadcast": [7] * 32,
             "stride 2": list(range(0, 64, 2)), "column of 32 x 32": [32 * i for i in range(32)],
             "column of 32 x 33": [33 * i for i in range(32)], "stride 8": [8 * i for i in range(32)],
             "pairs": [i // 2 for i in range(32)]}
    for i in range(5):
        cases[f"random {i}"] = [rng.randrange(256) for _ in range(32)]

    def truth(words, nbanks=32, distinct=True):
        banks = defaultdict(list)
        for w in words:
            if not distinct or w not in banks[w % nbanks]:
                banks[w % nbanks].append(w)
        return max(len(s) for s in banks.values())

    for name, words in cases.items():
        with run_answer("ways"), no_package_calls("ways"):
            got = ways(list(words))
        want = truth(words)
        if got != want:
            if got == truth(words, distinct=False):
                why = "lanes reading the same word are one broadcast: count distinct words"
            elif got == truth(words, nbanks=16):
                why = "shared memory has 32 banks: word w is in bank w % 32"
            else:
                why = "the busiest bank decides: distinct words per bank w % 32"
            raise ExerciseError(f"{name}: words {words[:6]}...: got {got}-way, expected "
                                f"{want}-way ({why})")
    return "ways: right on 12 requests (broadcasts, strides, random)"


def ex03_swizzle(run_swizzled):
    """Lesson 03, exercise 2: the swizzled store and read; conflict-free and correct (shared
    memory starting as NaN); the kernel launched must be the learner's own."""
    from .. import counters
    a, b = harness.make_operands(32, 8, 32)
    with launched_kernels() as seen:
        try:
            with run_answer("run_swizzled"):
                run_swizzled(a, b, torch.empty(32, 8))
        except ExerciseError:
            pass                            # the product check names what went wrong
    for k in {id(k): k for k in seen}.values():
        refuse_package_kernel(k, "swizzled")
        refuse_package_helpers(k, "swizzled")
    with barrier_audit() as audit:
        try:
            report = check_product(run_swizzled, "swizzled",
                                   cases=small_suite(("square", "ragged", "K=1", "A transposed")),
                                   audit=audit)
        except ExerciseError as e:
            text = str(e)
            if "\nLikely cause:" in text and not audit.race and "TODO" not in text:
                text = text.split("\nLikely cause:")[0] + (
                    "\nLikely cause: the swizzle: the store and the read must put logical "
                    "element (row, k) at the same place, column (k + row) % 32 of its row")
            raise ExerciseError(text) from None
    a, b = harness.make_operands(32, 8, 32)
    c = torch.empty(32, 8)
    with counters.trace(A=a, B=b, C=c) as t:
        run_swizzled(a, b, c)
    worst = t.max_shared_ways()
    if worst != 1:
        raise ExerciseError(f"a shared-memory request is {worst}-way: the store and the read "
                            "must spread a column of the logical tile over 32 banks")
    return f"{report}; every shared-memory request is 1-way, with a 32 x 32 tile"


def _ways_of_words(words):
    banks = defaultdict(set)
    for w in words:
        banks[w % 32].add(w)
    return max(len(s) for s in banks.values())


def _bank_of(i, k, width, pad, elem_bytes, *, use_pad=True, use_bytes=True, nbanks=32,
             transposed=False, words=True):
    row = width + pad if use_pad else width
    e = elem_bytes if use_bytes else 4
    off = (k * row + i) if transposed else (i * row + k)
    if not words:
        return (off * e) % nbanks
    if not use_bytes:
        return off % nbanks
    return (off * e // 4) % nbanks


def ex03_bank(bank):
    """Lesson 03, exercise 3: the bank of element (i, k) of a shared tile whose rows are
    ``width + pad`` elements of ``elem_bytes`` bytes."""
    points = [(i, k, width, pad, e) for e in (4, 2, 1) for width in (32, 8, 16, 64)
              for pad in (0, 1, 2, 4) for i in range(32)
              for k in sorted({0, 1, 3, width - 1})]
    with run_answer("bank"), no_package_calls("bank"):
        got = [bank(*p) for p in points]
    want = [_bank_of(*p) for p in points]
    if got != want:
        mistakes = [
            (dict(use_pad=False), "the padding: a padded row is width + pad elements long"),
            (dict(use_bytes=False), "the element size: offsets count elements, banks count "
             "4-byte words (how many bytes from the start of the tile is the element?)"),
            (dict(transposed=True), "rows and columns: the tile is stored row after row "
             "(row-major): element (i, k) comes after i whole rows and k elements of its row"),
            (dict(nbanks=16), "the number of banks: shared memory has 32 banks"),
            (dict(words=False), "bytes, not words: a bank is 4 bytes wide (byte offset // 4, "
             "then % 32)"),
        ]
        why = next((w for flags, w in mistakes
                    if got == [_bank_of(*p, **flags) for p in points]), None)
        if why is None and any(isinstance(g, float) for g in got):
            why = ("a whole word: elements smaller than 4 bytes share their 4-byte word "
                   "(integer division, //)")
        j = next(n for n, (g, w) in enumerate(zip(got, want)) if g != w)
        i, k, width, pad, e = points[j]
        why = why or ("the byte offset of element (i, k), divided by the 4 bytes of a word, "
                      "then modulo 32")
        raise ExerciseError(
            f"bank(i={i}, k={k}, width={width}, pad={pad}, elem_bytes={e}) = {got[j]!r}, "
            f"expected {want[j]}.\nLikely cause: {why}")
    ways = {}
    for e, pad in ((4, 0), (4, 1), (2, 0), (2, 1), (2, 2), (1, 0), (1, 4)):
        ways[(e, pad)] = _ways_of_words(
            [(i * (32 + pad) * e) // 4 for i in range(32)])
    text = ", ".join(f"{e}-byte pad {p}: {w}-way" for (e, p), w in ways.items())
    return f"bank: right on {len(points)} elements; a column read of a 32-wide tile: {text}"


_swz03 = {}


def _swizzled_k8(swizzle, BN=4):
    """Lesson 03's column-walk kernel with a 32 x 8 tile of A (BK = 8, no padding): element
    (r, c) of the tile is stored at column swizzle(r, c) of its row, and read from there."""
    _numba_globals()
    BK = 8

    @cuda.jit
    def swizzled_k8(A, B, C):
        sA = cuda.shared.array((32, BK), float32)   # (m, k), swizzled columns
        sB = cuda.shared.array((BK, BN), float32)   # (k, n)
        M, K = A.shape
        N = B.shape[1]
        lane = cuda.threadIdx.x                     # row of the C tile
        ty = cuda.threadIdx.y                       # column of the C tile
        tid = ty * 32 + lane
        m0 = cuda.blockIdx.y * 32
        n0 = cuda.blockIdx.x * BN
        acc = float32(0.0)
        for k0 in range(0, K, BK):
            for e in range(tid, 32 * BK, 32 * BN):  # a warp stores 4 rows of 8
                r = e // BK
                c = e % BK
                v = float32(0.0)
                if m0 + r < M and k0 + c < K:
                    v = A[m0 + r, k0 + c]
                sA[r, swizzle(r, c)] = v
            if tid < BK * BN:
                kr = tid // BN
                c = tid % BN
                sB[kr, c] = B[k0 + kr, n0 + c] if k0 + kr < K and n0 + c < N else 0.0
            cuda.syncthreads()
            for k in range(BK):                     # the warp walks down column k
                acc += sA[lane, swizzle(lane, k)] * sB[k, ty]
            cuda.syncthreads()
        if m0 + lane < M and n0 + ty < N:
            C[m0 + lane, n0 + ty] = acc

    def run(a, b, c):
        M, N = c.shape
        sim_launch(swizzled_k8, (ceil_div(N, BN), ceil_div(M, 32)), (32, BN), a, b, c)
    return run


def ex03_xor_swizzle(swizzle):
    """Lesson 03, exercise 4: an XOR swizzle of a 32 x 8 float32 tile: every row a
    permutation of its 8 columns, every column walk of a warp 1-way; then in the kernel."""
    import numbers
    from .. import counters
    refuse_package_kernel(swizzle, "swizzle")
    with run_answer("swizzle"), no_package_calls("swizzle"):
        table = [[swizzle(r, c) for c in range(8)] for r in range(32)]
    odd = next((v for row in table for v in row if not isinstance(v, numbers.Integral)), None)
    if odd is not None:
        raise ExerciseError(f"swizzle returned {odd!r}: return a column, an int from 0 to 7")
    for r, row in enumerate(table):
        if sorted(row) != list(range(8)):
            raise ExerciseError(
                f"row {r}: columns 0..7 go to {row}: a swizzle must send the 8 columns of a "
                "row to the columns 0..7, each once (a permutation); otherwise two elements "
                "share a place or one falls outside the row (XOR with a value from 0 to 7 "
                "stays within 0..7)")
    for k in range(8):
        words = [8 * i + table[i][k] for i in range(32)]
        w = _ways_of_words(words)
        if w > 1:
            by_bank = defaultdict(list)
            for i, word in enumerate(words):
                by_bank[word % 32].append(i)
            lanes = max(by_bank.values(), key=len)
            raise ExerciseError(
                f"column {k}: a warp reading sA[lane, {k}] is {w}-way: lanes {lanes[:4]} "
                f"land in bank {words[lanes[0]] % 32}. A row is 8 words, so rows i and i + 4 "
                "start in the same bank: the 8 rows with the same i % 4 need 8 different "
                "columns for column k (what of the row tells them apart?)")
    run = _swizzled_k8(swizzle)
    with nan_shared():
        report = check_product(run, "swizzle in the kernel",
                               cases=small_suite(("square", "ragged")))
    a, b = harness.make_operands(32, 8, 16)
    c = torch.empty(32, 8)
    with counters.trace(A=a, B=b, C=c) as t:
        run(a, b, c)
    worst = t.max_shared_ways()
    if worst != 1:
        raise ExerciseError(f"in the kernel a shared-memory request is {worst}-way")
    return (f"{report}; every row a permutation, every shared-memory request 1-way "
            "(column walks and tile stores)")
