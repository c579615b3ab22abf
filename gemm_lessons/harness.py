"""One harness for every kernel: seeded inputs, a float64 reference, NaN-poisoned outputs,
the shape suite, failure messages a learner can act on, and the benchmark against cuBLAS.

Checks always run before timings (:func:`bench` refuses an unchecked kernel only in the
sense that the CLI and notebooks call :func:`check` first; the functions stay separate so
that each can be read on its own).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import torch

from . import engines as _backend
from . import registry
from .common import dtype_name

__all__ = ["TOLERANCE", "Case", "shape_suite", "make_operands", "reference", "compare", "time_cuda_many",
           "CheckError", "CheckReport", "check", "check_alpha_beta", "BenchResult", "bench", "time_cuda",
           "time_cuda_pair",
           "cublas_matmul", "tflops"]

# Relative error ||C - ref|| / ||ref|| allowed per input dtype, and the per-element bound
# |C - ref| <= tol * (|A| @ |B|) (the natural scale of a dot product's rounding error).
# fp32 SIMT kernels land near 1e-7 to 1e-6; fp16 and bf16 kernels accumulate in fp32 and
# round the output to the input dtype: 2**-11 (fp16) and 2**-8 (bf16) per element at most.
# FP8 kernels (lesson 11) return an FP8 C from gl.matmul: 2**-4 (e4m3) and 2**-3 (e5m2).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2,
             torch.float8_e4m3fn: 7e-2, torch.float8_e5m2: 1.3e-1}


@dataclass(frozen=True)
class Case:
    """One shape of the suite. ``a``/``b`` say how the operand is laid out in memory:
    ``row`` (contiguous), ``transposed`` (a transposed view: column-major) or ``sliced``
    (a column slice of a wider tensor: row stride larger than the width, offset storage)."""
    name: str
    M: int
    N: int
    K: int
    a: str = "row"
    b: str = "row"
    hint: str = ""

    def __str__(self):
        lay = "" if self.a == self.b == "row" else f", A {self.a}, B {self.b}"
        return f"{self.name} (M={self.M}, N={self.N}, K={self.K}{lay})"


def shape_suite(gpu: bool | None = None) -> list[Case]:
    """The shapes every kernel must get right. Small on the simulator, larger on a GPU,
    with dimensions that are multiples of no tile size (odd), 1s, and strided operands."""
    if gpu is None:
        gpu = _backend.on_gpu()
    K_hint = "a K loop that reads past K: loads beyond K must read 0 (a missing K mask)"
    edge = "a boundary tile: stores outside M x N must be masked, partial tiles still written"
    stride = ("the kernel assumes a contiguous operand: index with the tensor's strides "
              "(or let the launcher copy), and do not assume 16-byte alignment")
    # (M, N, K) on the simulator, and on a GPU (larger: many blocks, every tile boundary)
    sizes = {
        "square":       ((32, 32, 32), (512, 512, 512)),
        "rectangular":  ((48, 16, 40), (768, 256, 640)),
        "ragged":       ((37, 45, 29), (597, 723, 469)),
        "M=1":          ((1, 41, 25), (1, 643, 385)),
        "N=1":          ((41, 1, 25), (643, 1, 385)),
        "K=1":          ((25, 41, 1), (385, 643, 1)),
        "A transposed": ((33, 24, 23), (528, 384, 323)),
        "B transposed": ((25, 33, 20), (385, 528, 320)),
        "sliced":       ((31, 27, 25), (482, 417, 355)),
    }
    hints = {"square": "the basic indexing of A, B or C",
             "rectangular": "M, N and K swapped somewhere (a square shape hides it)",
             "ragged": edge + "; or " + K_hint, "M=1": edge, "N=1": edge, "K=1": K_hint,
             "A transposed": stride, "B transposed": stride, "sliced": stride}
    layouts = {"A transposed": ("transposed", "row"), "B transposed": ("row", "transposed"),
               "sliced": ("sliced", "sliced")}
    return [Case(name, *dims[1 if gpu else 0], *layouts.get(name, ("row", "row")),
                 hint=hints[name]) for name, dims in sizes.items()]


def _operand(rows, cols, layout, dtype, gen, device):
    # Random normal values, never zeros, drawn in float32 on the CPU so that every engine
    # and device sees the same numbers for a seed, then rounded to the dtype under test.
    if layout == "row":
        return torch.randn(rows, cols, generator=gen).to(dtype).to(device)
    if layout == "transposed":   # column-major: a transposed view of a (cols, rows) tensor
        return torch.randn(cols, rows, generator=gen).to(dtype).to(device).t()
    if layout == "sliced":       # row stride cols + 3, storage offset cols + 4: unaligned
        big = torch.randn(rows + 2, cols + 3, generator=gen).to(dtype).to(device)
        return big[1:1 + rows, 1:1 + cols]
    raise ValueError(f"unknown layout {layout!r}: use 'row', 'transposed' or 'sliced'")


def make_operands(M, N, K, dtype=torch.float32, *, seed=0, a="row", b="row", device=None):
    """Seeded random A (M x K) and B (K x N) in ``dtype`` on ``device`` (default: the
    engine's), laid out as asked ("row", "transposed" or "sliced")."""
    device = _backend.device() if device is None else device
    gen = torch.Generator().manual_seed(seed)
    return (_operand(M, K, a, dtype, gen, device), _operand(K, N, b, dtype, gen, device))


def reference(a, b):
    """A @ B in float64, from the same (already rounded) inputs, on their device."""
    return a.double() @ b.double()


def compare(c, ref, a, b, dtype):
    """(ok, relative error, mask of wrong elements) of ``c`` against ``ref``."""
    tol = TOLERANCE[dtype]
    c64 = c.double()
    diff = (c64 - ref).abs()
    scale = a.double().abs() @ b.double().abs()
    # below the smallest normal number, fp16 keeps a fixed absolute step (2**-24): rounding a
    # tiny result to the output dtype may cost up to that much, whatever its relative size
    finfo = torch.finfo(dtype)
    floor = finfo.tiny * finfo.eps
    bad = ~(diff <= tol * scale + floor)  # NaN compares False: unwritten elements are bad
    ref_norm = ref.norm().item()
    err_norm = (c64 - ref).norm().item()
    rel = err_norm / (ref_norm if ref_norm > 0 else 1.0)
    ok = (not bool(bad.any()) and math.isfinite(rel)
          and err_norm <= tol * ref_norm + floor * math.sqrt(ref.numel()))
    return ok, rel, bad


def check_alpha_beta(kernel, dtype, M, N, K, *, seed=5):
    """BLAS's epilogue contract for a registered kernel with a ``gemm`` hook (what
    ``gl.gemm`` launches): returns (relative error of ``0.5 * A @ B - 2 * C`` against
    float64, whether ``beta == 0`` ignored a C full of NaN, whether ``alpha == 0`` ignored
    an A full of NaN and returned exactly C)."""
    entry = registry.get(kernel)
    gen = torch.Generator().manual_seed(seed)
    dev = _backend.device()
    a, b, c = (torch.randn(*s, generator=gen).to(dtype).to(dev)
               for s in ((M, K), (K, N), (M, N)))

    def gemm(a, b, c, alpha, beta):
        out = torch.full((1, M, N), float("nan"), dtype=dtype, device=dev)
        entry.gemm(a[None], b[None], c[None], out, alpha, beta, None, None)
        return out[0]
    out = gemm(a, b, c, 0.5, -2.0)
    ref = 0.5 * (a.double() @ b.double()) - 2.0 * c.double()
    rel = compare(out, ref, a, b, dtype)[1]
    nan_c = torch.full_like(c, float("nan"))
    beta0 = bool(torch.isfinite(gemm(a, b, nan_c, 1.0, 0.0)).all())
    nan_a = torch.full_like(a, float("nan"))
    alpha0 = torch.equal(gemm(nan_a, b, c, 0.0, 1.0), c)
    return rel, beta0, alpha0


class CheckError(AssertionError):
    """A kernel computed a wrong product; the message shows where and a likely cause."""


def _diagnose(c, bad, case: Case, name, dtype, rel):
    M, N = c.shape
    nbad = int(bad.sum())
    lines = [f"{name} is wrong on {case}, {dtype_name(dtype)}: "
             f"{nbad} of {M * N} elements wrong, relative error {rel:.1e} "
             f"(tolerance {TOLERANCE[dtype]:.0e})"]
    idx = bad.nonzero()[:10].tolist()
    return lines, idx


def _cause(c, bad, case):
    nan = torch.isnan(c)
    M, N = c.shape
    if bool(nan.all()):
        return ("nothing was written to C (all still NaN): is the kernel launched with a "
                "grid that covers C, and does it store its result?")
    if bool(nan.any()):
        rows = nan.all(dim=1).nonzero().flatten().tolist()   # rows never written at all
        cols = nan.all(dim=0).nonzero().flatten().tolist()
        where = []
        if rows:
            where.append(f"rows {rows[0]}..{rows[-1]}" if len(rows) > 1 else f"row {rows[0]}")
        if cols:
            where.append(f"columns {cols[0]}..{cols[-1]}" if len(cols) > 1 else f"column {cols[0]}")
        span = " and ".join(where) if where else "scattered elements"
        return (f"{int(nan.sum())} elements were never written (still NaN: {span}): the grid "
                "is too small (round the block count up: ceil(M / BM)) or a store mask is "
                "too strict")
    if not bool(torch.isfinite(c).all()):
        return "inf in C: a load read memory outside the operand (a missing mask)"
    return case.hint or "compare your indexing with the reference, element by element"


def _failure_message(name, case, dtype, c, ref, bad, rel):
    lines, idx = _diagnose(c, bad, case, name, dtype, rel)
    for i, j in idx:
        lines.append(f"  C[{i}, {j}] = {c[i, j].item():.6g}, expected {ref[i, j].item():.6g}")
    if int(bad.sum()) > len(idx):
        lines.append(f"  ... and {int(bad.sum()) - len(idx)} more")
    lines.append("Likely cause: " + _cause(c, bad, case))
    return "\n".join(lines)


@dataclass
class CheckReport:
    """What :func:`check` found: one row per (case, dtype)."""
    kernel: str
    rows: list = field(default_factory=list)   # (case, dtype, ok, rel_err)

    @property
    def ok(self):
        return all(r[2] for r in self.rows)

    @property
    def n_shapes(self):
        return len({r[0].name for r in self.rows})

    def __str__(self):
        dts = sorted({dtype_name(r[1]) for r in self.rows})
        if self.ok:
            return f"{self.kernel}: correct on {self.n_shapes} shapes ({', '.join(dts)})"
        bad = [f"{r[0].name} {dtype_name(r[1])}" for r in self.rows if not r[2]]
        return f"{self.kernel}: WRONG on {len(bad)} cases: {', '.join(bad)}"


def check(run, name, dtypes=(torch.float32,), cases=None, *, seed=0, raise_on_fail=True,
          progress=None):
    """Run ``run(a, b, out)`` on every case of the shape suite and every dtype.

    ``out`` arrives filled with NaN, so an element the kernel never writes fails. Each
    product is compared with the float64 reference of the same inputs. Raises
    :class:`CheckError` (message: the case, the first wrong elements, a likely cause) on the
    first failure unless ``raise_on_fail`` is False.
    """
    cases = shape_suite() if cases is None else cases
    report = CheckReport(name)
    for case in cases:
        for dtype in dtypes:
            a, b = make_operands(case.M, case.N, case.K, dtype, seed=seed, a=case.a, b=case.b)
            out = torch.full((case.M, case.N), float("nan"), dtype=dtype, device=a.device)
            run(a, b, out)
            if a.is_cuda:
                torch.cuda.synchronize()
            ref = reference(a, b)
            ok, rel, bad = compare(out, ref, a, b, dtype)
            report.rows.append((case, dtype, ok, rel))
            if progress is not None:
                progress()
            if not ok and raise_on_fail:
                raise CheckError(_failure_message(name, case, dtype, out.cpu(), ref.cpu(),
                                                  bad.cpu(), rel))
    return report


# ---------------------------------------------------------------------------- benchmark
def tflops(M, N, K, ms):
    return 2.0 * M * N * K / (ms * 1e-3) / 1e12


def _batch_size(fn, min_batch_ms):
    """Calls per timed batch so that one batch lasts about ``min_batch_ms``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    return max(1, min(1000, int(min_batch_ms / one)))


def _time_batch(fn, inner):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(inner):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / inner


def time_cuda(fn, *, min_batch_ms=20.0, batches=15, warmup=2):
    """Median milliseconds per call of ``fn()``, timed with CUDA events.

    Calls are timed in batches that each last about ``min_batch_ms`` (so the host's launch
    cost overlaps the GPU's work, as in a real program), after ``warmup`` calls that keep
    compilation and autotuning out of the numbers.
    """
    return time_cuda_pair(fn, None, min_batch_ms=min_batch_ms, batches=batches,
                          warmup=warmup)[0]


def time_cuda_pair(fn, ref, *, min_batch_ms=20.0, batches=15, warmup=2, graph=False):
    """Median milliseconds per call of ``fn()`` and of ``ref()`` (or None), their batches
    *interleaved*: fn, ref, fn, ref, ... A GPU's clock drifts with its temperature over a
    run; timing the two side by side gives both the same conditions, so their ratio is fair
    (timing all of one and then all of the other lets the drift pass for a speed-up)."""
    fns = {"fn": fn} if ref is None else {"fn": fn, "ref": ref}
    ms = time_cuda_many(fns, min_batch_ms=min_batch_ms, batches=batches, warmup=warmup,
                        graph=graph)
    return ms["fn"], ms.get("ref")


def cuda_graph_of(fn, calls):
    """A CUDA graph of ``calls`` calls of ``fn`` (``torch.cuda.CUDAGraph``): one ``replay()``
    queues them all with one host call, so the GPU runs them back to back without waiting
    for Python. Call ``fn`` once before (compilation, autotuning and workspace allocation
    cannot happen inside a capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):      # capture needs the work of its stream settled
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except Exception as e:      # noqa: BLE001  (re-raised with what failed)
        raise RuntimeError(f"could not capture {fn!r} in a CUDA graph (a call that "
                           f"synchronizes or allocates outside torch cannot be captured): "
                           f"{e}") from e
    torch.cuda.synchronize()
    return graph


def time_cuda_many(fns, *, min_batch_ms=20.0, batches=15, warmup=2, graph=False):
    """{name: median milliseconds per call} of every callable in ``fns`` (a dict), their
    batches interleaved round-robin, as :func:`time_cuda_pair` does for two.

    ``graph=True`` times the GPU alone: each callable's batch is captured once in a CUDA
    graph (:func:`cuda_graph_of`) and the batches are graph replays, so the host's cost per
    call (Python, argument binding, the driver's launch) is out of the figure, for every
    callable alike. Without it a call costs max(host, GPU): on a small product the host."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    torch.cuda.synchronize()
    inner = {k: _batch_size(f, min_batch_ms) for k, f in fns.items()}
    if graph:
        graphs = {k: cuda_graph_of(f, inner[k]) for k, f in fns.items()}
        fns = {k: g.replay for k, g in graphs.items()}
        calls, inner = inner, {k: 1 for k in fns}
    per_call = {k: [] for k in fns}
    for _ in range(batches):
        for k, f in fns.items():
            ms = _time_batch(f, inner[k])
            per_call[k].append(ms / calls[k] if graph else ms)
    return {k: statistics.median(v) for k, v in per_call.items()}


class _fp32_ieee:
    """cuBLAS in true fp32 (TF32 off) inside the block, whatever the global setting."""

    def __enter__(self):
        m = torch.backends.cuda.matmul
        self.saved = m.allow_tf32
        m.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.saved


def cublas_matmul(a, b, out):
    """The baseline: torch.matmul (cuBLAS) of the same precision, TF32 off for fp32."""
    with _fp32_ieee():
        return torch.matmul(a, b, out=out)


@dataclass
class BenchResult:
    kernel: str
    dtype: torch.dtype
    M: int
    N: int
    K: int
    ms: float | None = None
    baseline_ms: float | None = None
    baseline: str = "cuBLAS"
    note: str = ""

    @property
    def tflops(self):
        return None if self.ms is None else tflops(self.M, self.N, self.K, self.ms)

    @property
    def baseline_tflops(self):
        return None if self.baseline_ms is None else tflops(self.M, self.N, self.K, self.baseline_ms)

    @property
    def ratio(self):
        """Speed relative to the baseline (>1: faster than cuBLAS)."""
        if self.ms is None or self.baseline_ms is None:
            return None
        return self.baseline_ms / self.ms

    def __str__(self):
        dt = dtype_name(self.dtype)
        if self.ms is None:
            return f"{self.kernel} {dt} {self.M}x{self.N}x{self.K}: not timed ({self.note})"
        return (f"{self.kernel} {dt} {self.M}x{self.N}x{self.K}: {self.ms:.3f} ms, "
                f"{self.tflops:.1f} TFLOP/s; {self.baseline} {self.baseline_tflops:.1f} "
                f"TFLOP/s; ratio {self.ratio:.2f}x")


SIMULATOR_NOTE = ("timings need a GPU: on the CPU, numba's simulator runs each CUDA thread as "
                  "a Python thread and Triton's interpreter runs each program with NumPy, so "
                  "their times say nothing about the kernel")


def bench(run, name, M, N=None, K=None, dtype=torch.float32, *, seed=0, baseline=True,
          graph=False):
    """Time ``run(a, b, out)`` on an M x N x K product and, in the same call, cuBLAS of the
    same precision. Returns a :class:`BenchResult`; on the simulator nothing is timed.
    ``graph=True``: GPU time only, both sides replayed from CUDA graphs
    (:func:`time_cuda_many`)."""
    N = M if N is None else N
    K = M if K is None else K
    res = BenchResult(name, dtype, M, N, K)
    if not _backend.on_gpu():
        res.note = SIMULATOR_NOTE
        return res
    a, b = make_operands(M, N, K, dtype, seed=seed)
    out = torch.empty(M, N, dtype=dtype, device=a.device)
    ref_out = torch.empty_like(out)
    res.ms, res.baseline_ms = time_cuda_pair(
        lambda: run(a, b, out), (lambda: cublas_matmul(a, b, ref_out)) if baseline else None,
        graph=graph)
    return res
