"""kernel="auto": the rule of gemm_lessons.choose on every branch (a Hopper GPU faked: the
rule reads only the engine, the operands and the multiprocessor count), and the API running
the chosen kernel here."""
import types

import pytest
import torch

import gemm_lessons as gl
from gemm_lessons import choose, harness


def _meta(M, N, K, *, layout="row", dtype=torch.float16, misalign=False):
    # strides and alignment are all the rule reads: tensors of the shape, on the CPU
    a = torch.empty(M, K + (1 if misalign else 0), dtype=dtype)[:, :K] if misalign else \
        torch.empty(M, K, dtype=dtype)
    b = torch.empty(N, K, dtype=dtype).t() if layout == "wt" else torch.empty(K, N, dtype=dtype)
    return a, b


@pytest.fixture
def hopper(monkeypatch):
    eng = types.SimpleNamespace(kind="cuda", capability=(9, 0))
    monkeypatch.setattr(choose.engines, "engine", lambda: eng)
    monkeypatch.setattr(choose, "sm_count", lambda: 132)
    return eng


@pytest.mark.parametrize("shape, kw, plain, fused", [
    ((16, 4096, 4096), {}, "k08_triton_splitk", "k09_fused_splitk"),        # few rows
    ((8192, 4096, 4096), {}, "k08_triton_tma", "k09_fused_tma"),            # many tiles
    ((2048, 1024, 8192), {}, "k08_triton_splitk", "k09_fused_splitk"),      # 64 tiles < 132
    ((8192, 4096, 4096), {"layout": "wt"}, "k09_fused_tma", "k09_fused_tma"),  # W.t() in place
    ((6128, 568, 14792), {}, "k08_triton_tma", "k09_fused_tma"),    # 128 x 128 tiles: 91 %
    ((2128, 480, 1952), {"layout": "wt"}, "k08_triton_splitk", "k09_fused_splitk"),  # 68 tiles
    ((2048, 14336, 4096), {}, "k08_triton_tma", "k09_fused_tma"),           # 896 tiles: 97 %
    ((602, 7719, 2910), {"misalign": True}, "k08_triton_tma", "k09_fused_splitk"),  # staged
    ((2023, 82, 23222), {"misalign": True}, "k08_triton_splitk", "k09_fused_splitk"),  # thin
    ((7, 150, 150), {"layout": "wt"}, "k08_triton_splitk", "k09_fused_splitk"),   # small
])
def test_the_rule_on_hopper(hopper, shape, kw, plain, fused):
    a, b = _meta(*shape, **kw)
    assert choose.kernel_for(a, b) == plain
    assert choose.kernel_for(a, b, fused=True) == fused
    assert choose.kernel_for(a, b, fused=True, batched=True) == "k09_fused_tma"


def test_the_rule_below_hopper_for_fp32_and_off_a_gpu(hopper):
    a, b = _meta(8192, 4096, 4096)
    hopper.capability = (8, 0)
    assert choose.kernel_for(a, b) == "k08_triton_splitk"
    assert choose.kernel_for(a, b, fused=True) == "k09_fused_splitk"
    assert choose.kernel_for(a, b, fused=True, batched=True) == "k09_fused_epilogue"
    hopper.capability = (9, 0)
    assert choose.kernel_for(*_meta(8192, 4096, 4096, dtype=torch.float32)) == \
        "k08_triton_splitk"
    hopper.kind = "simulator"
    assert choose.kernel_for(a, b, fused=True) == "k09_fused_epilogue"


def test_wave_fill():
    assert choose.wave_fill(132, 132) == 1.0 and choose.wave_fill(0, 132) == 0.0
    assert choose.wave_fill(144, 132) == pytest.approx(144 / 264)
    assert choose.wave_fill(896, 132) == pytest.approx(896 / 924)


