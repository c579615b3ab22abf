"""The processes tools/record_ncu.sh profiles: what they launch, and that they refuse a CPU."""
import pytest

import gemm_lessons as gl


def test_k04_steps_profiles_lesson_02_then_every_lesson_04_step_in_order(tool):
    steps = tool("ncu_k04_steps").STEPS
    assert steps == ["k02_smem_tiling"] + [k.name for k in gl.kernels() if k.lesson == 4]


def test_k04_steps_needs_a_gpu(tool, capsys):
    if gl.backend() == "cuda":
        pytest.skip("on a GPU the tool runs its kernels")
    assert tool("ncu_k04_steps").main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
