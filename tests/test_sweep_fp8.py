"""tools/sweep_fp8.py's CPU-side logic (its timings need an FP8 GPU): it refuses to time
without one, its operands are quantized as the kernels and torch._scaled_mm take them, and
its error rows are right on a tiny product through the interpreter."""
import sys
from pathlib import Path

import torch

import gemm_lessons as gl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import sweep_fp8  # noqa: E402


def test_without_a_gpu_it_says_so(capsys, tmp_path):
    if gl.backend() == "cuda":
        return
    assert sweep_fp8.main(["--out", str(tmp_path / "x.csv")]) == 2
    assert "--dry-run" in capsys.readouterr().err


def test_operands_take_scaled_mm_layouts():
    x, w = sweep_fp8.operands(32, 48, 256)
    for ga, gb in (("tensor", "tensor"), ("row", "col"), ((1, 128), (128, 128))):
        qa, qb, sa, sb, ref = sweep_fp8.quantized(x, w, ga, gb, gl.device())
        assert qb.stride(0) == 1 and qa.stride(1) == 1          # B column-major, as W.t()
        assert ref.shape == (32, 48) and sa.is_contiguous() and sb.is_contiguous()
    qa, qb, sa, sb, ref = sweep_fp8.quantized(x, w, "row", "col", gl.device())
    got = torch._scaled_mm(qa, qb, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    assert ((got.double().cpu() - ref.cpu()).norm() / ref.norm()).item() < 1e-2


def test_error_rows_on_a_tiny_product():
    rows = sweep_fp8.errors_over_k((64,), gl.device(), "v", "cpu", M=16, N=16)
    assert {r["data"] for r in rows} == {"layer", "positive"}
    assert all("fp8" in r["kernel"] and set(r) == set(sweep_fp8.ERROR_FIELDS) for r in rows)
    # the interpreter sums in fp32; a GPU's FP8 accumulator keeps fewer bits
    tol = 5e-3 if gl.backend() == "cuda" else 1e-5
    assert all(float(r["rel_error"]) < tol for r in rows)


def test_shapes_and_kernels_are_parsed():
    import argparse
    import pytest
    assert sweep_fp8.parse_shapes("4096,512x1024x2048") == [(4096,) * 3, (512, 1024, 2048)]
    with pytest.raises(argparse.ArgumentTypeError, match="MxNxK"):
        sweep_fp8.parse_shapes("64x64")
    assert sweep_fp8.parse_kernels("k11_fp8_blockwise, k11_fp8_rowwise") == (
        "k11_fp8_blockwise", "k11_fp8_rowwise")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown k11_fp8_nope"):
        sweep_fp8.parse_kernels("k11_fp8_nope")


def test_a_kernel_filter_keeps_the_baselines():
    fns = sweep_fp8.calls_for_shape(32, 32, 128, gl.device(), ("k11_fp8_blockwise",))
    assert "k11_fp8_blockwise" in fns and "k11_fp8_rowwise" not in fns
    assert {"tensorwise", "rowwise_fast"} <= set(fns)     # torch._scaled_mm, always timed
    assert fns["k11_fp8_blockwise"][1]() < 1e-2 and fns["rowwise"][1]() < 1e-2


def test_configs_entries_name_one_configuration():
    import argparse
    import pytest
    from gemm_lessons.kernels.k07_triton_swizzle import TileConfig
    entries = sweep_fp8.parse_configs("k11_fp8_rowwise, k11_fp8_blockwise@64x128x128w4s3")
    assert entries == ("k11_fp8_rowwise", "k11_fp8_blockwise@64x128x128w4s3")
    assert sweep_fp8.configs_of("k11_fp8_rowwise", entries) == sweep_fp8.CONFIGS
    assert sweep_fp8.configs_of("k11_fp8_blockwise", entries) == [TileConfig(64, 128, 128, 4, 3)]
    assert sweep_fp8.configs_of("k11_fp8_rowwise_promoted", entries) == []
    with pytest.raises(argparse.ArgumentTypeError, match="BMxBNxBK"):
        sweep_fp8.parse_configs("k11_fp8_blockwise@64x128")
    with pytest.raises(argparse.ArgumentTypeError, match="configurations are timed for"):
        sweep_fp8.parse_configs("k11_fp8_tensorwise@64x128x128w4s3")


def test_gluon_kernel_configurations_carry_its_options():
    """k11_fp8_blockwise_ws@...r1p0: the Gluon kernel's scale ring (r) and persistent grid (p)
    in the label; the list --configs times holds each of the four combinations."""
    import argparse
    import pytest
    from gemm_lessons.kernels.k11_gluon_fp8 import WS_CONFIG, WsConfig
    entries = sweep_fp8.parse_configs("k11_fp8_blockwise_ws@128x128x128w4s5r0p1,"
                                      "k11_fp8_blockwise_ws@128x64x128w4s6")
    assert entries == ("k11_fp8_blockwise_ws@128x128x128w4s5r0p1",
                       "k11_fp8_blockwise_ws@128x64x128w4s6")
    got = sweep_fp8.configs_of("k11_fp8_blockwise_ws", entries)
    assert got[0] == WsConfig(128, 128, 128, 4, 5, scale_ring=False, persistent=True)
    assert tuple(got[1]) == (128, 64, 128, 4, 6)            # the options at their defaults
    assert sweep_fp8._label(WS_CONFIG) == "128x128x128w4s5r1p1"
    assert {(c.scale_ring, c.persistent) for c in sweep_fp8.WS_CONFIGS} == {
        (False, False), (False, True), (True, False), (True, True)}
    with pytest.raises(argparse.ArgumentTypeError, match="only k11_fp8_blockwise_ws"):
        sweep_fp8.parse_configs("k11_fp8_blockwise@64x128x128w4s3r1p1")


def test_one_configuration_is_checked_and_timed(tmp_path):
    """--configs KERNEL@CONFIG on the interpreter: that configuration alone, checked against
    float64, in rows against the per-row kernel and the bf16 GEMM."""
    rows = []
    sweep_fp8.time_configs((64,), gl.device(), sweep_fp8.timer(True), rows, "v", "cpu",
                           ("k11_fp8_blockwise@64x128x128w4s3",))
    names = {r.kernel if hasattr(r, "kernel") else r["kernel"] for r in rows}
    assert "k11_fp8_blockwise@64x128x128w4s3:graph" in names
    assert not any("rowwise_promoted" in n for n in names)
