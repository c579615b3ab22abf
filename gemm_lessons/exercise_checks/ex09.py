"""The checks of lesson 09 (fused epilogue): ``exercises/09_*.ipynb``."""
from __future__ import annotations

import torch

from .. import engines
from .guards import ExerciseError, HINTS, run_answer
from .products import ceil_div, check_product, small_suite


def _close(out, ref, tol=2e-3):
    return bool(((out.double() - ref).abs() <= tol * (ref.abs() + 1)).all())


def _rand(gen, *shape, dev=None):
    dev = engines.device() if dev is None else dev
    return torch.randn(*shape, generator=gen).to(torch.float16).to(dev)


def ex09_epilogue(my_gemm):
    """Lesson 09, exercise 1: the fused epilogue with BLAS's beta == 0 rule and a bias per
    row of C."""
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(0)
    a, b, c, bias = _rand(gen, 37, 45), _rand(gen, 45, 29), _rand(gen, 37, 29), _rand(gen, 37)
    nan_c = torch.full_like(c, float("nan"))
    with run_answer("my_gemm"):
        out = my_gemm(a, b, nan_c, beta=0.0, bias=bias, gelu=True)
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


def ex09_batch(as_batch):
    """Lesson 09, exercise 2: a broadcast operand as a stride-0 view."""
    import torch.nn.functional as F
    from ..kernels import k09_fused_epilogue as k09
    gen = torch.Generator().manual_seed(1)
    x, W, bias = _rand(gen, 5, 40, 24), _rand(gen, 24, 36), _rand(gen, 36)
    with run_answer("as_batch"):
        W3, x3, one = as_batch(W, 5), as_batch(x, 5), as_batch(W.unsqueeze(0), 5)
        W7 = as_batch(W, 7)
    for got, B in ((W3, 5), (W7, 7)):
        if tuple(got.shape) != (B, 24, 36):
            raise ExerciseError(f"as_batch(W, {B}) has shape {tuple(got.shape)}, not ({B}, 24, 36)")
        if got.data_ptr() != W.data_ptr() or got.stride(0) != 0:
            raise ExerciseError(f"as_batch(W, {B}) has strides {got.stride()}: the batch stride "
                                "must be 0 and the memory W's own (expand makes a view; repeat "
                                "and contiguous copy)")
        if not torch.equal(got[B - 1], W):
            raise ExerciseError(f"as_batch(W, {B})[{B - 1}] is not W")
    if x3.data_ptr() != x.data_ptr() or x3.stride() != x.stride():
        raise ExerciseError("a batch of 5 stays as it is (same memory, same strides)")
    if one.stride(0) != 0 or one.data_ptr() != W.data_ptr() or tuple(one.shape) != (5, 24, 36):
        raise ExerciseError("a batch of 1 is broadcast too (stride 0 along the batch)")
    out = torch.full((5, 40, 36), float("nan"), dtype=torch.float16, device=x.device)
    k09.fused_gemm(x3, W3, None, out, 1.0, 0.0, bias, "relu")
    if not _close(out, F.relu(x.double() @ W.double() + bias.double())):
        raise ExerciseError("the batched GEMM on your views is wrong")
    return "as_batch: batch stride 0, no copy; the batched GEMM matches float64"


def _splitk_launch(kernel, ws, bias, M, N):
    import triton
    S = ws.shape[0]
    out = torch.full((M, N), float("nan"), dtype=torch.float16, device=ws.device)
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    kernel[grid](ws, bias, out, M, N, S, ws.stride(0), ws.stride(1), out.stride(0),
                 BLOCK_M=16, BLOCK_N=16)
    return out


