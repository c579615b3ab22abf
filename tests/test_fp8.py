"""gemm_lessons.fp8: the formats, the scales, quantization and the accumulator emulation."""
import numpy as np
import pytest
import torch

from gemm_lessons import fp8


def test_formats_match_torch():
    for name, f in fp8.FORMATS.items():
        v = fp8.values(name)
        assert v.max().item() == f.max == torch.finfo(f.dtype).max
        assert v[v > 0].min().item() == f.min_subnormal
        assert f.min_normal == torch.finfo(f.dtype).tiny
        assert f.min_normal == 2.0 ** (1 - f.bias)
    # e4m3: 3 mantissa bits, 8 values per binade; e5m2: 4
    v = fp8.values("e4m3")
    assert ((v >= 1) & (v < 2)).sum() == 8
    assert ((fp8.values("e5m2") >= 1) & (fp8.values("e5m2") < 2)).sum() == 4


def test_round_to_is_nearest_and_saturates():
    x = torch.tensor([1.0, 1.06, 1.07, 1.0625, 1.1875, 500.0, -1e6, 2.0 ** -10, float("nan")])
    r = fp8.round_to(x, "e4m3")
    assert r[:5].tolist() == [1.0, 1.0, 1.125, 1.0, 1.25]     # ties to even: 1.0625 -> 1.0
    assert r[5] == 448 and r[6] == -448
    assert r[7] == 0.0                                        # half the smallest subnormal
    assert torch.isnan(r[8])
    assert fp8.round_to(torch.tensor([1e6]), "e5m2").item() == 57344
    grid = fp8.values("e4m3")
    y = torch.linspace(-400, 400, 1001)
    nearest = grid[(y.double()[:, None] - grid[None, :]).abs().argmin(dim=1)]
    assert ((fp8.round_to(y).double() - y.double()).abs()
            <= (nearest - y.double()).abs() + 1e-12).all()


def test_unknown_format_and_bad_input_are_named():
    with pytest.raises(ValueError, match="unknown FP8 format"):
        fp8.fmt("e3m4")
    with pytest.raises(ValueError, match="unknown granularity"):
        fp8.quantize(torch.ones(2, 2), "column")
    with pytest.raises(ValueError, match="2-D"):
        fp8.quantize(torch.ones(3))
    with pytest.raises(TypeError, match="to quantize"):
        fp8.quantize(torch.ones(2, 2).to(torch.float8_e4m3fn))


@pytest.mark.parametrize("granularity,shape", [("tensor", ()), ("row", (37, 1)),
                                               ("col", (1, 300)), ((1, 128), (37, 3)),
                                               ((128, 128), (1, 3))])
def test_quantize_scales_shapes_and_range(granularity, shape):
    x = fp8.activations(37, 300, seed=3)
    q, s = fp8.quantize(x, granularity)
    assert q.dtype == torch.float8_e4m3fn and tuple(s.shape) == shape and s.dtype == torch.float32
    block = None if isinstance(granularity, str) else granularity
    back = fp8.dequantize(q, s, block)
    # each group's largest magnitude lands on 448 (up to rounding of the division)
    assert q.float().abs().max().item() == 448
    assert fp8.rel_error(back, x) < 0.05
    # the relative error of each element is at most half a step of e4m3 (normal range)
    qf = q.float()
    full = back / torch.where(qf == 0, torch.ones_like(qf), qf)     # each element's scale
    normal = (qf != 0) & ((x / full).abs() >= fp8.FORMATS["e4m3"].min_normal)
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max().item() <= 2.0 ** -4 + 1e-6


def test_finer_scales_lose_less_on_layer_like_data():
    x = fp8.activations(128, 512, seed=0)
    errs = [fp8.rel_error(fp8.dequantize(*fp8.quantize(x, g), b), x)
            for g, b in (("tensor", None), ("row", None), ((1, 128), (1, 128)))]
    assert errs[0] > errs[1] > errs[2]


def test_zero_groups_get_scale_one():
    x = torch.zeros(4, 256)
    x[0, :5] = 3.0
    q, s = fp8.quantize(x, (1, 128))
    assert torch.equal(s[1:], torch.ones(3, 2)) and torch.isfinite(fp8.dequantize(q, s, (1, 128))).all()


def test_generators_are_seeded():
    assert torch.equal(fp8.activations(8, 16, seed=5), fp8.activations(8, 16, seed=5))
    assert not torch.equal(fp8.weights(8, 16, seed=5), fp8.weights(8, 16, seed=6))


def test_limited_sum_keeps_the_leading_bits():
    acc = np.array([1.0])
    small = np.array([[2.0 ** -14, 2.0 ** -12]])
    # 14 bits below 1.0's leading bit reach 2**-13: 2**-14 is cut, 2**-12 kept
    assert fp8.limited_sum(acc, small)[0] == 1.0 + 2.0 ** -12
    assert fp8.limited_sum(acc, small, bits=24)[0] == np.float32(1.0 + 2.0 ** -14 + 2.0 ** -12)
    assert fp8.limited_sum(np.array([-1.0]), -small)[0] == -(1.0 + 2.0 ** -12)   # toward zero


def test_promotion_bounds_the_error():
    g = torch.Generator().manual_seed(0)
    a = fp8.round_to(torch.randn(8, 4096, generator=g))
    b = fp8.round_to(torch.randn(4096, 8, generator=g))
    ref = a.double() @ b.double()
    plain = fp8.rel_error(fp8.emulated_dot(a, b), ref)
    promoted = fp8.rel_error(fp8.emulated_dot(a, b, promote_every=128), ref)
    assert promoted < plain / 4
    exact = fp8.emulated_dot(a, b, promote_every=32, bits=40)
    assert fp8.rel_error(exact, ref) < 1e-6
    with pytest.raises(ValueError, match="multiple of 32"):
        fp8.emulated_dot(a, b, promote_every=100)
    # a K that is not a multiple of 32: the tail counts
    assert fp8.rel_error(fp8.emulated_dot(a[:, :45], b[:45], promote_every=32, bits=40),
                         a[:, :45].double() @ b[:45].double()) < 1e-6
