"""python -m gemm_lessons: info, check, ladder, ptx."""
import pytest
import torch

from gemm_lessons import __main__ as cli

GPU = torch.cuda.is_available()


def test_info(py):
    r = py(None, args=["-m", "gemm_lessons", "info"])
    assert r.returncode == 0, r.stderr
    for word in ("engine:", "torch:", "triton:", "numba-cuda:", "k01_naive"):
        assert word in r.stdout


def test_check_one_kernel_and_unknown(py):
    r = py(None, args=["-m", "gemm_lessons", "check", "--kernel", "k01_coalesced", "--quiet"])
    assert r.returncode == 0, r.stderr
    assert "k01_coalesced: correct on 9 shapes (float32)" in r.stdout
    r = py(None, args=["-m", "gemm_lessons", "check", "--kernel", "nope"])
    assert r.returncode == 2 and "known kernels" in r.stderr


def test_check_exits_nonzero_on_a_wrong_kernel(monkeypatch, capsys):
    from gemm_lessons.kernels import k01_naive
    # the launcher looks its kernel up at call time: swap in the other mapping, whose grid
    # then covers the wrong part of C
    monkeypatch.setattr(k01_naive, "coalesced_kernel", k01_naive.naive_kernel)
    assert cli.main(["check", "--kernel", "k01_coalesced", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "FAILED k01_coalesced is wrong on" in out and "Likely cause" in out


@pytest.mark.skipif(GPU, reason="the no-GPU path")
def test_ladder_without_gpu_checks_and_explains(py):
    r = py(None, args=["-m", "gemm_lessons", "ladder", "--kernel", "k01_naive", "--quiet"])
    assert r.returncode == 0, r.stderr
    assert "timings need a GPU" in r.stdout
    assert "k01_naive: correct on the shape suite" in r.stdout


def test_ptx_without_gpu(py):
    r = py(None, args=["-m", "gemm_lessons", "ptx", "k01_coalesced", "--cc", "90",
                       "--grep", r"ld\.global\.f32"])
    assert r.returncode == 0, r.stderr
    assert "ld.global.f32" in r.stdout and "lines match" in r.stdout
    r = py(None, args=["-m", "gemm_lessons", "ptx", "k01_coalesced", "--resources"])
    assert r.returncode == 0 and "registers" in r.stdout and "spill_stores 0" in r.stdout


def test_ladder_table_formats_results():
    from gemm_lessons.harness import BenchResult
    r = BenchResult("k01_naive", torch.float32, 4096, 4096, 4096, ms=100.0, baseline_ms=5.0)
    table = cli.ladder_table([(1, r)])
    assert "| k01_naive | 01 | float32 | 4096 | 100.000 | 1.4 | 27.5 | 0.05 |" in table
