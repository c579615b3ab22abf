"""The checks of lesson 03 (bank conflicts): ``exercises/03_*.ipynb``."""
from __future__ import annotations

from collections import defaultdict

import numpy as np
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


_probe03 = {}


def _shared_probe(shape, dtype):
    """A one-warp kernel over a shared array of ``shape`` and numpy ``dtype``: lane ``l``
    reads the element numbered ``idx[l, j]`` (row idx // cols, column idx % cols) for each
    ``j`` (none where it is negative). Run under counters.trace, it gives the byte address of each lane's element,
    as the simulator records it."""
    key = (tuple(shape), dtype)
    if key not in _probe03:
        _numba_globals()
        rows, cols = shape

        @cuda.jit
        def probe(idx):
            sX = cuda.shared.array((rows, cols), dtype)
            lane = cuda.threadIdx.x
            for j in range(idx.shape[1]):
                if idx[lane, j] >= 0:
                    sX[idx[lane, j] // cols, idx[lane, j] % cols]      # the read, recorded
        _probe03[key] = probe
    return _probe03[key]


def _measured_requests(shape, dtype, elements):
    """The warp requests of one launch of :func:`_shared_probe` in which lane ``l`` reads
    ``elements[j][l]`` (a (row, col) pair, or None for a lane that reads nothing) in its
    ``j``-th read: [[Access of each lane]] in the order of ``elements``, measured by
    counters.trace."""
    from .. import counters, engines
    cols = shape[1]
    idx = torch.full((32, len(elements)), -1, dtype=torch.int64)
    for j, lanes in enumerate(elements):
        for lane, rc in enumerate(lanes):
            if rc is not None:
                idx[lane, j] = rc[0] * cols + rc[1]
    with counters.trace() as t:
        _shared_probe(shape, dtype)[1, 32](engines.as_numba(idx))
    # lane l's n-th recorded read is the n-th element given to it (a lane given None skips)
    order = {lane: [j for j, lanes in enumerate(elements) if lanes[lane] is not None]
             for lane in range(32)}
    per = [[] for _ in elements]
    for a in t.accesses:
        if a.space == "shared" and a.op == "load":
            per[order[a.lane][a.seq]].append(a)
    return per


def _measured_ways(words):
    """(ways, banks touched) of a warp whose lane ``l`` reads 4-byte word ``words[l]`` of
    shared memory, measured on a launch (counters.trace), not computed here."""
    from .. import counters
    req, = _measured_requests((32, 32), np.float32, [[divmod(w, 32) for w in words]])
    return counters.bank_ways(req), len(counters.banks_of_request(req))


def ex03_ways(request):
    """Lesson 03, exercise 1: ``request(n)``, 32 distinct words of a 32 x 32 float32 tile
    whose warp request is n-way. Its properties are looked at (32 words, distinct, inside
    the tile), then the request is run on one warp reading shared memory and its ways
    measured; a mistake is named from measured requests (the words as byte addresses, the
    banks counted, the words on 16 banks)."""
    import numbers
    lines = []
    for n in (1, 2, 4, 8, 16, 32):
        with run_answer("request"), no_package_calls("request"):
            words = request(n)
        try:
            words = list(words)
        except TypeError:
            raise ExerciseError(f"request({n}) returned {words!r}: return a list of 32 "
                                "words, one per lane") from None
        if len(words) != 32:
            raise ExerciseError(f"request({n}) returned {len(words)} words: a warp has 32 "
                                "lanes, each reading one word")
        odd = next((w for w in words if not isinstance(w, numbers.Integral)), None)
        if odd is not None:
            raise ExerciseError(f"request({n}) holds {odd!r}: a word is an int, its index in "
                                "the tile (integer division, //)")
        out = [w for w in words if not 0 <= w < 1024]
        if out:
            raise ExerciseError(f"request({n}) reads word {out[0]}, outside the 32 x 32 tile "
                                "(words 0 to 1023): a row of the tile is 32 words, so word "
                                "32 * r + c is row r, column c")
        same = [(a, b) for a in range(32) for b in range(a) if words[a] == words[b]]
        if same:
            a, b = same[0]
            raise ExerciseError(
                f"request({n}): lanes {b} and {a} both read word {words[a]}: lanes reading "
                "the same word are one broadcast, not a conflict (and the exercise asks for "
                "32 different words, as when a warp reads 32 elements of a tile)")
        got, touched = _measured_ways(words)
        if got == n:
            lines.append(f"{n}-way")
            continue
        why = None
        if all(w % 4 == 0 for w in words) and _measured_ways([w // 4 for w in words])[0] == n:
            why = ("these are byte addresses: a bank is one 4-byte word wide, and the request "
                   "is given in words (word w is bytes 4w to 4w + 3)")
        elif touched == n:
            why = (f"the ways are not the banks a request touches ({touched} here) but the "
                   "distinct words in its busiest bank")
        elif _measured_ways([32 * (w // 16) + w % 16 for w in words])[0] == n:
            why = "shared memory has 32 banks, not 16: word w is in bank w % 32"
        raise ExerciseError(
            f"request({n}): the warp's request is {got}-way, measured on a warp reading "
            f"these words ({words[:4]}...), not {n}-way.\nLikely cause: "
            + (why or f"{n} lanes must read {n} different words of one bank, and no bank may "
               f"hold more than {n} of the request's distinct words"))
    return ("request: 32 distinct words, measured on one warp: " + ", ".join(lines)
            + " as asked")


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


_DTYPES03 = {4: np.float32, 2: np.float16, 1: np.int8}


def _measured_addresses(width, pad, elem_bytes, elements):
    """{(i, k): byte address} of element (i, k) of a shared tile of 32 rows of ``width +
    pad`` elements of ``elem_bytes`` bytes, one lane per row: measured by counters.trace on
    a launch, not computed here."""
    ks = sorted({k for _, k in elements})
    rows = [[(i, k) if (i, k) in elements else None for i in range(32)] for k in ks]
    reqs = _measured_requests((32, width + pad), _DTYPES03[elem_bytes], rows)
    found = {}
    for k, req in zip(ks, reqs):
        for a in req:
            found[(a.lane, k)] = a.addr
    return found


def _bank_at(addr, nbytes=1):
    """The bank of the 4-byte word in which a shared access at byte ``addr`` starts (the
    instrument's rule: counters.banks_of_request)."""
    from .. import counters
    access = counters.Access("shared", "x", "load", (0, 0, 0), 0, 0, 0, addr, nbytes)
    return min(counters.banks_of_request([access]))


def ex03_bank(bank):
    """Lesson 03, exercise 3: the bank of element (i, k) of a shared tile whose rows are
    ``width + pad`` elements of ``elem_bytes`` bytes. The expected bank is measured: the
    simulator records the byte address of each element of a shared array of that shape and
    dtype; each mistake named is derived from measured addresses (an unpadded tile's, the
    offsets rescaled, the strides exchanged)."""
    points = [(i, k, width, pad, e) for e in (4, 2, 1) for width in (32, 8, 16, 64)
              for pad in (0, 1, 2, 4) for i in range(32)
              for k in sorted({0, 1, 3, width - 1})]
    with run_answer("bank"), no_package_calls("bank"):
        got = [bank(*p) for p in points]
    addr, plain = {}, {}                   # measured: padded tiles, and the same unpadded
    for e in (4, 2, 1):
        for width in (32, 8, 16, 64):
            elements = {(i, k) for i, k, w, _, ee in points if w == width and ee == e}
            for pad in (0, 1, 2, 4):
                got_addr = _measured_addresses(width, pad, e, elements)
                addr.update({(i, k, width, pad, e): v for (i, k), v in got_addr.items()})
            plain.update({(i, k, width, e): v for (i, k), v in
                          _measured_addresses(width, 0, e, elements).items()})
    want = [_bank_at(addr[p]) for p in points]
    if got != want:
        def row_step(p):                    # measured: bytes from row 0 to row 1, col to col
            i, k, width, pad, e = p
            return addr[(1, 0, width, pad, e)] - addr[(0, 0, width, pad, e)]

        def col_step(p):
            i, k, width, pad, e = p
            return addr[(0, 1, width, pad, e)] - addr[(0, 0, width, pad, e)]

        derived = [
            (lambda p: _bank_at(plain[(p[0], p[1], p[2], p[4])]),
             "the padding: a padded row is width + pad elements long"),
            (lambda p: _bank_at(plain[(p[0], p[1], p[2], p[4])] + p[0] * p[3]),
             "the padding counted in bytes: pad is a number of elements, each elem_bytes "
             "long, so a padded row is (width + pad) * elem_bytes bytes"),
            (lambda p: _bank_at(addr[p] // p[4] * 4),
             "the element size: offsets count elements, banks count 4-byte words (how many "
             "bytes from the start of the tile is the element?)"),
            (lambda p: _bank_at(p[1] * row_step(p) + p[0] * col_step(p)),
             "rows and columns: the tile is stored row after row (row-major): element "
             "(i, k) comes after i whole rows and k elements of its row"),
            (lambda p: (addr[p] // 4) % 16, "the number of banks: shared memory has 32 banks"),
            (lambda p: addr[p] % 32, "bytes, not words: a bank is 4 bytes wide (byte offset "
             "// 4, then % 32)"),
        ]
        why = next((w for f, w in derived if got == [f(p) for p in points]), None)
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
    from .. import counters
    ways = {}
    for e, pad in ((4, 0), (4, 1), (2, 0), (2, 1), (2, 2), (1, 0), (1, 4)):
        req, = _measured_requests((32, 32 + pad), _DTYPES03[e], [[(i, 0) for i in range(32)]])
        ways[(e, pad)] = counters.bank_ways(req)
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
