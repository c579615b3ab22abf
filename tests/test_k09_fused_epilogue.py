"""Lesson 09: BLAS semantics and the fused epilogue, batches and split-K.

Every output is NaN-poisoned before the kernel runs and compared with a float64 reference
of ``act(alpha * A @ B + beta * C + bias)``. The tests prove the lesson's points, not only
the answers: beta == 0 never reads C and alpha == 0 never reads A or B (NaN there does not
leak), a broadcast operand reaches the kernel as a stride-0 view of the caller's storage
(no copy), so does a transposed one, split-K sums every slice before the epilogue, and the
checks fail on a GEMM that gets these wrong.
"""
import gemm_lessons as gl  # first: it switches on Triton's interpreter when there is no GPU
import pytest
import torch
import torch.nn.functional as F

from gemm_lessons import engines
from gemm_lessons.common import sm_count
from gemm_lessons.kernels import k09_fused_epilogue as k09
from gemm_lessons.labs import k09 as lab

KERNELS = ["k09_fused_epilogue", "k09_split_k"]
ACTS = [None, "relu", "gelu", "leaky_relu"]
# bf16 runs only on a GPU: Triton's interpreter has no bf16 matmul (see the kernel)
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if engines.on_gpu() else [])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DEV = engines.device()


# ------------------------------------------------------------------ instruments
class Recorder:
    """Stands in for a @triton.jit kernel: records each launch's grid and arguments, then
    launches the real kernel."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.fixture
def rec(monkeypatch):
    """Record the launches of both kernels; poison every output before the kernels run."""
    gemm_rec = Recorder(k09.fused_gemm_kernel)
    epi_rec = Recorder(k09.splitk_epilogue_kernel)
    monkeypatch.setattr(k09, "fused_gemm_kernel", gemm_rec)
    monkeypatch.setattr(k09, "splitk_epilogue_kernel", epi_rec)
    real = k09.fused_gemm

    def poisoned(a3, b3, c3, out, *args, **kwargs):
        out.fill_(float("nan"))
        return real(a3, b3, c3, out, *args, **kwargs)
    monkeypatch.setattr(k09, "fused_gemm", poisoned)
    return gemm_rec, epi_rec


def rand(*shape, dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to(DEV)


ACT64 = {None: lambda x: x, "relu": F.relu, "gelu": F.gelu,
         "leaky_relu": lambda x: F.leaky_relu(x, 0.01)}


def reference(a, b, c=None, alpha=1.0, beta=0.0, bias=None, activation=None):
    """act(alpha * a @ b + beta * c + bias) in float64, with BLAS's zero rules; and the
    scale of each element (what its rounding error is relative to)."""
    ab = a.double() @ b.double()
    y = alpha * ab if alpha != 0 else torch.zeros_like(ab)
    scale = abs(alpha) * (a.double().abs() @ b.double().abs()) if alpha != 0 else 0 * ab
    if beta != 0:
        y = y + beta * c.double()
        scale = scale + abs(beta) * c.double().abs()
    if bias is not None:
        y = y + bias.double()
        scale = scale + bias.double().abs()
    return ACT64[activation](y), scale


def assert_close(out, ref, scale, dtype, what=""):
    assert out.dtype == dtype, what
    assert tuple(out.shape) == tuple(ref.shape), what
    out64 = out.double()
    assert not torch.isnan(out64).any(), f"{what}: NaN in the output (unwritten or leaked)"
    err = (out64 - ref).abs()
    bound = TOL[dtype] * (scale + ref.abs()) + 1e-6
    bad = err > bound
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} elements wrong; "
                           f"worst error {err.max().item():.2e}")


# ------------------------------------------------------------------ the checks
@pytest.mark.parametrize("name", KERNELS)
def test_check_passes(name):
    rep = gl.check(name, dtypes=DTYPES)
    assert rep.ok and rep.n_shapes == 9, str(rep)


def test_check_catches_a_split_k_that_drops_a_slice(monkeypatch):
    real = k09._splitk_epilogue

    def lossy(ws, S, *args):     # the second pass forgets the last slice
        return real(ws, max(S - 1, 0), *args)
    monkeypatch.setattr(k09, "_splitk_epilogue", lossy)
    with pytest.raises(gl.CheckError, match="k09_split_k is wrong"):
        gl.check("k09_split_k", dtypes=(torch.float32,))


# ------------------------------------------------------------------ BLAS semantics
@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_alpha_beta_bias_and_each_activation(rec, name, dtype):
    M, N, K = 37, 29, 45                                  # a ragged edge on every axis
    a, b, c = rand(M, K, dtype=dtype), rand(K, N, dtype=dtype, seed=1), rand(M, N, dtype=dtype, seed=2)
    bias = rand(N, dtype=dtype, seed=3)
    for act in ACTS:
        for alpha, beta in ((1.0, 0.0), (0.5, -1.5), (-2.0, 1.0)):
            out = gl.gemm(a, b, c, alpha=alpha, beta=beta, bias=bias, activation=act,
                          kernel=name)
            ref, scale = reference(a, b, c, alpha, beta, bias, act)
            assert_close(out, ref, scale, dtype, f"{name} {act} alpha={alpha} beta={beta}")


def test_activations_match_torch_where_they_bend():
    # values around 0 and in gelu's curved range: the exact erf gelu, not the tanh one
    x = torch.linspace(-4, 4, 32, dtype=torch.float32).reshape(1, 32).to(DEV)
    eye = torch.eye(32, dtype=torch.float32, device=DEV)
    for act in ACTS:
        out = gl.gemm(eye, x.reshape(32, 1).expand(32, 32).contiguous(), activation=act)
        ref = ACT64[act](x.double().reshape(32, 1).expand(32, 32))
        assert (out.double() - ref).abs().max().item() < 1e-5, act   # fp32 rounding of values up to 4
    tanh_gelu = F.gelu(x.double(), approximate="tanh")
    assert (tanh_gelu - F.gelu(x.double())).abs().max() > 1e-4   # the test can tell them apart


@pytest.mark.parametrize("name", KERNELS)
def test_beta_zero_never_reads_c(rec, name):
    a, b = rand(20, 24), rand(24, 18, seed=1)
    c = torch.full((20, 18), float("nan"), dtype=torch.float16, device=DEV)
    bias = rand(18, seed=3)
    out = gl.gemm(a, b, c, alpha=1.5, beta=0.0, bias=bias, activation="gelu", kernel=name)
    ref, scale = reference(a, b, None, 1.5, 0.0, bias, "gelu")
    assert_close(out, ref, scale, torch.float16, "NaN in C leaked through beta = 0")
    for _, _, kwargs in rec[0].calls + rec[1].calls:
        assert kwargs["HAS_C"] is False


@pytest.mark.parametrize("name", KERNELS)
def test_alpha_zero_never_reads_a_or_b(rec, name):
    nan = float("nan")
    a = torch.full((20, 24), nan, dtype=torch.float16, device=DEV)
    b = torch.full((24, 18), nan, dtype=torch.float16, device=DEV)
    c, bias = rand(20, 18, seed=2), rand(18, seed=3)
    out = gl.gemm(a, b, c, alpha=0.0, beta=0.5, bias=bias, activation="relu", kernel=name)
    ref = F.relu(0.5 * c.double() + bias.double())
    assert_close(out, ref, c.double().abs() + bias.double().abs(), torch.float16,
                 "NaN in A or B leaked through alpha = 0")
    assert rec[0].calls == []          # the GEMM kernel never ran: only the epilogue did


def test_the_nan_checks_can_fail(rec, monkeypatch):
    # a GEMM that computes beta * C even when beta == 0 leaks C's NaN: the test above sees it
    monkeypatch.setattr(k09, "blas_reads", lambda alpha, beta: (True, True))
    a, b = rand(20, 24), rand(24, 18, seed=1)
    c = torch.full((20, 18), float("nan"), dtype=torch.float16, device=DEV)
    out = gl.gemm(a, b, c, beta=0.0)
    assert torch.isnan(out).all()


# ------------------------------------------------------------------ batches and strides
def _launched(rec):
    return rec[0].calls[0][1]        # positional args of the first GEMM launch


@pytest.mark.parametrize("case", ["a batched, b shared", "a shared, b batched",
                                  "both batched, b batch of 1", "both batched"])
def test_batched_with_a_broadcast_operand_is_not_copied(rec, case):
    B, M, N, K = 3, 19, 21, 34
    a = rand(B, M, K) if case != "a shared, b batched" else rand(M, K)
    b = {"a batched, b shared": rand(K, N, seed=1), "a shared, b batched": rand(B, K, N, seed=1),
         "both batched, b batch of 1": rand(1, K, N, seed=1),
         "both batched": rand(B, K, N, seed=1)}[case]
    c = rand(M, N, seed=2)                   # broadcast over the batch too
    bias = rand(N, seed=3)
    out = gl.gemm(a, b, c, alpha=0.75, beta=0.5, bias=bias, activation="leaky_relu")
    assert out.shape == (B, M, N)
    a3, b3 = a.expand(B, M, K), b.expand(B, K, N)
    for i in range(B):
        ref, scale = reference(a3[i], b3[i], c, 0.75, 0.5, bias, "leaky_relu")
        assert_close(out[i], ref, scale, torch.float16, f"{case}, batch {i}")
    args = _launched(rec)
    ka, kb, kc = args[0], args[1], args[2]
    # what reached the kernel is the caller's storage, a broadcast one with batch stride 0
    assert ka.data_ptr() == a.data_ptr() and kb.data_ptr() == b.data_ptr()
    assert kc.data_ptr() == c.data_ptr() and kc.stride(0) == 0
    if a.dim() == 2:
        assert ka.stride(0) == 0
    if b.dim() == 2 or b.shape[0] == 1:
        assert kb.stride(0) == 0
    strides = args[8:21]                      # stride_ab ... stride_on, as launched
    assert strides[0] == ka.stride(0) and strides[3] == kb.stride(0) and strides[6] == 0


@pytest.mark.parametrize("batch", [1, 2])
def test_a_3d_c_gives_a_3d_result_like_torch(batch):
    # 2-D a and b with a 3-D c: the result has c's shape, as torch's a @ b + c has
    a, b, c = rand(9, 16), rand(16, 12, seed=1), rand(batch, 9, 12, seed=2)
    out = gl.gemm(a, b, c, beta=1.0)
    assert out.shape == torch.broadcast_shapes((9, 12), c.shape) == (batch, 9, 12)
    for i in range(batch):
        ref, scale = reference(a, b, c[i], 1.0, 1.0)
        assert_close(out[i], ref, scale, torch.float16, f"batch {i}")
    assert gl.gemm(a, b, c).shape == (batch, 9, 12)          # beta == 0: same shape


def test_batch_of_split_k(rec):
    B, M, N, K = 2, 9, 12, 300                 # K long, output tiny: the rule splits
    a, b, bias = rand(B, M, K), rand(K, N, seed=1), rand(N, seed=3)
    out = gl.gemm(a, b, bias=bias, activation="gelu", kernel="k09_split_k")
    for i in range(B):
        ref, scale = reference(a[i], b, None, 1.0, 0.0, bias, "gelu")
        assert_close(out[i], ref, scale, torch.float16, f"batch {i}")
    grid = rec[0].calls[0][0]
    assert grid[1] == B and grid[2] > 1


def test_a_batch_beyond_the_grid_limit_runs_in_chunks(rec, monkeypatch):
    monkeypatch.setattr(k09, "MAX_GRID_YZ", 2)           # as if 65535 were 2
    a, b = rand(5, 9, 20), rand(20, 11, seed=1)
    out = gl.gemm(a, b, bias=rand(11, seed=3), activation="relu")
    for i in range(5):
        ref, scale = reference(a[i], b, None, 1.0, 0.0, rand(11, seed=3), "relu")
        assert_close(out[i], ref, scale, torch.float16, f"batch {i}")
    assert [call[0][1] for call in rec[0].calls] == [2, 2, 1]


@pytest.mark.parametrize("name", KERNELS)
def test_transposed_and_sliced_operands_are_used_in_place(rec, name):
    M, N, K = 23, 17, 40
    a = rand(K, M).t()                                   # column-major
    b = rand(K + 5, N + 7, seed=1)[3:3 + K, 2:2 + N]     # a slice: offset storage, row stride N+7
    c = rand(N, M, seed=2).t()                           # C transposed too
    bias = rand(2 * N, seed=3)[::2]                      # a strided bias
    out = gl.gemm(a, b, c, alpha=1.25, beta=-0.5, bias=bias, activation="gelu", kernel=name)
    ref, scale = reference(a, b, c, 1.25, -0.5, bias, "gelu")
    assert_close(out, ref, scale, torch.float16, name)
    args = _launched(rec)
    assert args[0].data_ptr() == a.data_ptr() and args[0].stride()[1:] == a.stride()
    assert args[1].data_ptr() == b.data_ptr() and args[1].stride()[1:] == b.stride()
    if name == "k09_fused_epilogue":
        assert args[2].data_ptr() == c.data_ptr() and args[3].data_ptr() == bias.data_ptr()


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kwargs, match", [
    (dict(bias="wrong shape"), "bias must have shape"),
    (dict(bias="2-D"), "bias must have shape"),
    (dict(activation="swish"), "unknown activation"),
    (dict(activation="GELU"), "unknown activation"),
    (dict(beta=1.0), "pass c"),
])
def test_bad_input_is_a_value_error(kwargs, match):
    a, b = rand(8, 6), rand(6, 5, seed=1)
    if kwargs.get("bias") == "wrong shape":
        kwargs["bias"] = rand(6)
    elif kwargs.get("bias") == "2-D":
        kwargs["bias"] = rand(1, 5)
    with pytest.raises(ValueError, match=match):
        gl.gemm(a, b, **kwargs)


def test_batch_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match="batch sizes differ"):
        gl.gemm(rand(3, 8, 6), rand(2, 6, 5))
    with pytest.raises(ValueError, match="c must have shape"):
        gl.gemm(rand(3, 8, 6), rand(6, 5), rand(2, 8, 5), beta=1.0)


# ------------------------------------------------------------------ split-K
def test_split_k_rule():
    rule = k09.split_k_rule
    cfg = dict(block_m=128, block_n=128, block_k=64, sms=132)
    assert rule(256, 256, 65536, **cfg) == 33        # 4 tiles, 1024 K steps: about one wave
    assert rule(8192, 16384, 4096, **cfg) == 1       # 8192 tiles fill the GPU: no split
    assert rule(256, 256, 512, **cfg) == 1           # 8 K steps: too short to cut
    assert rule(256, 256, 1024, **cfg) == 2          # 16 K steps: two slices of 8
    assert rule(256, 256, 65536, 16, **cfg) == 2     # a batch of 16 has 64 tiles
    assert rule(256, 256, 65536, 40, **cfg) == 1     # 160 tiles: already a wave
    assert rule(64, 64, 10 ** 7, **cfg) == k09.MAX_SPLIT_K


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_k_equals_no_split(dtype):
    M, N, K = 18, 22, 333                       # K is not a multiple of the slice or the tile
    a, b, c = rand(M, K, dtype=dtype), rand(K, N, dtype=dtype, seed=1), rand(M, N, dtype=dtype, seed=2)
    bias = rand(N, dtype=dtype, seed=3)
    ref, scale = reference(a, b, c, 0.5, 2.0, bias, "gelu")
    outs = {}
    for s in (1, 2, 3, 7, "auto"):
        out = torch.full((1, M, N), float("nan"), dtype=dtype, device=DEV)
        k09.fused_gemm(a.unsqueeze(0), b.unsqueeze(0), c.unsqueeze(0), out, 0.5, 2.0, bias,
                       "gelu", split_k=s)
        assert_close(out[0], ref, scale, dtype, f"split_k={s}")
        outs[s] = out[0].double()
    for s in (2, 3, 7, "auto"):                 # same answer, up to the order of the sums
        assert ((outs[s] - outs[1]).abs() <= 2 * TOL[dtype] * (scale + ref.abs())).all()


def test_gemm_splits_where_the_rule_says(rec):
    # off the GPU the rule sees 132 SMs and 16 x 16 x 16 tiles (the interpreter's config)
    cfg = k09.default_config(torch.float16)
    a, b = rand(16, 1024), rand(1024, 16, seed=1)
    want = k09.split_k_rule(16, 16, 1024, block_m=cfg.BLOCK_SIZE_M, block_n=cfg.BLOCK_SIZE_N,
                            block_k=cfg.BLOCK_SIZE_K, sms=sm_count())
    out = gl.gemm(a, b, bias=rand(16, seed=3), activation="relu")
    ref, scale = reference(a, b, None, 1.0, 0.0, rand(16, seed=3), "relu")
    assert_close(out, ref, scale, torch.float16, "auto split")
    if not engines.on_gpu():
        assert want == 8
    grid = rec[0].calls[0][0]
    assert grid[2] == want and len(rec[1].calls) == 1       # sliced, then the second pass
    rec[0].calls.clear(), rec[1].calls.clear()
    gl.gemm(rand(64, 32), rand(32, 48, seed=1))          # short K: one pass, no workspace
    assert rec[0].calls[0][0][2] == 1 and rec[1].calls == []


def test_split_k_applies_the_epilogue_once_after_the_full_sum(rec):
    # the partials are stored raw (no bias, no activation); the epilogue runs on their sum
    BK = k09.default_config(torch.float32).BLOCK_SIZE_K
    K = 4 * BK                                   # four slices of one K step each
    a, b = rand(16, K, dtype=torch.float32), rand(K, 16, dtype=torch.float32, seed=1)
    bias = rand(16, dtype=torch.float32, seed=3)
    out = torch.full((1, 16, 16), float("nan"), device=DEV)
    k09.fused_gemm(a.unsqueeze(0), b.unsqueeze(0), None, out, 1.0, 0.0, bias, "gelu", split_k=4)
    (_, args, kwargs), = rec[0].calls
    assert kwargs["IS_SPLIT"] and kwargs["ACTIVATION"] == 0 and not kwargs["HAS_BIAS"]
    ws = args[4]
    assert ws.dtype == torch.float32 and ws.shape[0] == 4
    parts = a.double().reshape(16, 4, BK).permute(1, 0, 2) @ b.double().reshape(4, BK, 16)
    assert torch.allclose(ws[:, 0].double(), parts, atol=1e-4)     # slice p: K[p*BK:(p+1)*BK]
    (_, eargs, ekw), = rec[1].calls
    assert ekw["ACTIVATION"] == k09.ACTIVATION_CODES["gelu"] and ekw["HAS_BIAS"]
    ref, scale = reference(a, b, None, 1.0, 0.0, bias, "gelu")
    assert_close(out[0], ref, scale, torch.float32, "split into 4")
    gelu_of_parts = F.gelu(parts + bias.double()).sum(0)
    assert (gelu_of_parts - ref).abs().max() > 0.1, \
        "activation per slice would differ: the order matters"


def test_fusion_bytes_and_benchmarks_off_the_gpu():
    unfused, fused, saved = lab.fusion_bytes(8192, 16384, torch.float16)
    assert fused == 8192 * 16384 * 2 and saved == 2 * fused and unfused == 3 * fused
    if not engines.on_gpu():
        res = lab.bench_epilogue(64, 64, 64)
        assert res.ms == {} and "not timed" in str(res)
        assert lab.bench_split_k(64, 64, 256) == {}
