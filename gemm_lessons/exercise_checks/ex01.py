"""The checks of lesson 01 (naive kernel): ``exercises/01_*.ipynb``."""
from __future__ import annotations

from collections import defaultdict

import torch

from .. import harness
from .guards import ExerciseError, HINTS, hidden, run_answer
from .refusal import no_package_calls, refuse_package_kernel
from .products import (LaunchRecorder, bind_numba, ceil_div, check_product, launch_dims,
                       launching, sim_launch, small_suite)


_ref01 = {}


def _two_rows_k01():
    """A kernel of blocks of 32 x 8 threads in which each thread computes two elements of C,
    one above the other: thread (x, y) of block (bx, by) computes column bx * 32 + x and
    rows by * 16 + y and by * 16 + y + 8, so a block covers a 16 x 32 tile (exercise 2)."""
    if "k" not in _ref01:
        bind_numba(globals())

        @cuda.jit
        def two_rows(A, B, C):
            col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
            for half in range(2):
                row = (cuda.blockIdx.y * 2 + half) * cuda.blockDim.y + cuda.threadIdx.y
                if row < C.shape[0] and col < C.shape[1]:
                    acc = float32(0.0)
                    for k in range(A.shape[1]):
                        acc += A[row, k] * B[k, col]
                    C[row, col] = acc
        _ref01["k"] = two_rows
    return _ref01["k"]


