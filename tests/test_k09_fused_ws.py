"""Lesson 09, warp specialization (Gluon): act(alpha * A @ B + beta * C + bias) right with
every configuration, K cut in 1 to 4 slices, the ring of slots wrapping many times (long
ragged K), A column-major and B given as W.t(); what TMA cannot address runs
k09_fused_tma_splitk; two runs bitwise equal. On a Hopper GPU only: off it, the clear
refusal, and the compilation for sm_90 (the roles' registers, the barriers, TMA and wgmma,
shared memory and spills). Outputs are NaN-poisoned and compared with a float64 reference."""
import gemm_lessons as gl  # first: it switches on Triton's interpreter when there is no GPU
import pytest
import torch

from gemm_lessons import engines
from gemm_lessons.kernels import k08_triton_splitk as sk
from gemm_lessons.kernels import k09_fused_tma_splitk as ts
from gemm_lessons.kernels import k09_fused_ws as ws

from test_k09_fused_splitk import (assert_clear_errors, assert_close, operands, poisoned,
                                   reference)

HOPPER = engines.on_gpu() and engines.engine().capability[0] == 9
gpu = pytest.mark.skipif(not HOPPER, reason="Gluon's wgmma kernel runs on a Hopper GPU only")

# ragged tiles, 8 columns, K shorter than a tile, and a long ragged K (65 K-tiles of 64: every
# ring wraps, an 8-slot one split in 4 twice per slice); at least MIN_M rows (fewer go to
# k09_fused_tma_splitk, tested below)
SHAPES = {"ragged tiles": (67, 40, 72), "one column": (64, 8, 64), "K=8": (80, 40, 8),
          "long K": (130, 72, 4104), "A column-major": (72, 40, 56)}
EPILOGUES = ((1.0, 0.0, "gelu"), (0.5, -1.5, "relu"), (-2.0, 1.0, "leaky_relu"),
             (1.0, 0.0, None), (1.0, 1.0, "gelu_libdevice"))
# every shipped config, and a shallow ring split in 2, 3 and 4 (many wraps per slice)
CONFIGS = ws.WS_CONFIGS + [ws.ws_config(64, 64, 64, 4, 2, split_k=s) for s in (2, 3, 4)]


@pytest.fixture
def fallback_calls(monkeypatch):
    """The calls that went to k09_fused_tma_splitk instead of the warp-specialized kernel."""
    calls = []
    real = ts.fused_gemm

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)
    monkeypatch.setattr(ts, "fused_gemm", spy)
    return calls


@gpu
def test_check_passes_in_every_dtype():
    rep = gl.check("k09_fused_ws")
    assert rep.ok
    assert str(rep) == "k09_fused_ws: correct on 9 shapes (bfloat16, float16)"


@gpu
@pytest.mark.parametrize("cfg", CONFIGS, ids=[sk.label(c) for c in CONFIGS])
def test_every_config_applies_the_epilogue_once_to_the_full_sum(cfg, fallback_calls):
    for shape, (M, N, K) in SHAPES.items():
        a, b, c, bias = operands(M, N, K, seed=M,
                                 layout="transposed" if "column" in shape else "row")
        for alpha, beta, act in EPILOGUES:
            assert ws.uses_ws(a, b, c, None, alpha, beta), shape
            for out in (poisoned(M, N), poisoned(M, N + 3)[:, :N]):   # TMA store, pointer
                ws.fused_gemm(a, b, c, out, alpha, beta, bias, act, config=cfg)
                ref, scale = reference(a, b, c, alpha, beta, bias,   # libdevice's: gelu too
                                       "gelu" if act == "gelu_libdevice" else act)
                assert_close(out, ref, scale, 2e-3,
                             f"{sk.label(cfg)} {shape} {act} {alpha} {beta} {out.stride()}")
    assert not fallback_calls, "an operand TMA can address went to k09_fused_tma_splitk"


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_transposed_weight_is_read_in_place(dtype, fallback_calls):
    a, _, _, bias = operands(93, 40, 200, dtype, seed=2)
    w = torch.randn(40, 200, generator=torch.Generator().manual_seed(7)).to(dtype).to(a.device)
    b = w.t()                                        # nn.Linear's (N, K) weight, transposed
    assert ws.uses_ws(a, b)
    for cfg in (CONFIGS[2], CONFIGS[-1]):
        out = ws.fused_gemm(a, b, None, poisoned(93, 40, dtype), 1.0, 0.0, bias, "gelu",
                            config=cfg)
        ref, scale = reference(a, b, None, 1.0, 0.0, bias, "gelu")
        assert_close(out, ref, scale, 2e-3 if dtype == torch.float16 else 1.6e-2,
                     f"W.t() {sk.label(cfg)}")
    assert not fallback_calls


