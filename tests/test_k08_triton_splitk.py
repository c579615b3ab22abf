"""Lesson 08, split-K: right on every shape and stride with K cut in 1 to 4 slices (empty
slices included), the reduction adds the slices in a fixed order (bitwise equal runs, and
equal to the slices added by hand), the counters are left at zero, SPLIT_K = 1 touches no
workspace, and the pruner keeps what the lesson says it keeps."""
import gemm_lessons as gl  # first: it switches on Triton's interpreter when there is no GPU
import pytest
import torch

from gemm_lessons import harness
from gemm_lessons.kernels import k08_triton_splitk as sk
from gemm_lessons.shapes import SHAPES_LLM

FP16 = (torch.float16,)
# small tiles on the interpreter, so that the suite's shapes have several tiles and K steps
SMALL = dict(BM=16, BN=16, BK=8, num_warps=1, num_stages=1, group_size_m=2)
if gl.engine().kind == "cuda":
    SMALL = dict(BM=64, BN=64, BK=32, num_warps=4, num_stages=3)


def small(split_k):
    return sk.make_config(split_k=split_k, **SMALL)


def run_with(config):
    return lambda a, b, out: sk.matmul(a, b, out, config=config)


def test_check_passes_in_every_dtype():
    rep = gl.check("k08_triton_splitk")
    assert rep.ok
    assert str(rep) == "k08_triton_splitk: correct on 9 shapes (bfloat16, float16, float32)"


@pytest.mark.parametrize("split_k", [1, 3, 4])
def test_every_shape_and_stride_with_k_split(split_k):
    # the suite has K = 1 (every slice but the first is empty), ragged tiles, M = 1, N = 1,
    # transposed and sliced operands
    rep = harness.check(run_with(small(split_k)), f"split {split_k}", FP16, harness.shape_suite())
    assert rep.ok and rep.n_shapes == 9


def _operands(M=37, N=45, K=70, seed=3):
    return harness.make_operands(M, N, K, torch.float16, seed=seed, a="transposed")


def test_two_runs_are_bitwise_equal_and_the_counters_end_at_zero():
    a, b = _operands()
    outs = []
    for _ in range(2):
        out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=a.dtype, device=a.device)
        outs.append(sk.matmul(a, b, out, config=small(4)))
        ws, counts = sk._BUFFERS[out.device]
        assert int(counts.abs().sum()) == 0, "a tile's counter was not reset"
    assert torch.equal(outs[0], outs[1])
    ok, rel, _ = harness.compare(outs[0], harness.reference(a, b), a, b, torch.float16)
    assert ok, rel