def _thread_map(t, c, *, every=True):
    """A sentence if a thread stores C outside its block's 8 x 32 tile, or two threads the
    same element, or (``every``) an element of C is stored by none: from the trace ``t`` of
    a launch that writes ``c`` (row-major)."""
    N = c.shape[1]
    owner = {}
    for x in t.accesses:
        if x.space != "global" or x.array != "C" or x.op != "store":
            continue
        r, col = divmod((x.addr - c.data_ptr()) // c.element_size(), N)
        bx, by = x.block[0], x.block[1]
        tid = x.warp * 32 + x.lane
        if not (by * 8 <= r < by * 8 + 8 and bx * 32 <= col < bx * 32 + 32):
            return (f"thread {tid} of block (x={bx}, y={by}) stores C[{r}, {col}], outside its "
                    f"block's 8 x 32 tile (rows {by * 8}..{by * 8 + 7}, columns {bx * 32}.."
                    f"{bx * 32 + 31}): the thread map: a block's 256 threads cover its own 8 "
                    "rows and 32 columns, row from blockIdx.y * 8, col from blockIdx.x * 32, "
                    "each plus a part of t = threadIdx.x")
        if (r, col) in owner:
            other = owner[(r, col)]
            return (f"threads {other[2]} of block {other[:2]} and {tid} of block ({bx}, {by}) "
                    f"both store C[{r}, {col}]: the thread map sends two threads to one "
                    "element (and none to another): t % 32 picks one of the 32 columns, "
                    "t // 32 one of the 8 rows")
        owner[(r, col)] = (bx, by, tid)
    missing = c.shape[0] * N - len(owner)
    if missing and every:
        return (f"{missing} elements of C are stored by no thread: the thread map must give "
                "each of a block's 256 threads its own element of the 8 x 32 tile")
    return None


def ex01_kernel(kernel):
    """Lesson 01, exercise 1: a coalesced kernel with a 1-D block of 256 threads, each block
    an 8 x 32 tile of C; launched with a grid that covers C. Where each thread stores is read
    first from a trace of a launch with one block more each way (whose tile lies outside C):
    a store outside the thread's tile, or two threads on one element, is named as the thread
    map."""
    from .. import counters
    refuse_package_kernel(kernel, "my_kernel")

    def run(a, b, c, spare=0):
        M, N = c.shape
        sim_launch(kernel, (ceil_div(N, 32) + spare, ceil_div(M, 8) + spare), 256, a, b, c)

    # the lesson's point first: which element a thread computes decides the sectors touched
    # (2 x 2 blocks on C, and one more each way, whose tile lies outside C)
    a, b = harness.make_operands(16, 64, 8)
    c = torch.empty(16, 64)
    with counters.trace(A=a, B=b, C=c) as t, run_answer("my_kernel"):
        run(a, b, c, spare=1)
    wrong = _thread_map(t, c)
    if wrong and "stored by no thread" in wrong:
        # the same blocks on a C 48 rows tall: a thread whose row fell past C above now
        # stores, and where it stores is measured
        a2, b2 = harness.make_operands(48, 64, 8)
        c2 = torch.empty(48, 64)
        with counters.trace(A=a2, B=b2, C=c2) as t2, run_answer("my_kernel"):
            sim_launch(kernel, (ceil_div(64, 32) + 1, ceil_div(16, 8) + 1), 256, a2, b2, c2)
        where = _thread_map(t2, c2, every=False)
        if where:
            raise ExerciseError(f"my_kernel, M=16, N=64, K=8: {wrong.split(':')[0]}; the "
                                f"same blocks on a C of 48 rows show where they went: {where}")
    if wrong:
        raise ExerciseError(f"my_kernel, M=16, N=64, K=8: {wrong}")
    s = t.global_summary()
    if not (s["B"]["load"] <= 4 and s["C"]["store"] <= 4):
        raise ExerciseError(
            f"B loads use {s['B']['load']:.0f} and C stores {s['C']['store']:.0f} sectors per "
            "warp request (4 when coalesced): consecutive threadIdx.x must map to consecutive "
            "columns (col from the x dimension)")
    report = check_product(run, "my_kernel", cases=small_suite(
        ("square", "rectangular", "ragged", "M=1", "N=1", "K=1", "A transposed")))
    return f"{report}; B loads and C stores coalesced (4 sectors per warp request)"


def ex01_grid(launcher):
    """Lesson 01, exercise 2: the launcher of a kernel whose blocks of 32 x 8 threads cover
    16 x 32 tiles (each thread two rows), run with a correct kernel (independent of exercise
    1), which it must launch itself: a launcher that hands the work to another (the
    package's) is refused. Its block and grid are looked at before each launch, so that a
    transposed block, swapped grid axes, a grid rounded down or one block per 8 rows are
    named as such."""
    def inspect(config, args):
        grid, block = launch_dims(config[0]), launch_dims(config[1])
        M, N = args[2].shape
        if block != (32, 8, 1):
            why = ("the block is transposed: 32 threads along x (the columns, one warp), 8 "
                   "along y (the rows)" if block[:2] == (8, 32)
                   else "the kernel expects blocks of 32 x 8 threads (x: columns, y: rows)")
            raise ExerciseError(f"M={M}, N={N}: the block is {block[:2]}: {why}")
        cols, rows = _fewest01(32, N), _fewest01(16, M)
        if grid[:2] == (cols, rows) and grid[2] == 1:
            return
        if grid[:2] == (rows, cols) and rows != cols:
            why = ("the grid's axes are swapped: blockIdx.x counts the blocks along the "
                   "columns (32 columns each), blockIdx.y along the rows (16 rows each)")
        elif grid[:2] == (_fewest01(32, M), _fewest01(16, N)) and M != N:
            why = ("M and N swapped: x counts blocks of 32 columns (of N), and y blocks of 16 "
                   "rows (of M)")
        elif grid[0] == cols and grid[1] == _fewest01(8, M) and grid[1] != rows:
            why = ("one block per 8 rows, as in the lesson: here each thread computes two rows, "
                   "so a block of 8 rows of threads covers 16 rows of C, and half of these "
                   "blocks have no row of C left to compute")
        elif grid[:2] in ((N // 32, M // 16), (max(N // 32, 1), max(M // 16, 1))):
            why = ("integer division rounds down: a partial block at the edge needs a block "
                   "too")
        elif grid[0] >= cols and grid[1] >= rows and grid[2] == 1:
            why = (f"{grid[0] - cols} block(s) along x and {grid[1] - rows} along y have "
                   f"nothing to compute: {cols} blocks of 32 columns and {rows} of 16 rows "
                   "cover C; a block is added only for a partial tile at the edge (is the "
                   "extent a multiple of the tile?)")
        else:
            why = (f"{cols} blocks along x (32 columns each) and {rows} along y (16 rows each) "
                   "cover C")
        raise ExerciseError(f"M={M}, N={N}: the grid is {grid[:2]}: {HINTS['grid']}: {why}"
                            if grid[0] < cols or grid[1] < rows
                            else f"M={M}, N={N}: the grid is {grid[:2]}: {why}")

    kernel = LaunchRecorder(_two_rows_k01(), inspect)

    run = launching(launcher, kernel)

    report = check_product(run, "my_launcher", cases=small_suite(
        ("square", "rectangular", "ragged", "M=1", "N=1", "K=1")))
    return str(report)


def _fewest01(size, extent):
    """The fewest blocks ``size`` long that together cover ``extent`` (found by counting)."""
    return next(k for k in range(1, max(extent, 1) + 1) if k * size >= extent)


_read01 = {}


def _lane_addresses(x, row, col0, cols=None):
    """The byte addresses the simulator records when lane l of a warp reads
    ``x[row, col0 + l]``, for the lanes whose column is below ``cols`` (x's columns unless
    given): measured by counters.trace on a launch, not computed here."""
    from .. import counters, engines
    if "k" not in _read01:
        bind_numba(globals())

        @cuda.jit
        def read_row(X, r, c0, ncols, out):
            lane = cuda.threadIdx.x
            if c0 + lane < ncols:
                out[lane] = X[r, c0 + lane]
        _read01["k"] = read_row
    out = torch.zeros(32, dtype=x.dtype)
    with counters.trace(X=x) as t:
        _read01["k"][1, 32](engines.as_numba(x), row, col0,
                            x.shape[1] if cols is None else cols, engines.as_numba(out))
    return [a.addr for a in sorted((a for a in t.accesses if a.space == "global"
                                    and a.op == "load"), key=lambda a: a.lane)]


def _sectors(addrs, nbytes, sector=32):
    """Distinct ``sector``-byte sectors among requests of ``nbytes`` at ``addrs``: counted
    both ways a learner may (first byte only, or first and last)."""
    first = len({p // sector for p in addrs})
    both = len({q // sector for p in addrs for q in (p, p + nbytes - 1)})
    return {first, both}


def _sectors_truth(x, row, col0):
    """Sectors of the request ``x[row, col0 + lane]`` (lane 0..31), from the addresses the
    simulator records."""
    from ..counters import Access, sectors_per_request
    e = x.element_size()
    return sectors_per_request([Access("global", "x", "load", (0, 0, 0), 0, 0, 0, p, e)
                                for p in _lane_addresses(x, row, col0)])


def _sectors_mistaken(x, row, col0, mistake):
    """The sectors a typical mistake gives (a set: counted from first bytes, or first and
    last), derived from the measured addresses: another view's, the offsets scaled, the
    lanes past the edge kept."""
    e, p0 = x.element_size(), x.data_ptr()
    if mistake == "row-major":                       # the strides ignored
        y = x.contiguous()
        addrs = [p - y.data_ptr() + p0 for p in _lane_addresses(y, row, col0)]
    elif mistake == "swapped":                       # a row step for a column step
        if x.shape[0] < min(col0 + 32, x.shape[1]) or x.shape[1] <= row:
            return set()
        addrs = _lane_addresses(x.t(), row, col0, cols=x.shape[1])
    elif mistake == "no base":
        addrs = [p - p0 for p in _lane_addresses(x, row, col0)]
    elif mistake in ("elements", "four bytes"):
        scale = 1 if mistake == "elements" else 4
        addrs = [p0 + (p - p0) // e * scale for p in _lane_addresses(x, row, col0)]
        return _sectors(addrs, scale) | _sectors(addrs, e)
    elif mistake in ("no guard", "one past"):
        addrs = _lane_addresses(x, row, col0)
        if len(addrs) < 2 or len(addrs) == 32:
            return set()
        step = addrs[1] - addrs[0]
        extra = 32 - len(addrs) if mistake == "no guard" else 1
        addrs = addrs + [addrs[-1] + step * (i + 1) for i in range(extra)]
    elif mistake == "lines":
        return _sectors(_lane_addresses(x, row, col0), e, sector=128)
    return _sectors(addrs, e)


def _sector_cases():
    """(description, tensor view, row, col0): the views a kernel meets."""
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(64, 64, generator=gen)
    return [
        ("a row-major float32 matrix", base, 3, 0),
        ("a row-major float32 matrix, from column 32", base, 5, 32),
        ("a transposed view (x = base.t())", base.t(), 3, 0),
        ("a float16 matrix", base.half(), 2, 0),
        ("a float64 matrix", base.double(), 2, 0),
        ("a view that starts 3 columns in (x = base[:, 3:])", base[:, 3:], 0, 0),
        ("every other column (x = base[:, ::2])", base[:, ::2], 1, 0),
        ("a matrix of 40 columns, from column 32 (8 lanes in C)",
         torch.randn(64, 40, generator=gen), 1, 32),
    ]


def ex01_sectors(warp_sectors):
    """Lesson 01, exercise 3: the 32-byte sectors a warp's request ``x[row, col0 + lane]``
    touches, from the view's strides, element size and address."""
    mistakes = [
        ("row-major", "the strides: a transposed or sliced view is not row-major; how many "
         "elements apart its rows and its columns are is x.stride()"),
        ("swapped", "the strides swapped: x.stride(0) is the step from one row to the next, "
         "x.stride(1) from one column to the next, and the lanes walk along a row"),
        ("four bytes", "the element size: offsets count elements, addresses count bytes "
         "(x.element_size() bytes per element, not always 4)"),
        ("elements", "the element size: offsets count elements, addresses count bytes "
         "(multiply by x.element_size())"),
        ("no base", "where the view starts: a slice begins x.storage_offset() elements into "
         "its storage; x.data_ptr() is its first element's byte address, and sectors are "
         "counted from address 0"),
        ("no guard", "lanes past the last column: they fail the kernel's bounds check and "
         "read nothing"),
        ("one past", "the bound is off by one: the last column of x is x.shape[1] - 1, a lane "
         "whose column is x.shape[1] reads nothing"),
        ("lines", "the sector size: a request is served in 32-byte sectors, not 128-byte "
         "lines"),
    ]
    cases = _sector_cases()
    with run_answer("warp_sectors"), no_package_calls("warp_sectors"), hidden(_read01):
        got = [warp_sectors(x, row, col0) for _, x, row, col0 in cases]
    want = [_sectors_truth(x, row, col0) for _, x, row, col0 in cases]
    if got != want:
        # the mistake that gives the learner's answer on every view it changes
        def fits(mistake):
            told = [_sectors_mistaken(x, r, c0, mistake) for _, x, r, c0 in cases]
            return all((g in t) if t else g == w for g, t, w in zip(got, told, want)) and any(
                t and g not in (w,) for g, t, w in zip(got, told, want))
        def exact(mistake):                 # views it explains with one count, not two
            return sum(t == {g} and g != w for g, t, w in zip(
                got, [_sectors_mistaken(x, r, c0, mistake) for _, x, r, c0 in cases], want))
        # where two mistakes fit (both depend on where the view starts), the one that
        # explains more views exactly
        fitting = [(m, w) for m, w in mistakes if fits(m)]
        fitting.sort(key=lambda mw: -exact(mw[0]))
        why = next((w for m, w in fitting),
                   "the byte address of each lane's element (the view's first element, its "
                   "strides, its element size), then the distinct 32-byte sectors among the "
                   "lanes whose column is inside x")
        j = next(n for n, (g, w) in enumerate(zip(got, want)) if g != w)
        what, x, row, col0 = cases[j]
        raise ExerciseError(
            f"{what} (strides {tuple(x.stride())}, {x.element_size()}-byte elements), row "
            f"{row}, columns from {col0}: got {got[j]!r} sectors, expected {want[j]}.\n"
            f"Likely cause: {why}")
    return (f"warp_sectors: right on {len(cases)} views (row-major float32 {want[0]} sectors, "
            f"transposed {want[2]}, float16 {want[3]}, starting 3 columns in {want[5]})")


_traffic_cache = {}


def _measured_traffic(kernel, M, N, K):
    """{("A", "load"): bytes, ...}: the sectors a launch of the registered lesson-01 kernel
    requests, measured with counters.trace, times 32 bytes."""
    key = (kernel, M, N, K)
    if key not in _traffic_cache:
        from .. import counters
        from ..kernels import k01_naive
        launch = {"k01_naive": k01_naive.naive, "k01_coalesced": k01_naive.coalesced}[kernel]
        a, b = harness.make_operands(M, N, K)
        c = torch.empty(M, N)
        with counters.trace(A=a, B=b, C=c) as t:
            launch(a, b, c)
        per, requests = defaultdict(int), defaultdict(int)
        for (space, arr, op, *_), req in t.requests("global").items():
            per[(arr, op)] += counters.sectors_per_request(req) * counters.SECTOR_BYTES
            requests[(arr, op)] += 1
        _traffic_cache[key] = dict(per)
        _traffic_cache[key + ("requests",)] = dict(requests)
    return _traffic_cache[key]


def _one_operand_off(nbytes, kernel, M, N, K):
    """(array, sectors per request in the learner's count, measured) when ``nbytes``
    differs from the measured traffic in the loads of one operand only, by a whole number
    of sectors per warp request of that operand (requests counted in the trace)."""
    m = _measured_traffic(kernel, M, N, K)
    requests = _traffic_cache[(kernel, M, N, K, "requests")]
    for arr, other in (("B", "A"), ("A", "B")):
        rest = nbytes - m[(other, "load")] - m[("C", "store")]
        n = requests[(arr, "load")]
        if rest > 0 and rest != m[(arr, "load")] and rest % (32 * n) == 0:
            return arr, rest // (32 * n), m[(arr, "load")] // (32 * n)
    return None


def ex01_traffic(traffic):
    """Lesson 01, exercise 4: the flops and the bytes requested (sectors x 32) of a launch of
    ``k01_naive`` and ``k01_coalesced``, checked against the simulator's count."""
    lines = []
    for kernel, other in (("k01_coalesced", "k01_naive"), ("k01_naive", "k01_coalesced")):
        for M, N, K in ((64, 32, 8), (32, 64, 9)):
            with run_answer("traffic"), no_package_calls("traffic"), hidden(_traffic_cache):
                got = traffic(kernel, M, N, K)
            if not (isinstance(got, (tuple, list)) and len(got) == 2):
                raise ExerciseError(f"traffic({kernel!r}, {M}, {N}, {K}) returned {got!r}: "
                                    "return a pair (flops, bytes)")
            flops, nbytes = got
            where = f"{kernel}, M={M}, N={N}, K={K}"
            if flops != 2 * M * N * K:
                why = ("a multiply-add is 2 flops" if flops == M * N * K else
                       "every element of C is a dot product of length K")
                raise ExerciseError(f"{where}: {flops!r} flops, expected {2 * M * N * K}: {why}")
            m = _measured_traffic(kernel, M, N, K)
            want = sum(m.values())
            if nbytes == want:
                continue
            mo = sum(_measured_traffic(other, M, N, K).values())
            useful = 4 * (2 * M * N * K + M * N)
            if nbytes == want // 32:
                why = "that is the number of sectors: each sector is 32 bytes"
            elif nbytes * 8 == want:
                why = ("the sectors times 4: a sector is 32 bytes (4 is the bytes of one "
                       "float32, not of what a request moves)")
            elif nbytes == m[("A", "load")] + m[("B", "load")]:
                why = "the stores of C are warp requests too (one per warp, at the end)"
            elif nbytes == mo:
                why = (f"that is {other}'s traffic: in {kernel} consecutive threadIdx.x are "
                       f"consecutive {'columns' if kernel == 'k01_coalesced' else 'rows'}")
            elif nbytes == useful:
                why = ("those are the bytes the lanes use; a request moves whole 32-byte "
                       "sectors, however few of their bytes a lane needs")
            elif nbytes == 32 * want:
                why = ("one request per thread: the 32 threads of a warp make one request "
                       "together (M * N / 32 warps, not M * N threads)")
            elif (part := _one_operand_off(nbytes, kernel, M, N, K)) is not None:
                arr, per_k, measured = part
                why = (f"the loads of {arr}: your count gives {per_k} sector(s) per warp "
                       f"request of {arr} (one request per warp and per k), the simulator "
                       f"measures {measured}: which 32-byte sectors do the addresses of the "
                       f"32 lanes' elements of {arr} touch, in this kernel's thread map?")
            else:
                why = "count per warp and per k the sectors of A and of B, then the store of C"
            raise ExerciseError(
                f"{where}: {nbytes!r} bytes, the simulator counts {want} (A loads "
                f"{m[('A', 'load')]}, B loads {m[('B', 'load')]}, C stores "
                f"{m[('C', 'store')]}).\nLikely cause: {why}")
        lines.append(f"{kernel} {2 * M * N * K / want:.2f}")
    return ("traffic: flops and bytes right for both kernels; flops per requested byte at "
            f"M={M}, N={N}, K={K}: " + ", ".join(lines))
