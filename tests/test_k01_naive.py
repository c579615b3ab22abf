"""Lesson 01: both mappings are correct; only their memory access differs."""
import pytest

import gemm_lessons as gl
from gemm_lessons import compiled


@pytest.mark.parametrize("name", ["k01_naive", "k01_coalesced"])
def test_correct_on_the_suite(name):
    assert gl.check(name).ok


def test_ptx_is_plain_global_loads_no_shared_memory():
    text = compiled.ptx("k01_coalesced", (8, 0))
    assert "ld.global.f32" in text and "st.global.f32" in text
    assert "ld.shared" not in text and ".local" not in text
