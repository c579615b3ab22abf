"""Lesson 09, the fused epilogue on split-K: act(alpha * A @ B + beta * C + bias) right on
ragged, short, K = 1 and transposed shapes with K cut in 1 to 4 slices (the epilogue applied
once, to the full sum), BLAS's zero rules, C overwritten in place, the counters left at zero.
Outputs are NaN-poisoned before every run and compared with a float64 reference."""
import gemm_lessons as gl  # first: it switches on Triton's interpreter when there is no GPU
import pytest
import torch
import torch.nn.functional as F

from gemm_lessons import engines, harness
from gemm_lessons.kernels import k08_triton_splitk as sk
from gemm_lessons.kernels import k09_fused_splitk as fs

DEV = engines.device()
SMALL = dict(BM=16, BN=16, BK=8, num_warps=1, num_stages=1, group_size_m=2)
if engines.on_gpu():
    SMALL = dict(BM=64, BN=64, BK=32, num_warps=4, num_stages=3)
ACT64 = {None: lambda x: x, "relu": F.relu, "gelu": F.gelu,
         "leaky_relu": lambda x: F.leaky_relu(x, 0.01)}
SHAPES = {"ragged": (37, 29, 45), "M=1": (1, 17, 70), "K=1": (16, 40, 1),
          "A transposed": (23, 31, 52)}


def operands(M, N, K, dtype=torch.float16, seed=0, layout="row"):
    a, b = harness.make_operands(M, N, K, dtype, seed=seed, a=layout)
    gen = torch.Generator().manual_seed(seed + 1)
    c = torch.randn(M, N, generator=gen).to(dtype).to(DEV)
    bias = torch.randn(N, generator=gen).to(dtype).to(DEV)
    return a, b, c, bias


def reference(a, b, c, alpha, beta, bias, act):
    y = (alpha * (a.double() @ b.double()) if alpha != 0
         else torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device))
    scale = abs(alpha) * (a.double().abs() @ b.double().abs())
    if beta != 0:
        y, scale = y + beta * c.double(), scale + abs(beta) * c.double().abs()
    if bias is not None:
        y, scale = y + bias.double(), scale + bias.double().abs()
    return ACT64[act](y), scale


def assert_close(out, ref, scale, tol, what):
    out64 = out.double()
    assert not torch.isnan(out64).any(), f"{what}: NaN in the output (unwritten or leaked)"
    err = (out64 - ref).abs()
    bad = err > tol * (scale + ref.abs()) + 1e-6
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.numel()} wrong, worst {err.max():.2e}"


def poisoned(M, N, dtype=torch.float16):
    return torch.full((M, N), float("nan"), dtype=dtype, device=DEV)


def test_check_passes_in_every_dtype():
    rep = gl.check("k09_fused_splitk")
    assert rep.ok
    assert str(rep) == "k09_fused_splitk: correct on 9 shapes (bfloat16, float16, float32)"


@pytest.mark.parametrize("split_k", [1, 3, 4])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_epilogue_is_applied_once_to_the_full_sum(split_k, shape):
    M, N, K = SHAPES[shape]
    a, b, c, bias = operands(M, N, K, layout="transposed" if "transposed" in shape else "row")
    cfg = sk.make_config(split_k=split_k, **SMALL)
    for alpha, beta, act in ((1.0, 0.0, "gelu"), (0.5, -1.5, "relu"), (-2.0, 1.0, "leaky_relu")):
        out = fs.fused_gemm(a, b, c, poisoned(M, N), alpha, beta, bias, act, config=cfg)
        ref, scale = reference(a, b, c, alpha, beta, bias, act)
        assert_close(out, ref, scale, 2e-3, f"{shape} split {split_k} {act} {alpha} {beta}")


