"""The instruments behind the exercise checks: poisoned masked-off lanes, lanes read
outside every operand and stores per program (Triton's interpreter), the time limit."""
import time

import pytest
import torch

import gemm_lessons as gl  # noqa: F401  (picks the engine first)
from gemm_lessons import exercise_checks as checks
from gemm_lessons import interp_poison

from gemm_lessons import engines

pytestmark = pytest.mark.skipif(engines.on_gpu(),
                                reason="instruments of the simulator and the interpreter")


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def row_sums(x_ptr, out_ptr, N, OTHER: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        if OTHER:
            x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
        else:
            x = tl.load(x_ptr + offs, mask=offs < N)
        tl.store(out_ptr + tl.program_id(0), tl.sum(x))
    return row_sums


def test_masked_lanes_without_other_are_poisoned():
    if not interp_poison.hook_available():
        pytest.skip("no interpreter hook in this Triton")
    k = _kernels()
    x, out = torch.ones(10), torch.zeros(2)
    k[(2,)](x, out, 10, OTHER=False, BLOCK=8)
    assert out.tolist() == [8.0, 2.0]            # the interpreter's zeros hide the bug
    with interp_poison.poison_masked_loads() as p:
        k[(2,)](x, out, 10, OTHER=False, BLOCK=8)
        assert out[0] == 8 and torch.isnan(out[1]) and p.poisoned == 6
        k[(2,)](x, out, 10, OTHER=True, BLOCK=8)  # other=0.0: nothing poisoned
        assert out.tolist() == [8.0, 2.0] and p.poisoned == 6
    k[(2,)](x, out, 10, OTHER=False, BLOCK=8)    # restored on exit
    assert out.tolist() == [8.0, 2.0]


def test_lanes_outside_every_operand_read_nan_and_are_counted():
    if not interp_poison.hook_available():
        pytest.skip("no interpreter hook in this Triton")
    k = _kernels()
    x, out = torch.ones(10), torch.zeros(2)
    with interp_poison.bounded_loads() as bounds:
        bounds.allow(x)
        k[(2,)](x, out, 10, OTHER=True, BLOCK=8)      # the right mask: nothing strays
        assert out.tolist() == [8.0, 2.0] and bounds.outside == 0
        k[(2,)](x, out, 16, OTHER=True, BLOCK=8)      # a mask 6 lanes too wide
        assert out[0] == 8 and torch.isnan(out[1]) and bounds.outside == 6
    k[(2,)](x, out, 10, OTHER=True, BLOCK=8)          # restored on exit
    assert out.tolist() == [8.0, 2.0]


def test_stores_are_recorded_per_program():
    if not interp_poison.hook_available():
        pytest.skip("no interpreter hook in this Triton")
    k = _kernels()
    x, out = torch.ones(10), torch.zeros(2)
    with interp_poison.record_stores(out) as rec:
        k[(2,)](x, out, 10, OTHER=True, BLOCK=8)
    assert rec.order() == [((0, 0, 0), [0]), ((1, 0, 0), [1])]


def test_time_limit_stops_an_endless_loop():
    t0 = time.perf_counter()
    with pytest.raises(checks.ExerciseError, match="longer than"):
        with checks.time_limit(0.5, "the loop"):
            while True:
                pass
    assert time.perf_counter() - t0 < 5