def ex09_splitk(kernel):
    """Lesson 09, exercise 3: the second pass of split-K (sum the slices in fp32, then the
    bias and gelu once)."""
    import torch.nn.functional as F
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
    for S in (1, 3, 8):
        edges = [K * s // S for s in range(S + 1)]
        ws = torch.stack([a[:, lo:hi].float() @ b[lo:hi].float()
                          for lo, hi in zip(edges, edges[1:])])
        with run_answer("my_splitk_reduce"):
            out = _splitk_launch(kernel, ws, bias, M, N)
        if bool(out.isnan().all()):
            raise ExerciseError(f"S={S}: nothing was written (all NaN): {HINTS['todo']}, or "
                                "the tile is never stored")
        if bool(out.isnan().any()):
            raise ExerciseError(f"S={S}: NaN in the output: a load outside the workspace or "
                                f"the bias ({HINTS['mask']}, or other=0.0)")
        if S > 1:
            per_slice = F.gelu(ws.double() + bias.double()).sum(0)
            if _close(out, per_slice):
                raise ExerciseError(f"S={S}: the bias and gelu were applied to each slice; "
                                    "they must wait for the full sum")
            if _close(out, F.gelu(ws.double().sum(0) + S * bias.double())):
                raise ExerciseError(f"S={S}: the bias was added once per slice")
        if _close(out, ws.double().sum(0) + bias.double()):
            raise ExerciseError(f"S={S}: gelu is missing (0.5 * x * (1 + erf(x / sqrt(2))))")
        if _close(out, F.gelu(ws.double().sum(0))):
            raise ExerciseError(f"S={S}: the bias is missing")
        if not _close(out, ref):
            raise ExerciseError(f"S={S}: wrong. Likely cause: sum all S slices "
                                "(for s in range(0, S): acc += tl.load(...)), then bias, then gelu")
    if cancel_error:
        raise ExerciseError(cancel_error)
    return "split-K reduction: slices summed in fp32 first, then bias and gelu once"


def _partial_launch09(kernel, a, b, k_per_split):
    """Launch a first pass of split-K: grid (tiles of M, tiles of N, slices), 16 x 16 x 16
    tiles; the workspace (S, M, N) fp32 starts as NaN."""
    M, K = a.shape
    N = b.shape[1]
    S = ceil_div(K, k_per_split)
    ws = torch.full((S, M, N), float("nan"), dtype=torch.float32, device=a.device)
    kernel[(ceil_div(M, 16), ceil_div(N, 16), S)](
        a, b, ws, M, N, K, k_per_split, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        ws.stride(0), ws.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return ws


def _slices09(a, b, K, k_per_split, bounds=None):
    """float64 partial sums of a @ b over K[s * k_per_split : ...]; ``bounds(lo, hi)`` may
    move each slice's columns (models of typical mistakes)."""
    S = ceil_div(K, k_per_split)
    out = []
    for s in range(S):
        lo, hi = s * k_per_split, min(K, (s + 1) * k_per_split)
        lo, hi = (lo, hi) if bounds is None else bounds(lo, hi)
        out.append(a[:, lo:hi].double() @ b[lo:hi].double())
    return torch.stack(out)


def ex09_splitk_partial(kernel):
    """Lesson 09, exercise 4: the first pass of split-K. Program (pid_m, pid_n, pid_k) sums
    its tile over K[pid_k * K_PER_SPLIT : (pid_k + 1) * K_PER_SPLIT] (the last slice is
    shorter) in fp32 and stores the partial in ws[pid_k]. A and B are views into larger
    buffers, so a read past K finds numbers, not zeros; masked-off lanes of a load without
    other= come back NaN in Triton's interpreter, as undefined as on a GPU."""
    from .. import interp_poison
    gen = torch.Generator().manual_seed(3)
    M, N, K = 37, 29, 200
    big_a, big_b = _rand(gen, 48, 256), _rand(gen, 256, 48)
    a, b = big_a[:M, :K], big_b[:K, :N]
    for kps in (64, 80, 208):
        S = ceil_div(K, kps)
        want = _slices09(a, b, K, kps)
        with interp_poison.poison_masked_loads() as poison, run_answer("my_splitk_partial"):
            ws = _partial_launch09(kernel, a, b, kps)
        where = f"K = {K}, K_PER_SPLIT = {kps} ({S} slices, the last {K - (S - 1) * kps} long)"
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
            raise ExerciseError(f"{where}: every slice holds the whole product A @ B: a program "
                                "sums only its own slice of K, K[pid_k * K_PER_SPLIT : "
                                "(pid_k + 1) * K_PER_SPLIT]")
        first = _slices09(a, b, K, kps, bounds=lambda lo, hi: (0, hi - lo))
        if S > 1 and all(_close(ws[s], first[s]) for s in range(S)):
            raise ExerciseError(f"{where}: every slice holds a partial sum over the first "
                                "columns of A: the pointers must start at the slice's first k, "
                                "k_start = pid_k * K_PER_SPLIT")
        if all(good[:-1]):
            lo = (S - 1) * kps
            over = _slices09(big_a[:M], big_b[:, :N], K, kps,
                             bounds=lambda lo, hi: (lo, lo + ceil_div(hi - lo, 16) * 16))
            short = _slices09(a, b, K, kps, bounds=lambda lo, hi: (lo, lo + (hi - lo) // 16 * 16))
            if _close(ws[-1], over[-1]):
                raise ExerciseError(
                    f"{where}: the last slice, K[{lo}:{K}], read past K. Likely cause: "
                    f"{HINTS['mask']} on the K tail: mask against what is left of this slice "
                    "(k_len - k * BLOCK_K, with k_len = min(K - k_start, K_PER_SPLIT)), not "
                    "against K or K_PER_SPLIT")
            if _close(ws[-1], short[-1]):
                raise ExerciseError(
                    f"{where}: the last slice, K[{lo}:{K}], left out its K tail: an off-by-one "
                    "in the K tail: the loop takes cdiv(k_len, BLOCK_K) steps, the last one "
                    "masked")
            raise ExerciseError(f"{where}: the last, shorter slice K[{lo}:{K}] is wrong: the "
                                f"K tail ({HINTS['mask']} against what is left of the slice)")
        s = good.index(False)
        err = (ws[s].double() - want[s]).abs().max().item()
        raise ExerciseError(f"{where}: slice {s} is wrong (largest error {err:.3g}). Likely "
                            "cause: the slice's bounds (k_start = pid_k * K_PER_SPLIT, k_len = "
                            "min(K - k_start, K_PER_SPLIT)) or the K masks")
    # partial sums near 1024 that cancel inside a slice: right in fp32, not in fp16
    K = 128
    a, b = big_a[:M, :K].clone(), big_b[:K, :N].clone()
    for k0 in (0, 64):
        a[:, k0], b[k0], a[:, k0 + 16], b[k0 + 16] = 32.0, 32.0, 32.0, -32.0
    with interp_poison.poison_masked_loads(), run_answer("my_splitk_partial"):
        ws = _partial_launch09(kernel, a, b, 64)
    want = _slices09(a, b, K, 64)
    if not all(_close(ws[s], want[s]) for s in range(2)):
        err = (ws.double() - want).abs().max().item()
        raise ExerciseError(f"K = 128, two slices whose partial sums pass 1024 and come back: "
                            f"largest error {err:.3g}. Likely cause: {HINTS['accumulator']}: "
                            "accumulate in fp32 (tl.zeros(..., dtype=tl.float32)); fp16 steps "
                            "by 1.0 near 1024")
    return ("my_splitk_partial: 3 splits of K = 200 (short last slices, reads past K would find "
            "numbers), each program its own slice, fp32 partials")