def test_every_activation_and_dtype_through_gl_gemm():
    dtypes = [torch.float16, torch.float32] + ([torch.bfloat16] if engines.on_gpu() else [])
    tol = {torch.float16: 2e-3, torch.float32: 1e-5, torch.bfloat16: 1.6e-2}
    for dtype in dtypes:
        a, b, c, bias = operands(37, 29, 45, dtype, seed=4)
        for act in ACT64:
            out = gl.gemm(a, b, c, alpha=0.5, beta=1.5, bias=bias, activation=act,
                          kernel="k09_fused_splitk")
            ref, scale = reference(a, b, c, 0.5, 1.5, bias, act)
            assert out.dtype == dtype
            assert_close(out, ref, scale, tol[dtype], f"{dtype} {act}")


def test_blas_zero_rules():
    a, b, c, bias = operands(20, 18, 24)
    nan = float("nan")
    cfg = sk.make_config(split_k=2, **SMALL)
    # beta == 0: C full of NaN is never read
    out = fs.fused_gemm(a, b, torch.full_like(c, nan), poisoned(20, 18), 1.5, 0.0, bias,
                        "gelu", config=cfg)
    ref, scale = reference(a, b, c, 1.5, 0.0, bias, "gelu")
    assert_close(out, ref, scale, 2e-3, "NaN in C leaked through beta = 0")
    # alpha == 0: A and B full of NaN are never read
    out = fs.fused_gemm(torch.full_like(a, nan), torch.full_like(b, nan), c, poisoned(20, 18),
                        0.0, 0.5, bias, "relu", config=cfg)
    ref = F.relu(0.5 * c.double() + bias.double())
    assert_close(out, ref, c.double().abs() + bias.double().abs(), 2e-3,
                 "NaN in A or B leaked through alpha = 0")


def test_c_overwritten_in_place():
    a, b, c, bias = operands(37, 29, 45, seed=5)
    ref, scale = reference(a, b, c, 0.5, 2.0, bias, "gelu")
    fs.fused_gemm(a, b, c, c, 0.5, 2.0, bias, "gelu")      # autotuned: may run several times
    assert_close(c, ref, scale, 2e-3, "out is C")


def test_two_runs_are_bitwise_equal_and_the_counters_end_at_zero():
    a, b, c, bias = operands(37, 45, 70, seed=3, layout="transposed")
    cfg = sk.make_config(split_k=4, **SMALL)
    outs = [fs.fused_gemm(a, b, c, poisoned(37, 45), 1.0, 1.0, bias, "gelu", config=cfg)
            for _ in range(2)]
    _, counts = sk._BUFFERS[outs[0].device]
    assert int(counts.abs().sum()) == 0, "a tile's counter was not reset"
    assert torch.equal(outs[0], outs[1])


def assert_clear_errors(fused_gemm, kernel, M, N, K):
    """A fused launcher's errors for a bias, an activation or a missing C it cannot take,
    and gl.gemm's for a batch given to a kernel that takes none."""
    a, b, c, bias = operands(M, N, K)
    out = poisoned(M, N)
    with pytest.raises(ValueError, match="bias must have shape"):
        fused_gemm(a, b, None, out, bias=bias[:5])
    with pytest.raises(ValueError, match="activation must be one of"):
        fused_gemm(a, b, None, out, activation="swish")
    with pytest.raises(ValueError, match="beta != 0 needs c"):
        fused_gemm(a, b, None, out, beta=1.0)
    with pytest.raises(ValueError, match="batched"):
        gl.gemm(a.unsqueeze(0).expand(2, -1, -1), b.unsqueeze(0).expand(2, -1, -1),
                kernel=kernel)


def test_bad_input_gets_a_clear_error():
    assert_clear_errors(fs.fused_gemm, "k09_fused_splitk", 8, 6, 5)


