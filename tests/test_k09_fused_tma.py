"""Lesson 09 on Hopper: k09_fused_tma, the fused epilogue on TMA loads and a persistent grid.

Every output is NaN-poisoned before the kernel runs (where the test owns it) and compared
with a float64 reference. The tests prove what the TMA variant claims, not only its answers:
the BLAS promises hold (beta == 0 never reads C, alpha == 0 never reads A or B), ragged M, N
and K go through the TMA path (the copy engine's zero fill replaces masks), a transposed
weight and broadcast batches reach the descriptors as the caller's storage (no copy), what
TMA cannot address falls back to the pointer kernel (also without a copy), the persistent
loop covers every tile of every batch whatever the number of programs, a broken launch is
caught by the check, and on sm_90 the compiled kernel loads A and B by TMA into wgmma
without spilling.
"""
import gemm_lessons as gl  # first: it switches on Triton's interpreter when there is no GPU
import inspect
import re

import pytest
import torch
import torch.nn.functional as F

from gemm_lessons import engines, harness, triton_asm
from gemm_lessons.kernels import k09_fused_epilogue as k09
from gemm_lessons.kernels import k09_fused_tma as tma
from gemm_lessons.labs import k09 as lab
from test_k09_fused_epilogue import ACTS, Recorder, assert_close, reference

NAME = "k09_fused_tma"
DTYPES = [torch.float16, torch.bfloat16]
DEV = engines.device()
needs_tma = pytest.mark.skipif(not gl.runs_here("k09_fused_tma"), reason="TMA needs sm_90 (or the interpreter)")
pytestmark = needs_tma


@pytest.fixture
def rec(monkeypatch):
    """Record the launches of the TMA kernel and of the pointer kernel (the fallback)."""
    tma_rec = Recorder(tma.fused_tma_kernel)
    ptr_rec = Recorder(k09.fused_gemm_kernel)
    monkeypatch.setattr(tma, "fused_tma_kernel", tma_rec)
    monkeypatch.setattr(k09, "fused_gemm_kernel", ptr_rec)
    return tma_rec, ptr_rec