def test_wave_tile_takes_the_largest_tile_that_fills_its_waves(monkeypatch):
    from gemm_lessons import common
    from gemm_lessons.kernels import k08_triton_tma as k08t
    from gemm_lessons.kernels import k09_fused_tma as k09t
    tiles = [(128, 256), (128, 128)]
    assert common.wave_tile(8192, 4096, tiles, 132) == (128, 256)     # 1024 tiles: 97 %
    assert common.wave_tile(6128, 568, tiles, 132) == (128, 128)      # 55 % against 91 %
    assert common.wave_tile(2048, 1024, tiles, 132) == (128, 128)     # 64 or 128 tiles: fuller
    assert common.wave_tile(128, 256, tiles, 132) == (128, 128)       # 2 tiles, not 1
    assert common.wave_tile(8448, 2048, tiles, 132) == (128, 256)     # 528 tiles: 100 %
    assert common.wave_tile(100, 100, [(128, 256), (128, 256)], 132) == (128, 256)  # equals
    assert common.wave_tile(6128, 568, tiles, 132, batch=4) == (128, 256)   # 576 tiles: 87 %
    assert k08t.config_for(6128, 568, 132) == k08t.NARROW_CONFIG
    assert k08t.config_for(8192, 4096, 132) == k08t.GPU_CONFIG
    monkeypatch.setattr(k09t.engines, "on_gpu", lambda: True)
    assert k09t.default_config(6128, 568, 1, 132) == k09t.NARROW_CONFIG
    assert k09t.default_config(8192, 4096, 1, 132) == k09t.GPU_CONFIG
    assert k09t.default_config() == k09t.GPU_CONFIG


def test_wide_loads_and_tma_reads():
    W = torch.empty(64, 32, dtype=torch.float16)
    assert choose.wide_loads(W) and choose.wide_loads(W.t())          # nn.Linear's W.t()
    assert choose.tma_addressable(W) and not choose.tma_addressable(W.t())
    odd = torch.empty(5, 7, dtype=torch.float16)
    assert not choose.wide_loads(odd) and not choose.tma_addressable(odd)
    assert not choose.wide_loads(torch.empty(65, dtype=torch.float16)[1:].view(8, 8))


def test_auto_runs_the_chosen_kernel_here():
    a, b = harness.make_operands(19, 11, 13, torch.float16, seed=2)
    name = gl.auto_kernel(a, b)
    assert name in gl.registry.names() if hasattr(gl, "registry") else name
    out = gl.matmul(a, b, kernel="auto")
    assert torch.equal(out, gl.matmul(a, b, kernel=name))
    bias = torch.randn(11, dtype=torch.float16, device=a.device)
    fused = gl.gemm(a, b, bias=bias, activation="relu", kernel="auto")
    want = torch.relu(a.double() @ b.double() + bias.double())
    assert torch.allclose(fused.double(), want, atol=2e-2, rtol=1e-2)
    p = gl.prepare("auto", a, b)
    assert p.kernel == name and torch.equal(p(), out)
    batch = gl.gemm(torch.stack([a, a]), b, kernel="auto")       # batched: a batched kernel
    assert torch.equal(batch[1], batch[0])
    with pytest.raises(TypeError, match="differ in dtype"):
        gl.matmul(a, b.float(), kernel="auto")


def test_the_front_door_tool_draws_its_shapes_and_needs_a_gpu(tool):
    fd = tool("front_door")
    shapes = fd.random_shapes(30)
    assert shapes == fd.random_shapes(30) and len(set(shapes)) == 30      # seeded
    assert all(1 <= M <= 8192 and 64 <= N <= 28672 and 64 <= K <= 28672
               for M, N, K, _ in shapes)
    odd = [s for s in shapes if any(x % 8 for x in s[:3])]
    assert len(odd) >= 10                                                 # a third at least
    assert {lay for *_, lay in shapes} == {"row", "wt"}
    if gl.backend() != "cuda":
        with pytest.raises(SystemExit, match="need a CUDA GPU"):
            fd.main(["--part", "host"])