CANNOT = ["K not a multiple of 8", "a sliced B", "fp32", "alpha = 0", "out is C",
          "fewer rows than wgmma's tile"]


@gpu
@pytest.mark.parametrize("what", CANNOT)
def test_what_tma_cannot_address_runs_k09_fused_tma_splitk(what, fallback_calls):
    M, N, K = (70, 24, 45) if what == "K not a multiple of 8" else (70, 24, 32)
    M = ws.MIN_M - 1 if what.startswith("fewer") else M
    dtype = torch.float32 if what == "fp32" else torch.float16
    a, b, c, bias = operands(M, N, K, dtype, seed=3)
    if what == "a sliced B":
        b = torch.cat([b, b], dim=1)[:, ::2]
    alpha, beta = (0.0, 1.0) if what == "alpha = 0" else (0.5, 1.0)
    ref, scale = reference(a, b, c, alpha, beta, bias, "gelu")
    out = c if what == "out is C" else poisoned(M, N, dtype)
    assert not ws.uses_ws(a, b, c, out, alpha, beta)
    ws.fused_gemm(a, b, c, out, alpha, beta, bias, "gelu")
    assert_close(out, ref, scale, 1e-5 if dtype == torch.float32 else 2e-3, what)
    assert fallback_calls[:1] == [a.shape]


@gpu
def test_two_runs_are_bitwise_equal_and_the_counters_end_at_zero():
    a, b, c, bias = operands(130, 72, 4104, seed=3)   # split in 4 below
    cfg = CONFIGS[-1]                                   # split in 4
    outs = [ws.fused_gemm(a, b, c, poisoned(130, 72), 1.0, 1.0, bias, "gelu", config=cfg)
            for _ in range(2)]
    _, counts = sk._BUFFERS[outs[0].device]
    assert int(counts.abs().sum()) == 0, "a tile's counter was not reset"
    assert torch.equal(outs[0], outs[1])


@gpu
def test_autotuned_through_gl_gemm(fallback_calls):
    for dtype in (torch.float16, torch.bfloat16):
        a, b, c, bias = operands(75, 64, 800, dtype, seed=4)
        out = gl.gemm(a, b, c, alpha=0.5, beta=1.5, bias=bias, activation="gelu",
                      kernel="k09_fused_ws")
        ref, scale = reference(a, b, c, 0.5, 1.5, bias, "gelu")
        assert out.dtype == dtype
        assert_close(out, ref, scale, 2e-3 if dtype == torch.float16 else 1.6e-2, f"{dtype}")
    assert not fallback_calls
    assert ws.chosen_config() != "none yet (call the kernel first)"


@gpu
def test_bad_input_gets_a_clear_error():
    assert_clear_errors(ws.fused_gemm, "k09_fused_ws", 8, 16, 16)


@pytest.mark.skipif(engines.on_gpu(), reason="the refusal off a GPU")
def test_off_a_gpu_it_is_refused_with_the_kernel_to_run_instead():
    assert not gl.runs_here("k09_fused_ws")
    a, b, _, _ = operands(64, 16, 16)
    assert not ws.uses_ws(a, b)
    with pytest.raises(gl.UnsupportedDevice, match="Gluon.*k09_fused_tma_splitk runs the same"):
        gl.matmul(a, b, kernel="k09_fused_ws")
    with pytest.raises(gl.UnsupportedDevice, match="interpreter cannot run it"):
        gl.check_anywhere("k09_fused_ws")


