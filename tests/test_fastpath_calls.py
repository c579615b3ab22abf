"""gl.matmul and gl.gemm called again and again, as a program calls them: from the third
call of a kind on, a call replays the launches recorded on the second (on a GPU; see
gemm_lessons.fastpath). Each call here gets new operands at new addresses with new values
and a NaN-poisoned or fresh output, so a replay that kept a stale address, descriptor,
workspace or configuration gives a wrong product. Between kinds the strides, the alignment
and the dtype change. On the CPU every call runs the launcher (there are no plans to test:
the shape suite covers it), so these run on a GPU only."""
import pytest
import torch
import torch.nn.functional as F

import gemm_lessons as gl
from gemm_lessons import harness

CALLS = 5
pytestmark = pytest.mark.skipif(gl.backend() != "cuda",
                                reason="launch plans are made on a GPU only")


def _fp(entry):
    return torch.float16 if torch.float16 in entry.dtypes else entry.dtypes[0]


def _kernels():
    return [k.name for k in gl.kernels()]


def _ok(c, a, b):
    ok, rel, _ = harness.compare(c, harness.reference(a, b), a, b, a.dtype)
    return ok, rel


@pytest.mark.parametrize("kernel", list(_kernels()) + ["auto"])
def test_repeated_calls_with_new_operands(kernel):
    if kernel != "auto" and not gl.runs_here(kernel):
        pytest.skip(f"{kernel} does not run on this engine")
    entry = None if kernel == "auto" else next(k for k in gl.kernels() if k.name == kernel)
    dtype = torch.float16 if entry is None else _fp(entry)
    M, N, K = 70, 45, 38
    kinds = [("row", "row"), ("transposed", "sliced")]
    for layout in kinds:
        for i in range(CALLS):
            a, b = harness.make_operands(M, N, K, dtype, seed=10 * i + 1, a=layout[0],
                                         b=layout[1])
            if i % 2:                                   # into a given output, poisoned
                out = torch.full((M, N), float("nan"), dtype=dtype, device=a.device)
                c = gl.matmul(a, b, kernel, out=out)
                assert c is out
            else:
                c = gl.matmul(a, b, kernel)
            ok, rel = _ok(c, a, b)
            assert ok, f"call {i + 1} ({layout}): relative error {rel:.1e}"


def _gemm_kernels():
    for k in gl.kernels():
        if k.gemm is not None and {"bias", "activation"} <= k.features:
            yield k.name


@pytest.mark.parametrize("kernel", list(_gemm_kernels()) + ["auto"])
def test_repeated_fused_calls_with_new_operands(kernel):
    if kernel != "auto" and not gl.runs_here(kernel):
        pytest.skip(f"{kernel} does not run on this engine")
    M, N, K = 70, 48, 40
    dev = gl.device()
    for i in range(CALLS):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(M, K, generator=g).half().to(dev)
        W = torch.randn(N, K, generator=g).half().to(dev)
        bias = torch.randn(N, generator=g).half().to(dev)
        got = gl.gemm(x, W.t(), bias=bias, activation="gelu", kernel=kernel)
        want = F.gelu(x.double() @ W.double().t() + bias.double())
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel < 2e-3, f"call {i + 1}: relative error {rel:.1e}"
