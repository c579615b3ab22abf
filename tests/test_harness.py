"""The harness must catch wrong kernels: prove every check can fail."""
import pytest
import torch

from gemm_lessons import harness
from gemm_lessons.harness import Case, CheckError

SMALL = [Case("ragged", 13, 11, 7, hint="edge"), Case("K=1", 9, 5, 1, hint="K tail"),
         Case("A transposed", 8, 6, 5, a="transposed", hint="strides"),
         Case("sliced", 7, 6, 9, a="sliced", b="sliced", hint="strides")]


def torch_mm(a, b, out):
    out.copy_(a @ b)


def test_suite_covers_the_awkward_shapes():
    suite = harness.shape_suite(gpu=False)
    names = [c.name for c in suite]
    assert len(suite) == 9 and len(set(names)) == 9
    assert {"M=1", "N=1", "K=1", "A transposed", "B transposed", "sliced"} <= set(names)
    for c in harness.shape_suite(gpu=True) + suite:
        assert min(c.M, c.N, c.K) >= 1
    ragged = [c for c in suite + harness.shape_suite(gpu=True) if c.name == "ragged"]
    for c in ragged:
        assert all(d % 2 == 1 for d in (c.M, c.N, c.K)), "ragged sizes must be odd"


def test_operands_are_seeded_random_and_laid_out():
    a1, b1 = harness.make_operands(6, 5, 4, seed=3)
    a2, b2 = harness.make_operands(6, 5, 4, seed=3)
    assert torch.equal(a1, a2) and torch.equal(b1, b2)
    assert (a1 != 0).all() and a1.std() > 0.5
    at, bt = harness.make_operands(6, 5, 4, a="transposed", b="sliced")
    assert at.shape == (6, 4) and not at.is_contiguous() and at.stride() == (1, 6)
    assert bt.shape == (4, 5) and bt.stride(0) == 8 and bt.storage_offset() > 0
    h, _ = harness.make_operands(6, 5, 4, torch.float16)
    assert h.dtype == torch.float16


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_correct_product_passes_in_every_dtype(dtype):
    rep = harness.check(torch_mm, "torch", (dtype,), SMALL)
    assert rep.ok and "correct on 4 shapes" in str(rep)


def test_unwritten_output_fails_thanks_to_nan_poison():
    def skip_last_row(a, b, out):
        out[:-1] = a[:-1] @ b
    with pytest.raises(CheckError) as e:
        harness.check(skip_last_row, "skip_last_row", cases=SMALL[:1])
    msg = str(e.value)
    assert "never written" in msg and "row 12" in msg and "C[12, 0]" in msg


def test_zeros_fail():
    with pytest.raises(CheckError, match="wrong"):
        harness.check(lambda a, b, out: out.zero_(), "zeros", cases=SMALL[:1])


def test_one_wrong_element_in_a_large_result_fails():
    def one_off(a, b, out):
        out.copy_(a @ b)
        out[5, 7] += 1e-2
    case = Case("square", 64, 64, 64)
    with pytest.raises(CheckError, match=r"1 of 4096 elements wrong[\s\S]*C\[5, 7\]"):
        harness.check(one_off, "one_off", cases=[case])


def test_k_tail_and_stride_bugs_name_a_likely_cause():
    def drop_k_tail(a, b, out):          # forgets the last partial K step of 4
        k = (a.shape[1] // 4) * 4
        out.copy_(a[:, :k] @ b[:k] if k else torch.zeros_like(out))
    with pytest.raises(CheckError, match="Likely cause: K tail"):
        harness.check(drop_k_tail, "drop_k_tail", cases=SMALL[1:2])

    def assume_contiguous(a, b, out):    # reads storage as if it were row-major
        a_ = torch.as_strided(a, a.shape, (a.shape[1], 1))
        out.copy_(a_ @ b)
    with pytest.raises(CheckError, match="Likely cause: strides"):
        harness.check(assume_contiguous, "assume_contiguous", cases=SMALL[2:3])


def test_fp16_tolerance_rejects_fp16_accumulation_error():
    # a result rounded through bf16 is too coarse for an fp16 kernel's tolerance
    def bf16_rounded(a, b, out):
        out.copy_((a.double() @ b.double()).to(torch.bfloat16).to(out.dtype))
    with pytest.raises(CheckError):
        harness.check(bf16_rounded, "bf16_rounded", (torch.float16,), [Case("square", 32, 32, 32)])


def test_bench_on_simulator_times_nothing_and_says_why():
    if torch.cuda.is_available():
        pytest.skip("simulator path")
    r = harness.bench(torch_mm, "torch", 16)
    assert r.ms is None and r.ratio is None and "need a GPU" in str(r)


def test_fp16_subnormal_results_are_judged_by_their_absolute_step():
    # K=1 products of tiny values land among fp16's subnormals, where the spacing is 2**-24:
    # a correctly rounded fp16 result must pass even though its relative error is large
    a = torch.full((4, 1), 3.0e-3, dtype=torch.float16)
    b = torch.full((1, 4), 3.7e-3, dtype=torch.float16)
    ref = harness.reference(a, b)
    out = ref.to(torch.float16)
    ok, rel, bad = harness.compare(out, ref, a, b, torch.float16)
    assert ok, (rel, out[0, 0].item(), ref[0, 0].item())
    out[0, 0] += 2 ** -22            # four subnormal steps off: wrong
    assert not harness.compare(out, ref, a, b, torch.float16)[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_graph_timing_replays_the_calls_and_refuses_what_cannot_be_captured():
    a = torch.randn(64, 64, device="cuda")
    out = torch.empty_like(a)
    calls = []

    def mm():
        calls.append(1)
        torch.mm(a, a, out=out)

    ms = harness.time_cuda_many({"mm": mm}, min_batch_ms=1.0, batches=3, graph=True)
    assert ms["mm"] > 0
    graph = harness.cuda_graph_of(mm, 3)
    assert len(calls) >= 4                  # one call before the capture, three captured
    n = len(calls)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert len(calls) == n                  # a replay runs the kernels, not the Python
    assert torch.allclose(out, a.double().mm(a.double()).float(), rtol=1e-3, atol=1e-3)
    with pytest.raises(RuntimeError, match="CUDA graph"):
        harness.cuda_graph_of(lambda: torch.cuda.synchronize(), 2)
