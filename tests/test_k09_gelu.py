"""Lesson 09's branch-free gelu (``k09_epilogue.gelu``): as exact as fp32 allows against a
float64 x * Phi(x) on a fine grid of x, its fp16 rounding the correctly rounded fp16 value
almost everywhere, NaN and infinities as torch's gelu, the same values as the libdevice gelu
it replaces; its polynomial the one ``tools/fit_gelu.py`` fits."""
import gemm_lessons  # noqa: F401  (first: it switches on Triton's interpreter without a GPU)
import inspect
import math
import re

import numpy as np
import torch
import triton

from gemm_lessons import engines
from gemm_lessons.kernels import k09_epilogue as ep

DEV = engines.device()


def run(x, activation):
    x = x.to(DEV)
    y = torch.full_like(x, float("nan"))     # poisoned: an element the kernel skips stays NaN
    grid = (triton.cdiv(x.numel(), 1024),)
    ep.activation_kernel[grid](x, y, x.numel(), ep.ACTIVATION_CODES[activation], BLOCK=1024)
    return y.cpu()


def exact(x):
    return np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x.double().tolist()])


X = torch.linspace(-12, 12, 96001, dtype=torch.float32)


def test_gelu_is_fp32_accurate():
    y = run(X, "gelu").double().numpy()
    ref = exact(X)
    assert not np.isnan(y).any(), "NaN where x is finite: the kernel missed elements"
    big = np.abs(ref) > 6e-5                  # fp16's normal range: relative error counts
    rel = np.abs(y[big] - ref[big]) / np.abs(ref[big])
    assert rel.max() < 5e-6, f"relative error {rel.max():.2e}: the polynomial or t is wrong"
    assert np.abs(y - ref).max() < 1e-6
    # rounded to fp16, all but a handful are the correctly rounded value
    h = torch.from_numpy(y).half()
    hr = torch.from_numpy(ref).half()
    assert int((h != hr).sum()) <= 20, "fp16 results differ from the correctly rounded ones"


def test_gelu_matches_libdevice_gelu():
    a = run(X, "gelu").double()
    b = run(X, "gelu_libdevice").double()
    assert (a - b).abs().max() < 1e-6
    # and libdevice's is itself exact gelu (the reference the replacement is held to)
    assert np.abs(b.numpy() - exact(X)).max() < 1e-6


def test_gelu_special_values_as_torch():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30, -40.0, 40.0])
    y = run(x, "gelu")
    want = torch.nn.functional.gelu(x.double()).float()
    assert torch.equal(torch.isnan(y), torch.isnan(want))
    ok = ~torch.isnan(want)
    torch.testing.assert_close(y[ok], want[ok], rtol=1e-6, atol=0)   # inf, 0, -0, tiny, +-40


def test_polynomial_is_the_fitted_one(tool):
    fit = tool("fit_gelu")
    c = fit.fit()
    src = inspect.getsource(ep.gelu.fn)
    shipped = []
    for ln in src.splitlines():
        if re.match(r"\s*p = ", ln):          # p = c10, then p = p * a +/- c
            expr = ln.split("=", 1)[1].split("#")[0].strip()
            shipped.append(float(expr.removeprefix("p * a").replace(" ", "")))
    assert len(shipped) == fit.DEGREE + 1
    assert f"a < {fit.A_MAX}" in src
    # the kernel's polynomial keeps the promise of its docstring: Phi(-a) within 3e-7
    assert fit.max_rel_error(np.array(shipped[::-1])) < 3e-7
    # and it is the tool's fit, compared by value: the coefficients themselves move in their
    # third digit from one LAPACK to another (see fit_gelu.fit), the values by about 1e-7
    # in log2 at most; one coefficient edited by 0.1 % moves them by about 2e-3
    a = np.linspace(0, fit.A_MAX, 20001)
    apart = np.abs(np.polyval(shipped, a) - np.polyval(c[::-1], a)).max()
    assert apart < 1e-6, f"the kernel's polynomial is {apart:.1e} (log2) away from the fit"
    assert fit.max_rel_error(c) < 3e-7


def test_the_epilogue_cost_tool_names_real_activations(tool):
    cost = tool("epilogue_cost")
    if not engines.on_gpu():
        assert cost.main(["--shape", "64"]) == 2               # times kernels: needs a GPU
    for has_bias, act in cost.EPILOGUES.values():
        assert act in ep.ACTIVATION_CODES and act in cost.ACT64
    assert cost.EPILOGUES["bias+gelu"] == (True, "gelu")
    assert cost.CONFIG.kwargs["SPLIT_K"] == 1                   # untuned, unsplit: one kernel
    record = tool("record_epilogue")
    if not engines.on_gpu():
        assert record.main(["--head-only"]) == 2


def test_the_epilogue_benchmarks_share_their_seeded_operands():
    from gemm_lessons.labs import k09 as lab
    a, b, bias = lab.epilogue_operands(64, 48, 256, torch.float16, seed=3)
    a2, b2, bias2 = lab.epilogue_operands(64, 48, 256, torch.float16, seed=3)
    assert torch.equal(a, a2) and torch.equal(b, b2) and torch.equal(bias, bias2)
    assert a.shape == (64, 256) and b.shape == (256, 48) and bias.shape == (48,)
    assert 0.3 < (a.double() @ b.double()).std().item() < 3      # gelu's curved range
    _, bt, _ = lab.epilogue_operands(64, 48, 256, torch.float16, seed=3, b_layout="transposed")
    assert bt.shape == (256, 48) and bt.stride() == (1, 256)     # W.t() of a (48, 256) weight
