"""Lesson 09, the fused epilogue on split-K fed by TMA: act(alpha * A @ B + beta * C + bias)
right with K cut in 1 to 4 slices on operands a descriptor can address (ragged M, N and K
tiles, K shorter than a tile, A column-major, B given as W.t()), through the pointer kernel
where it cannot; the descriptors' blocks set per config; lesson 08's key and pruner.
Outputs are NaN-poisoned before every run and compared with a float64 reference."""
import argparse

import gemm_lessons as gl  # first: it switches on Triton's interpreter when there is no GPU
import pytest
import torch

from gemm_lessons import engines
from gemm_lessons.kernels import k08_triton_splitk as sk
from gemm_lessons.kernels import k09_fused_splitk as fs
from gemm_lessons.kernels import k09_fused_tma_splitk as ts

from test_k09_fused_splitk import (assert_clear_errors, assert_close, operands, poisoned,
                                   reference)

SMALL = dict(BM=16, BN=16, BK=16, num_warps=1, num_stages=1, group_size_m=2)
if engines.on_gpu():
    SMALL = dict(BM=64, BN=64, BK=32, num_warps=4, num_stages=3)
# every one TMA can address: rows of 16-byte multiples (K, and N, multiples of 8 halves)
SHAPES = {"ragged tiles": (37, 40, 72), "M=1": (1, 24, 64), "K=8": (16, 40, 8),
          "A column-major": (24, 40, 56)}
if not engines.on_gpu():
    pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def pointer_calls(monkeypatch):
    """The calls that went to k09_fused_splitk's pointer kernel instead of TMA."""
    calls = []
    real = fs.fused_gemm

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)
    monkeypatch.setattr(fs, "fused_gemm", spy)
    return calls


def test_check_passes_in_every_dtype():
    rep = gl.check("k09_fused_tma_splitk")
    assert rep.ok
    assert str(rep) == "k09_fused_tma_splitk: correct on 9 shapes (bfloat16, float16)"