def test_it_shares_lesson_08s_configs_key_and_pruner():
    assert fs.fused_splitk_autotuned.keys == sk.splitk_autotuned.keys
    assert fs.fused_splitk_autotuned.configs == sk.CONFIGS + fs.FUSED_CONFIGS + sk.FP32_CONFIGS
    assert fs.fused_splitk_autotuned.early_config_prune is sk.prune
    labels = {sk.label(c) for c in sk.CONFIGS}
    assert not [c for c in fs.FUSED_CONFIGS if sk.label(c) in labels], "a config listed twice"


def test_the_pruner_keeps_fp32_and_fp16_configs_apart():
    every = fs.fused_splitk_autotuned.configs
    for M, N, K in ((512, 4096, 14336), (1024, 1024, 16384), (16, 4096, 4096)):
        half = sk.prune_for_gpu(every, torch.float16, sk.m_bucket(M), N, K, sms=132)
        single = sk.prune_for_gpu(every, torch.float32, sk.m_bucket(M), N, K, sms=132)
        assert half and not [c for c in half if c in sk.FP32_CONFIGS]
        assert single and all(c in sk.FP32_CONFIGS for c in single)
    # the taller split configs reach the mid shapes they were added for
    kept = sk.prune_for_gpu(every, torch.float16, 1024, 1024, 16384, sms=132)
    assert [c for c in kept if c in fs.FUSED_CONFIGS]


def test_the_epilogue_suite_writes_its_rows(tmp_path, tool):
    from gemm_lessons import results
    from gemm_lessons.labs import k09 as lab
    tool = tool("epilogue_suite")
    if not engines.on_gpu():
        assert tool.main(["--shape", "16x64x64"]) == 2        # times kernels: needs a GPU
    ms = {"k09_fused_splitk": 0.010, "torch eager": 0.012, "torch.compile": 0.011,
          "cuBLAS mm alone": 0.009}
    res = lab.EpilogueBench(16, 64, 64, torch.float16, "gelu", ms)
    path = tmp_path / "suite.csv"
    results.merge_csv(path, tool.rows_of(res, "k09_fused_splitk"))
    results.merge_csv(path, tool.rows_of(res, "k09_fused_splitk"))   # rewritten, not appended
    listed = [r for _, r in results.read_csv(path)[0]]
    rows = {r.kernel: r for r in listed}
    assert len(listed) == 5
    assert sorted(rows) == ["compile_vs_mm", "eager_vs_mm", "k09_fused_splitk_vs_compile",
                            "k09_fused_splitk_vs_eager", "k09_fused_splitk_vs_mm"]
    assert rows["k09_fused_splitk_vs_eager"].ratio == pytest.approx(1.2)
    assert rows["eager_vs_mm"].ms == pytest.approx(0.012)
    # a second run, of another kernel, adds its rows and leaves the first run's baselines
    other = lab.EpilogueBench(16, 64, 64, torch.float16, "gelu",
                              dict(ms, **{"k09_fused_tma": 0.030, "torch eager": 0.020}))
    results.merge_csv(path, tool.rows_of(other, "k09_fused_tma", baselines=False))
    rows = {r.kernel: r for _, r in results.read_csv(path)[0]}
    assert len(rows) == 8 and rows["eager_vs_mm"].ms == pytest.approx(0.012)
    assert rows["k09_fused_tma_vs_eager"].ratio == pytest.approx(0.020 / 0.030)


@pytest.mark.skipif(engines.on_gpu(), reason="compiles for sm_90 with this machine's Triton")
def test_the_widest_configs_do_not_spill_in_the_gelu_epilogue():
    from gemm_lessons import compiled, triton_asm
    wide = [c for c in sk.CONFIGS if c.kwargs["BLOCK_SIZE_N"] == 256]
    for c, res in zip(wide, triton_asm.compile_kernels([fs.asm_job(c) for c in wide])):
        rep = compiled.ptxas_report(res["ptx"], (9, 0))
        if rep is None:
            pytest.skip("no ptxas here")
        assert rep["spill_stores"] == 0 and rep["registers"] <= 255, (sk.label(c), rep)