def test_the_reduction_adds_the_slices_in_order():
    # each slice's fp32 partial, computed as a product of its own (SPLIT_K = 1, fp32 out),
    # added s = 0, 1, 2, 3 in fp32 and rounded once: the split kernel's exact bits
    a, b = _operands(M=33, N=40, K=100)
    cfg = small(4)
    BK = cfg.kwargs["BLOCK_SIZE_K"]
    k_per = -(-(-(-100 // 4)) // BK) * BK
    total = torch.zeros(33, 40, dtype=torch.float32, device=a.device)
    for s in range(4):
        part = slice(s * k_per, min((s + 1) * k_per, 100))
        p = torch.empty(33, 40, dtype=torch.float32, device=a.device)
        if part.start < part.stop:
            sk.matmul(a[:, part], b[part, :], p, config=small(1))
        else:
            p.zero_()
        total += p
    out = torch.empty(33, 40, dtype=torch.float16, device=a.device)
    sk.matmul(a, b, out, config=cfg)
    assert torch.equal(out, total.to(torch.float16))


def test_no_split_needs_no_workspace():
    sk._BUFFERS.clear()
    a, b = _operands()
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    sk.matmul(a, b, out, config=small(1))
    assert sk._BUFFERS == {}
    assert sk.workspace_elems(small(1), 100, 100) == 0
    BM, BN = SMALL["BM"], SMALL["BN"]
    assert sk.workspace_elems(small(3), 37, 45) == -(-37 // BM) * -(-45 // BN) * 3 * BM * BN


def test_the_workspace_grows_and_is_reused():
    sk._BUFFERS.clear()
    dev = harness.make_operands(1, 1, 1, torch.float16)[0].device
    ws1, c1 = sk.buffers(dev, 100, 4)
    ws2, c2 = sk.buffers(dev, 50, 2)
    assert ws2.data_ptr() == ws1.data_ptr() and c2.data_ptr() == c1.data_ptr()
    ws3, c3 = sk.buffers(dev, 1000, 8)
    assert ws3.numel() >= 1000 and c3.numel() >= 8 and int(c3.abs().sum()) == 0


def test_bad_input_gets_a_clear_error():
    a, b = _operands()
    with pytest.raises(ValueError, match="shapes do not match"):
        gl.matmul(a, b.t(), kernel="k08_triton_splitk")
    with pytest.raises(TypeError):
        gl.matmul(a.to(torch.int32), b.to(torch.int32), kernel="k08_triton_splitk")
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    with pytest.raises(ValueError, match="SPLIT_K"):
        sk.matmul(a, b, out, config=sk.make_config(16, 16, 16, 1, 1, split_k=0))


def test_the_key_is_the_shape_bucket():
    assert sk.splitk_autotuned.keys == ["M_BUCKET", "N", "K"]
    assert [sk.m_bucket(m) for m in (1, 13, 16, 17, 100, 128, 129, 8192)] == \
        [16, 16, 16, 32, 128, 128, 256, 8192]


def test_the_configs_are_distinct_and_fit():
    seen = {(tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages) for c in sk.CONFIGS}
    assert len(seen) == len(sk.CONFIGS), "a config is listed twice"
    assert {c.kwargs["SPLIT_K"] for c in sk.CONFIGS} >= {1, 2, 4}
    assert {c.kwargs["BLOCK_SIZE_M"] for c in sk.CONFIGS} >= {16, 32, 64, 128}
    for c in sk.CONFIGS:
        assert sk.smem_bytes(c, torch.float16) <= sk.SMEM_LIMIT, sk.label(c)


def test_the_pruner_splits_only_where_tiles_are_few():
    every = sk.CONFIGS + sk.FP32_CONFIGS
    # 16 rows of tokens: only 16-row tiles; splits, each slice at least 4 K steps deep
    decode = sk.prune_for_gpu(every, torch.float16, 16, 4096, 4096, sms=132)
    assert decode and {c.kwargs["BLOCK_SIZE_M"] for c in decode} == {16}
    assert any(c.kwargs["SPLIT_K"] > 1 for c in decode)
    for c in decode:
        BM, BN, BK, S = sk._kw(c)
        assert 4096 // S >= sk.MIN_K_TILES_PER_SPLIT * BK
        assert 2 * sk.programs(c, 16, 4096) >= 132
        assert sk.programs(c, 16, 4096) <= sk.MAX_WAVES_SPLIT * 132
    # a large output fills the GPU with its tiles: no split, no short tiles
    big = sk.prune_for_gpu(every, torch.float16, 8192, 4096, 4096, sms=132)
    assert big and all(c.kwargs["SPLIT_K"] == 1 for c in big)
    assert all(c in sk.CONFIGS for c in big)
    assert sk.prune_for_gpu(every, torch.float32, 8192, 4096, 4096, sms=132) \
        == [c for c in sk.FP32_CONFIGS if c.kwargs["SPLIT_K"] == 1
            and c.kwargs["BLOCK_SIZE_M"] >= 64]
    # no tile shorter than 64 rows where the output has 64 rows or more
    assert all(c.kwargs["BLOCK_SIZE_M"] >= 64 for c in big)
    # every shape of the suite keeps something, and not too much to time
    for M, N, K in SHAPES_LLM:
        kept = sk.prune_for_gpu(every, torch.float16, sk.m_bucket(M), N, K, sms=132)
        assert 1 <= len(kept) <= 16, (M, N, K, len(kept))
    if gl.engine().kind != "cuda":
        a16 = torch.empty(2, 2, dtype=torch.float16)
        assert sk.prune(every, {"a_ptr": a16, "M_BUCKET": 16, "N": 2, "K": 2}) == \
            [sk.INTERPRETER_CONFIG]


def test_waves_count_programs_per_sm():
    cfg = sk.make_config(16, 128, 128, 4, 4, split_k=4)
    assert sk.programs(cfg, 16, 4096) == 32 * 4
    assert sk.waves(cfg, 16, 4096, sms=132) == pytest.approx(128 / 132)


def test_the_autotuner_times_configs_with_different_splits_on_one_workspace():
    # three configs, K cut in 1, 2 and 3, timed under one key (a CPU timer off the GPU):
    # the workspace fits the largest, and every launch leaves the counters at zero
    cfgs = [small(1), small(2), small(3)]
    tuned = sk.autotune(configs=cfgs, prune_configs=None,
                        do_bench=None if gl.engine().kind == "cuda" else sk.cpu_timer)
    rep = harness.check(lambda a, b, out: sk.matmul(a, b, out, kernel=tuned), "tuned", FP16,
                        harness.shape_suite()[:3])
    assert rep.ok
    assert len(tuned.configs_timings) == 3 and tuned.best_config in cfgs
    _, counts = sk._BUFFERS[harness.make_operands(1, 1, 1, torch.float16)[0].device]
    assert int(counts.abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_pruner_keeps_a_config_for_every_shape_and_dtype(dtype):
    every = sk.CONFIGS + sk.FP32_CONFIGS
    wanted = sk.FP32_CONFIGS if dtype == torch.float32 else sk.CONFIGS
    for M in (1, 16, 17, 33, 64, 100, 1000, 8192):
        for N, K in ((1, 1), (64, 16384), (4096, 4096), (14336, 4096)):
            kept = sk.prune_for_gpu(every, dtype, sk.m_bucket(M), N, K, sms=132)
            assert kept and all(c in wanted for c in kept), (M, N, K, dtype)


def test_rows_of_8_halves_are_copied_16_bytes_at_a_time():
    # K = 2520 and N = 4744 are multiples of 8 but not of 16. Triton proves divisibility by 16
    # alone, so without DIV it loads such rows 2 bytes at a time and cannot pipeline them;
    # the launcher's DIV says 8, and every copy is a 16-byte cp.async (A row-major,
    # B = W.t() of an (N, K) weight, C row-major: as nn.Linear calls it)
    import re
    from gemm_lessons import triton_asm
    M, N, K = 120, 4744, 2520
    div = sk.aligned((K, N, K, 1, 1, K, N, 1), 2)
    assert div == (8, 8, 8, 1, 1, 8, 8, 1)
    assert sk.aligned((K + 1, N, 1, 4, 0, 3, N, 1), 2) == (1, 8, 1, 4, 8, 1, 8, 1)
    assert sk.aligned((9238, 1810, 12, 6, 4), 2) == (2, 2, 4, 2, 4)
    assert sk.aligned((12, 6, 3), 4) == (4, 2, 1)     # fp32: 4 elements in 16 bytes
    job = sk.asm_job(sk.make_config(64, 128, 64, 4, 4, split_k=2), M=M, N=N, K=K)
    job["args"].update(stride_bk=1, stride_bn=K)
    job["constants"]["DIV"] = div
    ptx = triton_asm.compile_kernels([job])[0]["ptx"]
    assert "ld.global.b16" not in ptx
    assert len(re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", ptx)) >= 8


def test_rows_of_an_even_number_of_halves_are_still_pipelined():
    # K = 9238 and N = 1810 are even, not multiples of 8: DIV says 2, so the loads are 4
    # bytes wide, which cp.async takes (its pipeline runs), instead of 2-byte loads
    import re
    from gemm_lessons import triton_asm
    M, N, K = 145, 1810, 9238
    strides = dict(stride_am=K, stride_ak=1, stride_bk=N, stride_bn=1, stride_cm=N,
                   stride_cn=1)
    counts = []
    for div in ((1,) * 8, sk.aligned((K, N, K, 1, N, 1, N, 1), 2)):
        job = sk.asm_job(sk.make_config(64, 128, 64, 4, 4, split_k=2), M=M, N=N, K=K)
        job["args"].update(strides)
        job["constants"]["DIV"] = div
        ptx = triton_asm.compile_kernels([job])[0]["ptx"]
        counts.append(len(re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]*\], "
                                     r"\[[^]]*\], 0x4", ptx)))
    assert counts[0] == 0 and counts[1] >= 32, counts


@pytest.mark.parametrize("layout", ["row", "wt"])
def test_sizes_that_are_multiples_of_8_compute_the_product(layout):
    # the path where the launcher passes DIV = 8 for K, N and the strides
    M, N, K = 5, 24, 40
    a, b = harness.make_operands(M, N, K, torch.float16, seed=5,
                                 b="transposed" if layout == "wt" else "row")
    assert sk.aligned((K, N, *a.stride(), *b.stride()), 2)[:4] == (8, 8, 8, 1)
    out = torch.full((M, N), float("nan"), dtype=a.dtype, device=a.device)
    sk.matmul(a, b, out, config=small(2))
    ok, rel, _ = harness.compare(out, harness.reference(a, b), a, b, torch.float16)
    assert ok, rel
