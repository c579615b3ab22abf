"""The checks of lesson 09 (fused epilogue): ``exercises/09_*.ipynb``."""
from __future__ import annotations

import contextlib

import torch

from .. import engines
from .guards import ExerciseError, HINTS, run_answer
from .products import ceil_div, check_product, small_suite
from .refusal import no_package_calls, refuse_package_helpers, refuse_package_kernel


def _close(out, ref, tol=2e-3):
    return bool(((out.double() - ref).abs() <= tol * (ref.abs() + 1)).all())


def _rand(gen, *shape, dev=None):
    dev = engines.device() if dev is None else dev
    return torch.randn(*shape, generator=gen).to(torch.float16).to(dev)


class _Counted:
    """Stands for a Triton kernel in the learner's namespace and counts its launches."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.launches = 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]

    def __getattr__(self, name):
        return getattr(self.kernel, name)


@contextlib.contextmanager
def _launch_counted(my_gemm, name="my_gemm_kernel"):
    """Inside the block, ``name`` in ``my_gemm``'s globals counts its launches (``launches``
    of the object yielded; none where there is no such kernel)."""
    space = getattr(my_gemm, "__globals__", {})
    kernel = space.get(name)
    counted = _Counted(kernel)
    if kernel is None:
        yield counted
        return
    space[name] = counted
    try:
        yield counted
    finally:
        space[name] = kernel


def ex09_epilogue(my_gemm):
    """Lesson 09, exercise 1: the fused epilogue with BLAS's beta == 0 rule and a bias per
    row of C."""
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(0)
    a, b, c, bias = _rand(gen, 37, 45), _rand(gen, 45, 29), _rand(gen, 37, 29), _rand(gen, 37)
    nan_c = torch.full_like(c, float("nan"))
    kernel = my_gemm.__globals__.get("my_gemm_kernel") if hasattr(my_gemm, "__globals__") else None
    if kernel is not None:
        refuse_package_kernel(kernel, "my_gemm_kernel")
        refuse_package_helpers(kernel, "my_gemm_kernel")
    with run_answer("my_gemm"), _launch_counted(my_gemm) as seen, \
            no_package_calls("my_gemm", allowed=(_Counted.__getitem__,)):
        out = my_gemm(a, b, nan_c, beta=0.0, bias=bias, gelu=True)
    if not seen.launches:
        raise ExerciseError("my_gemm computed its result without launching my_gemm_kernel: the "
                            "exercise is the kernel's epilogue, on the fp32 tile in registers "
                            "(keep the launcher as given and write the epilogue in the kernel)")
    if bool(out.isnan().any()):
        raise ExerciseError("NaN in C reached the output although beta == 0: read C only under "
                            "`if HAS_C:` (0 * NaN is NaN, so multiplying by beta is not enough)")
    report = check_product(lambda a, b, out: my_gemm(a, b, out=out), "my_gemm", (torch.float16,),
                           small_suite(("square", "ragged", "M=1", "K=1")))
    ab = a.double() @ b.double()
    cases = [
        (0.5, 0.0, False, False, "alpha: multiply the accumulator by alpha"),
        (1.0, -2.0, False, False, "beta: under `if HAS_C:` load the C tile (with `mask`) and add beta times it"),
        (1.0, 0.0, True, False, "the bias: under `if HAS_BIAS:` load the tile's BLOCK_M bias "
                                "values (one per row, masked on M) and add each to its row, "
                                "broadcast across the columns"),
        (1.0, 0.0, True, True, "gelu: under `if GELU:` x = 0.5 * x * (1 + erf(x / sqrt(2))), after the bias"),
        (0.5, 1.5, True, True, "the order: alpha * acc, + beta * C, + bias, then gelu")]
    for alpha, beta, use_bias, gelu, hint in cases:
        ref = alpha * ab + beta * c.double() + (bias.double()[:, None] if use_bias else 0)
        ref = F.gelu(ref) if gelu else ref
        with run_answer("my_gemm"):
            out = my_gemm(a, b, c, alpha=alpha, beta=beta, bias=bias if use_bias else None, gelu=gelu)
        if not _close(out, ref):
            err = (out.double() - ref).abs().max().item()
            raise ExerciseError(f"alpha={alpha}, beta={beta}, bias={use_bias}, gelu={gelu}: wrong "
                                f"(largest error {err:.3g}). Likely cause: {hint}")
    return f"{report}; alpha, beta * C, bias and gelu right; beta == 0 never reads C"


def ex09_batch(bias_as_c):
    """Lesson 09, exercise 2: a bias (one value per column, or per row) as the addend C of a
    batched GEMM, broadcast with stride 0: no copy."""
    gen = torch.Generator().manual_seed(1)
    B, M, K, N = 5, 40, 24, 36
    x, W = _rand(gen, B, M, K), _rand(gen, K, N)
    col, row = _rand(gen, N), _rand(gen, M)
    strided = _rand(gen, 2 * N)[::2]                # a bias whose elements are 2 apart
    cases = [("a bias per column", col, False, (0, 0, 1)),
             ("a bias per row", row, True, (0, 1, 0)),
             ("a bias per column, every second element of a buffer", strided, False, (0, 0, 2))]
    views = {}
    for what, bias, per_row, strides in cases:
        for batch in (B, 1):
            with run_answer("bias_as_c", seconds=10), no_package_calls("bias_as_c"):
                try:
                    got = bias_as_c(bias, batch, M, N, per_row)
                except RuntimeError as e:
                    if "expand" in str(e) or "size" in str(e):
                        raise ExerciseError(
                            f"{what} ({bias.shape[0]} values), B = {batch}, M = {M}, N = {N}: "
                            f"{type(e).__name__}: {e}. Likely cause: the bias's dimension: a "
                            "bias per row has M values and runs down the rows (a (1, M, 1) "
                            "view), a bias per column N values along the columns "
                            "(1, 1, N)") from None
                    raise
            where = f"{what}, B = {batch}"
            if tuple(got.shape) != (batch, M, N):
                raise ExerciseError(f"{where}: shape {tuple(got.shape)}, not {(batch, M, N)}")
            want_strides = (0 if batch > 1 else got.stride(0),) + strides[1:]
            if got.data_ptr() != bias.data_ptr() or got.stride()[1:] != strides[1:] or (
                    batch > 1 and got.stride(0) != 0):
                raise ExerciseError(
                    f"{where}: strides {got.stride()}, expected {want_strides} on the bias's "
                    "own memory: a copy (repeat and contiguous copy; expand and indexing with "
                    "None make views), or the bias laid along the wrong dimension")
            index = (torch.arange(M).repeat_interleave(N) if per_row
                     else torch.arange(N).repeat(M))          # bias[m] or bias[n], row-major
            if not torch.equal(got.reshape(batch, M * N), bias[index].expand(batch, M * N)):
                raise ExerciseError(f"{where}: the values are not the bias's: element (b, m, n) "
                                    "is bias[m] for a bias per row, bias[n] per column")
            views[what, batch] = got
    from ..kernels import k09_fused_epilogue as k09
    out = torch.full((B, M, N), float("nan"), dtype=torch.float16, device=x.device)
    k09.fused_gemm(x, W.unsqueeze(0).expand(B, K, N), views["a bias per row", B], out, 1.0, 1.0)
    if not _close(out, x.double() @ W.double() + row.double()[None, :, None]):
        raise ExerciseError("the batched GEMM with your per-row bias as C (beta = 1) is wrong")
    return ("bias_as_c: per-row and per-column biases as (B, M, N) views with stride 0, no "
            "copy; the batched GEMM adds the per-row bias through C")


def _splitk_launch(kernel, ws, bias, M, N):
    """The second pass on the partial sums ``ws`` (S, M, N), stored for the kernel as an
    (M, N, S) workspace: the S partials of an element side by side."""
    import triton
    refuse_package_kernel(kernel, "my_splitk_reduce")
    refuse_package_helpers(kernel, "my_splitk_reduce")
    S = ws.shape[0]
    wt = ws.permute(1, 2, 0).contiguous()
    out = torch.full((M, N), float("nan"), dtype=torch.float16, device=ws.device)
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    kernel[grid](wt, bias, out, M, N, S, wt.stride(0), wt.stride(1), out.stride(0),
                 BLOCK_M=16, BLOCK_N=16, BLOCK_S=triton.next_power_of_2(S))
    return out


def ex09_splitk(kernel):
    """Lesson 09, exercise 3: the second pass of split-K on an (M, N, S) workspace (sum the
    partials in fp32, then the bias and gelu once)."""
    import torch.nn.functional as F
    import triton
    gen = torch.Generator().manual_seed(2)
    M, N, K = 37, 29, 200
    a, b, bias = _rand(gen, M, K), _rand(gen, K, N), _rand(gen, N)
    ref = F.gelu(a.double() @ b.double() + bias.double())
    # partial sums that nearly cancel: 1000.3 - 999.9 + ... is fine in fp32, not in fp16
    dev = bias.device
    base = torch.randn(M, N, generator=gen).to(dev)
    big = torch.full((M, N), 1000.0, device=dev) + torch.rand(M, N, generator=gen).to(dev)
    ws = torch.stack([big, -big + base, big, -big])
    zero_bias = torch.zeros(N, dtype=torch.float16, device=dev)
    with run_answer("my_splitk_reduce"):
        out = _splitk_launch(kernel, ws, zero_bias, M, N)
    want = F.gelu(ws.double().sum(0))
    cancel_error = None
    if not _close(out, want):
        err = (out.double() - want).abs().max().item()
        half = torch.zeros(M, N, dtype=torch.float16, device=dev)
        for s in range(ws.shape[0]):
            half = half + ws[s].to(torch.float16)
        if _close(out, F.gelu(half.double()), tol=2e-2):
            raise ExerciseError(
                f"slices of about +-1000 that cancel: largest error {err:.3g}. Likely cause: "
                f"{HINTS['accumulator']}: sum the fp32 slices in an fp32 accumulator (fp16 "
                "keeps 11 bits: steps of 0.5 near 1000)")
        cancel_error = (f"slices of about +-1000 that cancel: largest error {err:.3g}. Likely "
                        "cause: sum all S slices first, then the bias and gelu once")
    from .. import interp_poison
    for S in (1, 3, 8):
        edges = [K * s // S for s in range(S + 1)]
        ws = torch.stack([a[:, lo:hi].float() @ b[lo:hi].float()
                          for lo, hi in zip(edges, edges[1:])])
        with run_answer("my_splitk_reduce"), interp_poison.poison_masked_loads() as poison:
            out = _splitk_launch(kernel, ws, bias, M, N)
        if bool(out.isnan().any()) and poison.poisoned:
            raise ExerciseError(
                f"S={S}: NaN in the output: {HINTS['other']}: the lanes past S (BLOCK_S = "
                f"{triton.next_power_of_2(S)} > S) that the mask switches off are undefined "
                "on a GPU (NaN here) and enter tl.sum; give the load other=0.0")
        if bool(out.isnan().all()):
            raise ExerciseError(f"S={S}: nothing was written (all NaN): {HINTS['todo']}, or "
                                "the tile is never stored")
        # the bias read per row (bias_ptr + offs_m): the rows below N show it (M > N here)
        if _close(out[:N], F.gelu(ws.double().sum(0)[:N] + bias.double()[:, None])):
            raise ExerciseError(f"S={S}: the bias added per row: here it holds one value per "
                                "column of C (N values, bias_ptr + offs_n, masked on N), "
                                "broadcast down the rows ([None, :])")
        if bool(out.isnan().any()):
            raise ExerciseError(f"S={S}: NaN in the output: a load outside the workspace or "
                                f"the bias: its offsets (partial s of element (m, n) is at "
                                "ws_ptr + m * stride_wm + n * stride_wn + s, the S partials "
                                f"side by side) or {HINTS['mask']}")
        if S > 1:
            per_slice = F.gelu(ws.double() + bias.double()).sum(0)
            if _close(out, per_slice):
                raise ExerciseError(f"S={S}: the bias and gelu were applied to each slice; "
                                    "they must wait for the full sum")
            for times in sorted({S, triton.next_power_of_2(S)}):
                if _close(out, F.gelu(ws.double().sum(0) + times * bias.double())):
                    raise ExerciseError(f"S={S}: the bias was added {times} times: once per "
                                        "slice (or per lane of BLOCK_S); add it once, after "
                                        "the sum")
        if _close(out, ws.double().sum(0) + bias.double()):
            raise ExerciseError(f"S={S}: gelu is missing (0.5 * x * (1 + erf(x / sqrt(2))))")
        if _close(out, F.gelu(ws.double().sum(0))):
            raise ExerciseError(f"S={S}: the bias is missing")
        if not _close(out, ref):
            as_smn = ws.permute(1, 2, 0).contiguous().flatten().view(S, M, N).double()
            if S > 1 and _close(out, F.gelu(as_smn.sum(0) + bias.double())):
                raise ExerciseError(
                    f"S={S}: the workspace read as (S, M, N): here it is (M, N, S), the S "
                    "partials of element (m, n) side by side, partial s at ws_ptr + m * "
                    "stride_wm + n * stride_wn + s")
            raise ExerciseError(f"S={S}: wrong. Likely cause: sum all S partials of each "
                                "element (offs_s < S), then the bias, then gelu; partial s of "
                                "element (m, n) is at ws_ptr + m * stride_wm + n * stride_wn + s "
                                "(the S partials side by side, one element apart)")
    if cancel_error:
        raise ExerciseError(cancel_error)
    return "split-K reduction: slices summed in fp32 first, then bias and gelu once"


def _partial_launch09(kernel, a, b, S):
    """Launch a first pass of split-K: grid (tiles of M, tiles of N, S), 16 x 16 x 16 tiles;
    the workspace (S, M, N) fp32 starts as NaN."""
    refuse_package_kernel(kernel, "my_splitk_partial")
    refuse_package_helpers(kernel, "my_splitk_partial")
    M, K = a.shape
    N = b.shape[1]
    ws = torch.full((S, M, N), float("nan"), dtype=torch.float32, device=a.device)
    kernel[(ceil_div(M, 16), ceil_div(N, 16), S)](
        a, b, ws, M, N, K, S, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        ws.stride(0), ws.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return ws


def _partials09(a, b, K, S, tiles=None, tail=lambda lo, hi: (lo, hi)):
    """float64 partial sums of a @ b: slice s sums the 16-column K-tiles ``tiles(s)`` (by
    default s, s + S, s + 2S, ...); ``tail(lo, hi)`` may move the last tile's columns (models
    of typical mistakes)."""
    T = ceil_div(K, 16)
    out = []
    for s in range(S):
        acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
        for t in (range(s, T, S) if tiles is None else tiles(s)):
            lo, hi = t * 16, min(K, t * 16 + 16)
            if hi - lo < 16:
                lo, hi = tail(lo, hi)
            acc += a[:, lo:hi].double() @ b[lo:hi].double()
        out.append(acc)
    return torch.stack(out)


def ex09_splitk_partial(kernel):
    """Lesson 09, exercise 4: the first pass of split-K with K-tiles dealt round-robin:
    program (pid_m, pid_n, pid_k) sums its tile over K-tiles pid_k, pid_k + S, pid_k + 2S...
    (the last K-tile partial) in fp32 and stores the partial in ws[pid_k]. A and B are views
    into larger buffers, so a read past K finds numbers, not zeros; masked-off lanes of a
    load without other= come back NaN in Triton's interpreter, as undefined as on a GPU."""
    from .. import interp_poison
    gen = torch.Generator().manual_seed(3)
    M, N, K = 37, 29, 200
    T = ceil_div(K, 16)
    big_a, big_b = _rand(gen, 48, 256), _rand(gen, 256, 48)
    a, b = big_a[:M, :K], big_b[:K, :N]
    for S in (3, 5, 1):
        want = _partials09(a, b, K, S)
        with interp_poison.poison_masked_loads() as poison, run_answer("my_splitk_partial"):
            ws = _partial_launch09(kernel, a, b, S)
        where = (f"K = {K} ({T} K-tiles of 16, the last {K - (T - 1) * 16} long), S = {S}")
        nan = ws.isnan().flatten(1)
        if bool(nan.all()):
            raise ExerciseError(f"{where}: nothing was written (all NaN): {HINTS['todo']}, or "
                                "the partial is never stored")
        if bool(nan.any()) and poison.poisoned:
            bad = [s for s in range(S) if bool(nan[s].any())]
            raise ExerciseError(
                f"{where}: NaN in slices {bad}. Likely cause: {HINTS['other']}: the lanes the "
                "K mask switches off are undefined on a GPU (NaN here) and reach tl.dot; give "
                "both loads other=0.0")
        unwritten = [s for s in range(S) if bool(nan[s].all())]
        if unwritten:
            if unwritten == list(range(1, S)):
                raise ExerciseError(f"{where}: only ws[0] was written: each program stores its "
                                    "partial in its own slice of the workspace, at ws_ptr + "
                                    "pid_k * stride_ws")
            raise ExerciseError(f"{where}: slices {unwritten} of the workspace were never "
                                "written: store at ws_ptr + pid_k * stride_ws")
        if bool(nan.any()):
            bad = [s for s in range(S) if bool(nan[s].any())]
            raise ExerciseError(f"{where}: NaN in slices {bad}: a load outside A or B "
                                f"({HINTS['mask']})")
        good = [_close(ws[s], want[s]) for s in range(S)]
        if all(good):
            continue
        rel = max(((ws[s].double() - want[s]).abs() / (want[s].abs() + 1)).max().item()
                  for s in range(S))
        if rel < 3e-2:
            raise ExerciseError(f"{where}: errors of the size of fp16 rounding (up to {rel:.2g} "
                                f"of a value). Likely cause: {HINTS['accumulator']}: accumulate "
                                "in fp32 (tl.zeros(..., dtype=tl.float32)) and store the fp32 "
                                "partial as it is")
        whole = a.double() @ b.double()
        if S > 1 and all(_close(ws[s], whole) for s in range(S)):
            raise ExerciseError(f"{where}: every slice holds the whole product A @ B: program "
                                "pid_k sums only its own K-tiles, pid_k, pid_k + S, ...")
        per = ceil_div(T, S)
        contiguous = _partials09(a, b, K, S, tiles=lambda s: range(s * per, min(T, s * per + per)))
        if S > 1 and all(_close(ws[s], contiguous[s]) for s in range(S)):
            raise ExerciseError(f"{where}: these are contiguous slices of K (lesson 09's "
                                "split-K): here the K-tiles are dealt round-robin, program "
                                "pid_k takes K-tiles pid_k, pid_k + S, pid_k + 2S, ... "
                                "(range(pid_k, cdiv(K, BLOCK_K), S))")
        first = _partials09(a, b, K, S, tiles=lambda s: range(0, T, S))
        if S > 1 and all(_close(ws[s], first[s]) for s in range(S)):
            raise ExerciseError(f"{where}: every slice holds the partial of slice 0: the K-tiles "
                                "of program pid_k start at K-tile pid_k")
        last = (T - 1) % S
        if all(g for s, g in enumerate(good) if s != last):
            over = _partials09(big_a[:M], big_b[:, :N], K, S, tail=lambda lo, hi: (lo, lo + 16))
            short = _partials09(a, b, K, S, tail=lambda lo, hi: (lo, lo))
            if _close(ws[last], over[last]):
                raise ExerciseError(
                    f"{where}: the last K-tile, K[{(T - 1) * 16}:{K}], read past K. Likely "
                    f"cause: {HINTS['mask']} on K: mask the loads of A's "
                    "columns and B's rows with their K position < K")
            if _close(ws[last], short[last]):
                raise ExerciseError(
                    f"{where}: the last, partial K-tile was left out: an off-by-one in the K "
                    "loop: it runs over cdiv(K, BLOCK_K) K-tiles, the last one masked")
            raise ExerciseError(f"{where}: slice {last}, which holds the last, partial K-tile, "
                                f"is wrong: the K tail ({HINTS['mask']} on K)")
        s = good.index(False)
        err = (ws[s].double() - want[s]).abs().max().item()
        raise ExerciseError(f"{where}: slice {s} is wrong (largest error {err:.3g}). Likely "
                            "cause: the K-tiles of program pid_k (pid_k, pid_k + S, ...), K-tile "
                            "t at K positions t * BLOCK_K + offs_k (t the K-tile's own index), or "
                            "the masks")
    # partial sums near 1024 that cancel inside a slice: right in fp32, not in fp16
    K = 128
    a, b = big_a[:M, :K].clone(), big_b[:K, :N].clone()
    for k0 in (0, 16):                   # K-tiles 0 and 2 are slice 0's, 1 and 3 slice 1's
        a[:, k0], b[k0], a[:, k0 + 32], b[k0 + 32] = 32.0, 32.0, 32.0, -32.0
    with interp_poison.poison_masked_loads(), run_answer("my_splitk_partial"):
        ws = _partial_launch09(kernel, a, b, 2)
    want = _partials09(a, b, K, 2)
    if not all(_close(ws[s], want[s]) for s in range(2)):
        err = (ws.double() - want).abs().max().item()
        raise ExerciseError(f"K = 128, two slices whose partial sums pass 1024 and come back: "
                            f"largest error {err:.3g}. Likely cause: {HINTS['accumulator']}: "
                            "accumulate in fp32 (tl.zeros(..., dtype=tl.float32)); fp16 steps "
                            "by 1.0 near 1024")
    return (f"my_splitk_partial: K = 200 dealt round-robin to 1, 3 and 5 programs (the last "
            "K-tile partial, reads past K would find numbers), each program its own K-tiles, "
            "fp32 partials")