def rand(*shape, dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to(DEV)


def tma_launch(rec):
    """(args, kwargs) of the only TMA launch."""
    assert len(rec[0].calls) == 1 and rec[1].calls == [], "expected one TMA launch, no fallback"
    return rec[0].calls[0][1:]


# ------------------------------------------------------------------ the checks
def test_check_passes_in_every_dtype(rec):
    line = gl.check_anywhere("k09_fused_tma")
    assert line == "k09_fused_tma: correct on 9 shapes (bfloat16, float16)"
    # the suite exercises both paths: aligned shapes by TMA, odd ones by the fallback
    assert rec[0].calls and rec[1].calls


def test_a_grid_smaller_than_the_loop_step_fails_the_check(monkeypatch):
    # the persistence slip: the loop steps by NUM_SMS = 3, but only 1 program is launched
    real = tma.fused_tma_kernel

    class OneProgram:
        def __getitem__(self, grid):
            return real[(1,)]
    monkeypatch.setattr(tma, "fused_tma_kernel", OneProgram())
    cases = [c for c in harness.shape_suite() if c.name in ("square", "rectangular")]
    with pytest.raises(harness.CheckError, match="never written"):
        harness.check(lambda a, b, out: tma.fused_gemm_tma(a.unsqueeze(0), b.unsqueeze(0),
                                                           None, out.unsqueeze(0), sms=3),
                      "one_program", (torch.float16,), cases)


@pytest.mark.parametrize("sms", [1, 2, 5])
def test_the_persistent_loop_covers_every_tile_of_every_batch(sms):
    B, M, N, K = 3, 37, 40, 56                # 3 x 3 x 3 = 27 tiles of 16 x 16 per batch
    a, b, bias = rand(B, M, K), rand(K, N, seed=1), rand(N, seed=3)
    out = torch.full((B, M, N), float("nan"), dtype=torch.float16, device=DEV)
    tma.fused_gemm_tma(a, b.expand(B, K, N), None, out, 1.0, 0.0, bias, "gelu", sms=sms)
    for i in range(B):
        ref, scale = reference(a[i], b, None, 1.0, 0.0, bias, "gelu")
        assert_close(out[i], ref, scale, torch.float16, f"sms={sms}, batch {i}")


def test_a_batched_operand_read_as_broadcast_is_caught(monkeypatch):
    # a slip in the batch: A's descriptor built 2-D (batch 0 for every tile) though A has 3
    real = tma.as_descriptor

    def flat(t3, rows, cols, batch):
        d = real(t3, rows, cols, batch)
        if d is None or not d[1]:
            return d
        return real(t3[:1], rows, cols, 1)
    monkeypatch.setattr(tma, "as_descriptor", flat)
    a, b = rand(3, 16, 32), rand(32, 24, seed=1)
    out = gl.gemm(a, b, kernel=NAME)
    assert torch.allclose(out[0].double(), a[0].double() @ b.double(), atol=0.05)
    assert not torch.allclose(out[2].double(), a[2].double() @ b.double(), atol=0.05)


# ------------------------------------------------------------------ BLAS semantics
@pytest.mark.parametrize("dtype", DTYPES)
def test_alpha_beta_bias_and_each_activation_on_ragged_tiles(rec, dtype):
    M, N, K = 37, 40, 56        # ragged against the 16 x 16 x 16 tiles on every axis
    a, b = rand(M, K, dtype=dtype), rand(K, N, dtype=dtype, seed=1)
    c, bias = rand(M, N, dtype=dtype, seed=2), rand(N, dtype=dtype, seed=3)
    for act in ACTS:
        for alpha, beta in ((1.0, 0.0), (0.5, -1.5)):
            out = gl.gemm(a, b, c, alpha=alpha, beta=beta, bias=bias, activation=act,
                          kernel=NAME)
            ref, scale = reference(a, b, c, alpha, beta, bias, act)
            assert_close(out, ref, scale, dtype, f"{act} alpha={alpha} beta={beta}")
    assert len(rec[0].calls) == 2 * len(ACTS) and rec[1].calls == []   # all by TMA


def test_beta_zero_never_reads_c(rec):
    a, b = rand(20, 24), rand(24, 16, seed=1)
    c = torch.full((20, 16), float("nan"), dtype=torch.float16, device=DEV)
    bias = rand(16, seed=3)
    out = gl.gemm(a, b, c, alpha=1.5, beta=0.0, bias=bias, activation="gelu", kernel=NAME)
    ref, scale = reference(a, b, None, 1.5, 0.0, bias, "gelu")
    assert_close(out, ref, scale, torch.float16, "NaN in C leaked through beta = 0")
    args, kwargs = tma_launch(rec)
    assert kwargs["HAS_C"] is False and args[2] is not c      # C is not even passed


def test_alpha_zero_never_reads_a_or_b(rec):
    nan = float("nan")
    a = torch.full((20, 24), nan, dtype=torch.float16, device=DEV)
    b = torch.full((24, 16), nan, dtype=torch.float16, device=DEV)
    c, bias = rand(20, 16, seed=2), rand(16, seed=3)
    out = gl.gemm(a, b, c, alpha=0.0, beta=0.5, bias=bias, activation="leaky_relu",
                  kernel=NAME)
    ref = F.leaky_relu(0.5 * c.double() + bias.double(), 0.01)
    assert_close(out, ref, c.double().abs() + bias.double().abs(), torch.float16,
                 "NaN in A or B leaked through alpha = 0")
    assert rec[0].calls == [] and rec[1].calls == []     # no K loop ran: the epilogue alone


# ------------------------------------------------------------------ batches and layouts
@pytest.mark.parametrize("case, a3d, b3d", [("a batched, b shared", True, False),
                                            ("a shared, b batched", False, True),
                                            ("both batched, b batch of 1", True, False),
                                            ("both batched", True, True)])
def test_batches_use_3d_descriptors_and_broadcasts_are_not_copied(rec, case, a3d, b3d):
    B, M, N, K = 3, 19, 24, 40
    a = rand(M, K) if case == "a shared, b batched" else rand(B, M, K)
    b = {"a batched, b shared": rand(K, N, seed=1), "a shared, b batched": rand(B, K, N, seed=1),
         "both batched, b batch of 1": rand(1, K, N, seed=1),
         "both batched": rand(B, K, N, seed=1)}[case]
    c, bias = rand(M, N, seed=2), rand(N, seed=3)            # c broadcast over the batch too
    out = gl.gemm(a, b, c, alpha=0.75, beta=0.5, bias=bias, activation="relu", kernel=NAME)
    assert out.shape == (B, M, N)
    a3, b3 = a.expand(B, M, K), b.expand(B, K, N)
    for i in range(B):
        ref, scale = reference(a3[i], b3[i], c, 0.75, 0.5, bias, "relu")
        assert_close(out[i], ref, scale, torch.float16, f"{case}, batch {i}")
    args, kwargs = tma_launch(rec)
    assert (kwargs["A_3D"], kwargs["B_3D"]) == (a3d, b3d)
    a_desc, b_desc = args[0], args[1]
    assert a_desc.base.data_ptr() == a.data_ptr() and b_desc.base.data_ptr() == b.data_ptr()
    assert len(a_desc.shape) == (3 if a3d else 2) and len(b_desc.shape) == (3 if b3d else 2)
    assert args[2].data_ptr() == c.data_ptr() and args[9] == 0       # C's batch stride 0
    assert args[8] == B                                                 # BATCH


def test_transposed_weight_and_column_major_a_are_read_in_place(rec):
    M, N, K = 23, 29, 48                 # N and M odd: only the transposed storage is aligned
    W = rand(N, K, seed=1)               # nn.Linear's weight, (N, K); the layer is x @ W.t()
    x = rand(K, 24)[:, :M].t()           # column-major A, rows 48 bytes apart
    bias = rand(N, seed=3)
    out = gl.gemm(x, W.t(), bias=bias, activation="gelu", kernel=NAME)
    ref, scale = reference(x, W.t(), None, 1.0, 0.0, bias, "gelu")
    assert_close(out, ref, scale, torch.float16, "x @ W.t()")
    args, kwargs = tma_launch(rec)
    assert kwargs["A_TRANS"] and kwargs["B_TRANS"]
    assert args[1].base.data_ptr() == W.data_ptr() and list(args[1].shape) == [N, K]
    assert args[0].base.data_ptr() == x.data_ptr() and list(args[0].shape) == [K, M]
    # batched x @ W.t() (3-D A, 2-D transposed B), and a batched transposed B
    xb = rand(4, M, K, seed=4)
    Wb = rand(2, N, K, seed=5)
    for xx, bb in ((xb, W.t()), (xb[:2], Wb.transpose(1, 2))):
        out = gl.gemm(xx, bb, bias=bias, activation="relu", kernel=NAME)
        for i in range(xx.shape[0]):
            ref, scale = reference(xx[i], bb[i] if bb.dim() == 3 else bb, None, 1.0, 0.0,
                                   bias, "relu")
            assert_close(out[i], ref, scale, torch.float16, f"batched W.t(), batch {i}")


@pytest.mark.parametrize("what", ["K not a multiple of 8", "a misaligned slice",
                                  "a batch stride of 8k + 4", "a broadcast stride-0 column"])
def test_what_tma_cannot_address_falls_back_without_a_copy(rec, what):
    if what == "K not a multiple of 8":
        a, b = rand(20, 45), rand(45, 24, seed=1)       # A's rows 90 bytes apart
    elif what == "a misaligned slice":
        a, b = rand(21, 33)[1:, 1:], rand(32, 24, seed=1)  # base 2 bytes past 16
    elif what == "a batch stride of 8k + 4":
        a = torch.as_strided(rand(3 * 644), (3, 20, 32), (644, 32, 1))   # 1288 bytes apart
        b = rand(32, 24, seed=1)
    else:
        a, b = rand(20, 32), rand(32, 1, seed=1).expand(32, 24)   # stride (1, 0)
    a3 = a if a.dim() == 3 else a.unsqueeze(0)
    assert not tma.will_use_tma(a3.expand(a3.shape[0], *a3.shape[1:]),
                                b.unsqueeze(0).expand(a3.shape[0], *b.shape))
    bias = rand(24, seed=3)
    out = gl.gemm(a, b, bias=bias, activation="gelu", kernel=NAME)
    for i in range(a3.shape[0]):
        ref, scale = reference(a3[i], b, None, 1.0, 0.0, bias, "gelu")
        assert_close(out if a.dim() == 2 else out[i], ref, scale, torch.float16, what)
    assert rec[0].calls == [] and len(rec[1].calls) == 1        # the pointer kernel
    args = rec[1].calls[0][1]
    assert args[0].data_ptr() == a.data_ptr() and args[1].data_ptr() == b.data_ptr()


def test_aligned_operands_take_the_tma_path():
    a, b = rand(2, 64, 48), rand(48, 40, seed=1)
    assert tma.will_use_tma(a, b.expand(2, 48, 40))
    assert tma.will_use_tma(a, rand(40, 48).t().expand(2, 48, 40))      # W.t()
    assert not tma.will_use_tma(a, b.expand(2, 48, 40), alpha=0.0)


# ------------------------------------------------------------------ the compiled kernel
@pytest.mark.skipif(engines.on_gpu() and not gl.runs_here("k09_fused_tma"), reason="needs sm_90")
def test_on_hopper_a_and_b_move_by_tma_into_wgmma_without_spills():
    # bias + gelu, 2-D descriptors (the timed case); gelu alone, 3-D, B = W.t()
    s2, s3 = triton_asm.compile_kernels([
        tma.asm_job(torch.float16),
        tma.asm_job(torch.float16, batched=True, b_trans=True, bias=False)])
    for asm, dims in ((s2, "2d"), (s3, "3d")):
        ptx = asm["ptx"]
        assert triton_asm.grep(ptx, r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)") \
            == [f"m64n{tma.GPU_CONFIG.BLOCK_SIZE_N}k16"]
        assert triton_asm.grep(ptx, r"cp\.async\.bulk\.tensor\.(\dd)") == [dims]
        assert not triton_asm.grep(ptx, r"(cp\.async\.cg)")      # no per-thread copies
        if dims == "3d":          # no bias, beta == 0: no per-thread global load at all
            assert "ld.global" not in ptx
        if asm["sass"] and dims == "2d":     # the timed case: the tile's gelu does not spill
            assert not re.search(r"\bSTL\b", asm["sass"]), "the default configuration spills"
        assert asm["shared"] <= 227 * 1024


def test_same_epilogue_no_block_pointers():
    src = inspect.getsource(tma)
    # lesson 09's epilogue, not a copy of it: whole, or on the tile's two halves
    assert src.count("k09.epilogue(") == 1 and src.count("epilogue_in_halves(") == 1
    assert "make_block_ptr" not in src and "tl.advance" not in src


def test_bench_labels_each_kernel():
    res = lab.EpilogueBench(8, 8, 8, torch.float16, "gelu",
                            {"k09_fused_epilogue": 2.0, "k09_fused_tma": 1.6,
                             "torch eager": 1.8, "torch.compile": 1.7},
                            configs={"k09_fused_epilogue": "p", "k09_fused_tma": "t"})
    text = str(res)
    assert res.kernels == ["k09_fused_epilogue", "k09_fused_tma"]
    assert "k09_fused_epilogue is 0.90x this, k09_fused_tma is 1.12x this" in text
    assert res.ratio("torch.compile", "k09_fused_tma") == pytest.approx(1.7 / 1.6)
    if not engines.on_gpu():
        assert "not timed" in str(lab.bench_epilogue(64, 64, 64))