def test_each_config_gives_the_descriptors_its_tiles_and_their_layouts():
    class Desc:
        block_shape = layout = None
        base = torch.empty(0, dtype=torch.float16)
    for cfg in ws.WS_CONFIGS:
        assert cfg.pre_hook is ws.set_layouts, sk.label(cfg)
        assert cfg.kwargs["NUM_STAGES"] == cfg.num_stages
        BM, BN, BK = (cfg.kwargs[k] for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
        for a_trans, b_trans in ((False, False), (True, True)):
            nargs = dict(cfg.kwargs, a_desc=Desc(), b_desc=Desc(), o_desc=Desc(),
                         A_TRANS=a_trans, B_TRANS=b_trans, TMA_STORE=True)
            cfg.pre_hook(nargs)
            for d, block in ((nargs["a_desc"], [BK, BM] if a_trans else [BM, BK]),
                             (nargs["b_desc"], [BN, BK] if b_trans else [BK, BN]),
                             (nargs["o_desc"], [BM, BN])):
                assert d.block_shape == block
                assert d.layout == ws.gl.NVMMASharedLayout.get_default_for(block, ws.gl.float16)


def test_it_shares_lesson_08s_key_and_pruner():
    tuned = ws.fused_ws_autotuned
    assert tuned.keys == sk.splitk_autotuned.keys + ["A_TRANS", "B_TRANS"]
    assert tuned.early_config_prune is sk.prune
    assert len({sk.label(c) for c in ws.WS_CONFIGS}) == len(ws.WS_CONFIGS), "listed twice"


@pytest.fixture(scope="module")
def compiled_configs():
    """Every config compiled for sm_90 with this machine's Triton (no GPU needed)."""
    from gemm_lessons import triton_asm
    return list(zip(ws.WS_CONFIGS,
                    triton_asm.compile_kernels([ws.asm_job(c) for c in ws.WS_CONFIGS])))


def test_the_producer_gives_up_registers_and_the_consumers_take_them(compiled_configs):
    from gemm_lessons import triton_asm
    for cfg, res in compiled_configs:
        ptx = res["ptx"]
        # one extra warp, padded to a warpgroup: 4 + 4 or 8 + 4 warps
        assert res["num_warps"] == cfg.num_warps + 4, sk.label(cfg)
        regs = triton_asm.grep(ptx, r"setmaxnreg\.(dec|inc)\.sync\.aligned\.u32\s+(\d+)")
        assert ("dec", "24") in regs, (sk.label(cfg), regs)
        assert any(kind == "inc" and int(n) > 24 for kind, n in regs), (sk.label(cfg), regs)
        for instr in ("cp.async.bulk.tensor.2d.shared::",                 # the loads
                      "cp.async.bulk.tensor.2d.global.shared::cta",       # the store
                      "mbarrier.arrive.expect_tx",
                      "mbarrier.try_wait.parity", "wgmma.mma_async", "wgmma.wait_group"):
            assert instr in ptx, (sk.label(cfg), instr)


def test_every_config_fits_in_shared_memory_and_does_not_spill(compiled_configs):
    from gemm_lessons import compiled
    from gemm_lessons.kernels.k08_triton_autotune import smem_limit
    for cfg, res in compiled_configs:
        assert res["shared"] <= smem_limit((9, 0)), (sk.label(cfg), res["shared"])
        rep = compiled.ptxas_report(res["ptx"], (9, 0))
        if rep is None:
            pytest.skip("no ptxas here")
        assert rep["spill_stores"] == 0, (sk.label(cfg), rep)


class _Recorder:
    """Stands in for the compiled kernel: records the grid and the arguments of a launch."""
    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


@pytest.mark.parametrize("with_c", [False, True])
def test_the_launcher_binds_every_argument_to_the_kernels_signature(monkeypatch, with_c):
    # the launcher's own Python on any machine: its path forced, the kernel a recorder; what
    # it passes must bind to fused_ws_kernel's parameters, by position and by name
    import inspect
    rec = _Recorder()
    kernel_fn = ws.fused_ws_kernel.fn                  # the Python function, for its signature
    monkeypatch.setattr(ws, "uses_ws", lambda *a, **k: True)
    monkeypatch.setattr(ws, "fused_ws_kernel", rec)
    M, N, K = 70, 40, 96
    a, b, c, bias = operands(M, N, K, seed=5)
    for out, tma_store in ((poisoned(M, N), True), (poisoned(M, N + 3)[:, :N], False)):
        cfg = ws.ws_config(64, 64, 64, 4, 2, split_k=3)
        ws.fused_gemm(a, b, c if with_c else None, out, 0.5, 1.5 if with_c else 0.0, bias,
                      "gelu", config=cfg)
        grid, args, kwargs = rec.calls[-1]
        bound = inspect.signature(kernel_fn).bind(*args, **kwargs).arguments
        assert grid({**cfg.kwargs}) == (2 * 1, 3)                   # tiles x slices
        assert bound["TMA_STORE"] is tma_store and bound["HAS_C"] is with_c
        assert bound["out_ptr"] is out and bound["bias_ptr"] is bias
        assert (bound["M"], bound["N"], bound["K"]) == (M, N, K)
        assert (bound["stride_om"], bound["stride_on"]) == out.stride()
        assert bound["c_ptr"] is (c if with_c else out)
        assert (bound["stride_cm"], bound["stride_cn"]) == (c.stride() if with_c else (0, 0))
        assert bound["NUM_STAGES"] == 2 and bound["SPLIT_K"] == 3 and bound["num_warps"] == 4
        assert bound["a_desc"].block_shape == [64, 64] and bound["b_desc"].block_shape == [64, 64]
        if tma_store:
            assert bound["o_desc"].block_shape == [64, 64]
            assert bound["o_desc"].base.data_ptr() == out.data_ptr()