@pytest.mark.parametrize("split_k", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_epilogue_is_applied_once_to_the_full_sum(split_k, shape, pointer_calls):
    M, N, K = SHAPES[shape]
    a, b, c, bias = operands(M, N, K, layout="transposed" if "column" in shape else "row")
    cfg = sk.make_config(split_k=split_k, **SMALL)
    for alpha, beta, act in ((1.0, 0.0, "gelu"), (0.5, -1.5, "relu"), (-2.0, 1.0, "leaky_relu")):
        assert ts.uses_tma(a, b, c, None, alpha, beta)
        out = ts.fused_gemm(a, b, c, poisoned(M, N), alpha, beta, bias, act, config=cfg)
        ref, scale = reference(a, b, c, alpha, beta, bias, act)
        assert_close(out, ref, scale, 2e-3, f"{shape} split {split_k} {act} {alpha} {beta}")
    assert not pointer_calls, "an operand TMA can address went to the pointer kernel"


def test_a_transposed_weight_is_read_in_place(pointer_calls):
    a, _, _, bias = operands(33, 40, 48, seed=2)
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(40, 48, generator=gen).half().to(a.device)       # nn.Linear's (N, K)
    b = w.t()
    assert ts.uses_tma(a, b)
    for split_k in (1, 3):
        out = ts.fused_gemm(a, b, None, poisoned(33, 40), 1.0, 0.0, bias, "gelu",
                            config=sk.make_config(split_k=split_k, **SMALL))
        ref, scale = reference(a, b, None, 1.0, 0.0, bias, "gelu")
        assert_close(out, ref, scale, 2e-3, f"W.t(), split {split_k}")
    assert not pointer_calls


CANNOT = ["K not a multiple of 8", "N not a multiple of 8", "A at an odd offset", "a sliced B",
          "fp32", "alpha = 0", "out is C"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("what", CANNOT)
def test_what_tma_cannot_address_runs_the_pointer_kernel(what, dtype, pointer_calls):
    M, N, K = {"K not a multiple of 8": (20, 24, 45), "N not a multiple of 8": (20, 21, 32)}.get(
        what, (20, 24, 32))
    dtype = torch.float32 if what == "fp32" else dtype
    a, b, c, bias = operands(M, N, K, dtype, seed=3)
    if what == "a sliced B":
        b = torch.cat([b, b], dim=1)[:, ::2]
    if what == "A at an odd offset":       # rows 16-byte multiples, the base 2 bytes off
        a = torch.cat([a, a[:, :8]], dim=1)[:, 1:K + 1]
    alpha, beta = (0.0, 1.0) if what == "alpha = 0" else (0.5, 1.0)
    ref, scale = reference(a, b, c, alpha, beta, bias, "gelu")
    out = c if what == "out is C" else poisoned(M, N, dtype)
    assert not ts.uses_tma(a, b, c, out, alpha, beta)
    ts.fused_gemm(a, b, c, out, alpha, beta, bias, "gelu")
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    assert_close(out, ref, scale, tol, what)
    assert pointer_calls[:1] == [a.shape]     # (out is C: it calls itself once more)


def test_two_runs_are_bitwise_equal_and_the_counters_end_at_zero():
    a, b, c, bias = operands(37, 40, 96, seed=3)
    cfg = sk.make_config(split_k=4, **SMALL)
    outs = [ts.fused_gemm(a, b, c, poisoned(37, 40), 1.0, 1.0, bias, "gelu", config=cfg)
            for _ in range(2)]
    _, counts = sk._BUFFERS[outs[0].device]
    assert int(counts.abs().sum()) == 0, "a tile's counter was not reset"
    assert torch.equal(outs[0], outs[1])


def test_autotuned_through_gl_gemm(pointer_calls):
    for dtype in (torch.float16, torch.bfloat16):
        a, b, c, bias = operands(45, 64, 80, dtype, seed=4)
        out = gl.gemm(a, b, c, alpha=0.5, beta=1.5, bias=bias, activation="gelu",
                      kernel="k09_fused_tma_splitk")
        ref, scale = reference(a, b, c, 0.5, 1.5, bias, "gelu")
        assert out.dtype == dtype
        assert_close(out, ref, scale, 2e-3 if dtype == torch.float16 else 1.6e-2, f"{dtype}")
    assert not pointer_calls
    assert ts.chosen_config() != "none yet (call the kernel first)"


def test_a_transposed_weight_is_tuned_apart_from_a_row_major_b():
    # W.t() compiles another kernel (B_TRANS): a config tuned for row-major B is not reused
    a, _, _, bias = operands(33, 48, 64, seed=6)
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(7)).to(a.dtype).to(a.device)
    tuned = ts.fused_tma_splitk_autotuned
    tuned.cache.clear()
    for b in (w.t().contiguous(), w.t()):
        ts.fused_gemm(a, b, None, poisoned(33, 48), 1.0, 0.0, bias, "gelu")
    b_trans = [key[tuned.keys.index("B_TRANS")] for key in tuned.cache]
    assert sorted(b_trans) == [False, True], list(tuned.cache)


def test_each_config_sets_the_descriptors_blocks_to_its_tiles():
    class Desc:
        block_shape = None
    for cfg in ts.TMA_CONFIGS:
        assert cfg.pre_hook is ts.set_blocks, sk.label(cfg)
        BM, BN, BK = (cfg.kwargs[k] for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
        for a_trans, b_trans in ((False, False), (True, True)):
            nargs = dict(cfg.kwargs, a_desc=Desc(), b_desc=Desc(), A_TRANS=a_trans,
                         B_TRANS=b_trans)
            cfg.pre_hook(nargs)
            assert nargs["a_desc"].block_shape == ([BK, BM] if a_trans else [BM, BK])
            assert nargs["b_desc"].block_shape == ([BN, BK] if b_trans else [BK, BN])


def test_it_shares_lesson_08s_key_and_pruner():
    tuned = ts.fused_tma_splitk_autotuned
    assert tuned.keys == sk.splitk_autotuned.keys + ["A_TRANS", "B_TRANS"]
    assert tuned.configs == ts.TMA_CONFIGS
    assert tuned.early_config_prune is sk.prune
    assert len({sk.label(c) for c in ts.TMA_CONFIGS}) == len(ts.TMA_CONFIGS), "listed twice"
    # k09_fused_splitk's fp16 configurations, then the ones added for TMA loads, which the
    # pruner keeps on the mid shapes they were added for
    pointer = sk.CONFIGS + fs.FUSED_CONFIGS
    assert [sk.label(c) for c in ts.TMA_CONFIGS[:len(pointer)]] == [sk.label(c) for c in pointer]
    added = ts.TMA_CONFIGS[len(pointer):]
    assert len(added) == 7
    for M, N, K in ((128, 4096, 14336), (1024, 1024, 16384), (512, 1024, 8192)):
        kept = sk.prune_for_gpu(tuned.configs, torch.float16, sk.m_bucket(M), N, K, sms=132)
        assert [c for c in kept if c in added], (M, N, K)


def test_bad_input_gets_a_clear_error():
    assert_clear_errors(ts.fused_gemm, "k09_fused_tma_splitk", 8, 16, 16)


@pytest.mark.skipif(engines.on_gpu(), reason="compiles for sm_90 with this machine's Triton")
def test_the_widest_configs_do_not_spill_in_the_gelu_epilogue():
    from gemm_lessons import compiled, triton_asm
    pointer = len(sk.CONFIGS + fs.FUSED_CONFIGS)
    wide = [c for i, c in enumerate(ts.TMA_CONFIGS)
            if c.kwargs["BLOCK_SIZE_N"] == 256 or i >= pointer]        # and the seven added
    for c, res in zip(wide, triton_asm.compile_kernels([ts.asm_job(c) for c in wide])):
        rep = compiled.ptxas_report(res["ptx"], (9, 0))
        if rep is None:
            pytest.skip("no ptxas here")
        assert rep["spill_stores"] == 0, (sk.label(c), rep)
        assert "cp.async.bulk.tensor" in res["ptx"], "A and B do not arrive by TMA"


def test_the_suite_records_medians_and_one_set_of_baselines(tmp_path, tool, monkeypatch):
    from gemm_lessons import results
    from gemm_lessons.labs import k09 as lab
    suite = tool("epilogue_suite")
    eager = iter([0.012, 0.030, 0.013])          # the repeats: one outlier, the median 0.013
    fused = iter([0.011, 0.009, 0.010])          # each kernel's: the median 0.010
    calls = []

    def bench(M, N, K, dtype, activation, *, kernels, graph):
        calls.append(kernels)
        ms = {"torch eager": next(eager), "torch.compile": 0.011, "cuBLAS mm alone": 0.009}
        t = next(fused)
        ms.update({k: t for k in kernels})
        return lab.EpilogueBench(M, N, K, dtype, activation, ms)
    monkeypatch.setattr(suite.gl, "backend", lambda: "cuda")
    monkeypatch.setattr(suite.lab, "bench_epilogue", bench)
    path = tmp_path / "suite.csv"
    assert suite.main(["--shape", "16x64x64", "--csv", str(path)]) == 0
    assert calls == [tuple(suite.DEFAULT)] * 3, "the default kernels, together, three times"
    rows = {r.kernel: r for _, r in results.read_csv(path)[0]}
    assert sorted(rows) == sorted([f"{k}_vs_{b}" for k in suite.DEFAULT
                                   for b in ("eager", "compile", "mm")]
                                  + ["eager_vs_mm", "compile_vs_mm"])
    assert rows["k09_fused_tma_splitk_vs_eager"].baseline_ms == pytest.approx(0.013)
    assert rows["k09_fused_splitk_vs_eager"].ms == pytest.approx(0.010)
    assert rows["eager_vs_mm"].ms == pytest.approx(0.013)
    # another kernel's run alone adds its rows and leaves the baselines' own
    eager, fused = iter([0.020]), iter([0.010])
    assert suite.main(["--kernel", "k09_fused_epilogue", "--repeat", "1", "--shape",
                       "16x64x64", "--csv", str(path)]) == 0
    rows = {r.kernel: r for _, r in results.read_csv(path)[0]}
    assert rows["eager_vs_mm"].ms == pytest.approx(0.013)
    assert rows["k09_fused_epilogue_vs_eager"].baseline_ms == pytest.approx(0.020)


def test_the_suite_leaves_out_a_kernel_this_gpu_cannot_run(tmp_path, tool, monkeypatch):
    from gemm_lessons import results
    from gemm_lessons.labs import k09 as lab
    suite = tool("epilogue_suite")

    def bench(M, N, K, dtype, activation, *, kernels, graph):      # as on an A100: no TMA
        ms = {"torch eager": 0.012, "torch.compile": 0.011, "cuBLAS mm alone": 0.009,
              "k09_fused_splitk": 0.010}
        res = lab.EpilogueBench(M, N, K, dtype, activation, ms)
        res.add_note("k09_fused_tma not timed: it needs sm_90 and fp16/bf16")
        res.add_note("k09_fused_tma_splitk not timed: it needs sm_90 and fp16/bf16")
        return res
    monkeypatch.setattr(suite.gl, "backend", lambda: "cuda")
    monkeypatch.setattr(suite.lab, "bench_epilogue", bench)
    path = tmp_path / "suite.csv"
    assert suite.main(["--shape", "16x64x64", "--repeat", "1", "--csv", str(path)]) == 0
    rows = {r.kernel for _, r in results.read_csv(path)[0]}
    assert rows == {"k09_fused_splitk_vs_eager", "k09_fused_splitk_vs_compile",
                    "k09_fused_splitk_vs_mm", "eager_vs_mm", "compile_vs_mm"}


def test_the_profiling_tool_reads_configs_and_refuses_bad_ones(tool):
    prof = tool("profile_k09_shape")
    c = prof.config_arg("128x64x64:k1:w4:s8:g1")
    assert (sk.label(c), c.kwargs["GROUP_SIZE_M"]) == ("128x64x64 k1 w4 s8", 1)
    for bad in ("128x64x64", "128x64x64:k0:w4:s8:g1", "a:b"):
        with pytest.raises(argparse.ArgumentTypeError, match="BMxBNxBK|at least 1"):
            prof.config_arg(bad)
    if not engines.on_gpu():
        assert prof.main([]) == 2                   # says it needs sm_90, runs nothing


def test_the_suite_summary_reads_both_recordings():
    from gemm_lessons.labs import k09 as lab
    for name in ("h200_epilogue_shapes.csv", "h200_epilogue_shapes_rerun.csv"):
        ratio = lab.suite_ratios(name, "k09_fused_tma_splitk", "eager")
        assert len(ratio) == 21
        geo, lo, hi, below = lab.summarize(ratio)
        assert min(ratio.values()) == ratio[lo] <= geo <= ratio[hi] == max(ratio.values())
        assert below == sum(v < 1 for v in ratio.values())
    assert lab.summarize({(1, 1, 1): 0.5, (2, 2, 2): 2.0})[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no ratios"):
        lab.summarize(lab.suite_ratios("h200_epilogue_shapes.csv", "no_such_kernel", "eager"))
