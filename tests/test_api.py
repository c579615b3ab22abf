"""Bad input gets an error that names the problem, never a wrong answer."""
import pytest
import torch

import gemm_lessons as gl
from gemm_lessons import registry


DEV = gl.device()


def ab(M=4, K=3, N=5, dtype=torch.float32):
    return torch.randn(M, K, device=DEV).to(dtype), torch.randn(K, N, device=DEV).to(dtype)


def test_matmul_computes_the_product_any_layout():
    a = torch.randn(9, 7, device=DEV).t()          # (7, 9), column-major
    b = torch.randn(13, 11, device=DEV)[2:11, 1:6]  # (9, 5), sliced
    c = gl.matmul(a, b, kernel="k01_coalesced")
    assert c.shape == (7, 5) and torch.allclose(c, a @ b, atol=1e-5)


@pytest.mark.parametrize("bad, exc, words", [
    (lambda: gl.matmul(*ab(4, 3, 5)[:1], torch.randn(4, 5, device=DEV)), ValueError,
     "a.shape[1] must equal"),
    (lambda: gl.matmul(torch.randn(4), torch.randn(4, 2)), ValueError, "must be 2-D"),
    (lambda: gl.matmul(torch.randn(2, 4, 3), torch.randn(3, 2)), ValueError, "must be 2-D"),
    (lambda: gl.matmul(*ab(dtype=torch.int32)), TypeError, "integer"),
    (lambda: gl.matmul(*ab(dtype=torch.float64)), TypeError, "takes float32"),
    (lambda: gl.matmul(torch.randn(4, 3), torch.randn(3, 5).half()), TypeError, "differ in dtype"),
    (lambda: gl.matmul(*ab(), kernel="k99_magic"), ValueError, "known kernels: k01_naive"),
    (lambda: gl.matmul([[1.0]], [[1.0]]), TypeError, "torch.Tensor"),
    (lambda: gl.matmul(torch.randn(4, 0, device=DEV), torch.randn(0, 5, device=DEV)), ValueError,
     "empty"),
    (lambda: gl.matmul(*ab(), out=torch.empty(5, 4, device=DEV)), ValueError, "out must be"),
    (lambda: gl.matmul(*ab(), kernel=3), TypeError, "kernel must be a name"),
])
def test_bad_input_is_named(bad, exc, words):
    with pytest.raises(exc) as e:
        bad()
    assert words in str(e.value)


def test_wrong_device_is_named():
    a, b = ab()
    if gl.backend() == "cuda":
        with pytest.raises(ValueError, match=r"kernels run on the GPU here: call \.cuda\(\)"):
            gl.matmul(a.cpu(), b, kernel="k01_naive")
    else:
        with pytest.raises(ValueError, match=r"take CPU tensors: call \.cpu\(\)"):
            gl.matmul(a.to("meta"), b, kernel="k01_naive")


def test_gemm_on_a_kernel_without_epilogue_is_refused():
    with pytest.raises(ValueError, match="has no BLAS epilogue"):
        gl.gemm(*ab(), kernel="k01_naive")


def test_registry_entries_are_complete():
    entries = gl.kernels()
    assert [e.lesson for e in entries] == sorted(e.lesson for e in entries)
    for e in entries:
        assert e.name.startswith(f"k{e.lesson:02d}_"), e.name
        assert e.language in ("numba", "triton")
        assert e.dtypes and all(d.is_floating_point for d in e.dtypes)
        assert e.summary and "\n" not in e.summary
        assert len(e.min_cc) == 2
        if e.language == "numba":
            assert e.ptx is not None, f"{e.name}: numba kernels show their PTX"
        assert registry.get(e.name) is e


def test_show_source_prints_the_kernel(capsys):
    gl.show_source("k01_naive")
    out = capsys.readouterr().out
    assert out.startswith("@cuda.jit") and "def naive_kernel" in out
