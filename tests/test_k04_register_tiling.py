"""Lesson 04: every step correct on the shape suite, the simulator running each kernel's GPU
loop, fragments and accumulators in registers, 128-bit loads where the lesson says so, one
barrier per tile in the overlapped loop, the deliberate bug caught."""
import re

import pytest
import torch

import gemm_lessons as gl
from gemm_lessons import banks, compiled, engines, harness, ptx_simt
from gemm_lessons.kernels import k04_register_tiling as k04
from gemm_lessons.kernels import k04_tiles, k04_vectorized, k04_warp_tiling
from gemm_lessons.kernels.k04_tiles import GPU_CONFIGS, SIM_CONFIGS, Tiles
from gemm_lessons.labs import k04 as lab

STEPS = [k.name for k in k04.KERNELS]
VECTOR = STEPS[2:]                      # the float4 steps
sim_only = pytest.mark.skipif(engines.on_gpu(), reason="runs the simulator")


def test_the_lesson_registers_eight_steps_in_order():
    assert STEPS == ["k04_1d_tiling", "k04_2d_tiling", "k04_vectorized", "k04_warp_tiling",
                     "k04_thread_tile", "k04_prefetch", "k04_double_buffer",
                     "k04_register_tiling"]
    assert [k.name for k in gl.kernels() if k.lesson == 4] == STEPS


@pytest.mark.parametrize("name", STEPS)
def test_correct_on_the_suite(name):
    assert gl.check(name).ok


@pytest.mark.parametrize("name", STEPS)
def test_simulator_config_differs_from_the_gpu_config_only_in_sizes(name):
    sim, gpu = SIM_CONFIGS[name], GPU_CONFIGS[name]
    assert sim.keys() == gpu.keys()
    assert all(type(v) is int for v in [*sim.values(), *gpu.values()])
    Tiles(**sim), Tiles(**gpu)          # both valid


# One block of the GPU configuration, three k tiles (the last cut by K), edges in M and N:
# the simulator runs the loop the GPU runs, not only a smaller one.
@sim_only
@pytest.mark.parametrize("name", STEPS)
def test_simulator_runs_the_gpu_configuration(name):
    cfg = GPU_CONFIGS[name]
    _, ok = lab.trace(name, cfg, cfg["BM"] - 3, cfg["BN"] - 5, 2 * cfg["BK"] + 3)
    assert ok, name


def test_tile_sizes_are_checked_with_the_rule_named():
    with pytest.raises(ValueError, match="needs 16 lanes, not 32"):
        Tiles(BM=128, BN=128, BK=8, WM=32, WN=32, TM=8, TN=8)
    with pytest.raises(ValueError, match="4 x 4"):
        Tiles(BM=128, BN=96, BK=8, WM=64, WN=48, TM=8, TN=6)
    with pytest.raises(ValueError, match="positive"):
        Tiles(BM=0, BN=128, BK=8, TM=8)
    with pytest.raises(ValueError, match="do not split evenly"):
        Tiles(BM=128, BN=128, BK=12, WM=64, WN=32, TM=8, TN=8).loads(vec=4)
    with pytest.raises(ValueError, match="multiples of 4"):
        k04.make_register_tiling(**dict(GPU_CONFIGS["k04_register_tiling"], BK=6))


def test_launcher_copies_only_what_float4_loads_cannot_read():
    a, b = harness.make_operands(64, 64, 64)
    assert k04_tiles.padded4(a) is a and k04_tiles.padded4(b) is b
    at = harness.make_operands(64, 64, 64, a="transposed")[0]
    sl = harness.make_operands(30, 26, 22, a="sliced")[0]
    for t in (at, sl, a[:, :63]):
        p = k04_tiles.padded4(t)
        assert p is not t and p.shape[1] % 4 == 0 and k04_tiles.float4_ready(p)
        assert torch.equal(p[:, :t.shape[1]], t) and not p[:, t.shape[1]:].any()


def test_the_deliberate_bug_is_caught():
    """The float4 launcher without its copy stops on a misaligned load (in the simulator on
    every machine: on a GPU the error is fatal to the process's CUDA context)."""
    msg = lab.unpadded_failure()
    assert msg.startswith("IndexError") and "misaligned address" in msg, msg


@sim_only
def test_vector_load_emulation_refuses_misaligned_columns():
    import numpy as np
    arr = np.arange(16, dtype=np.float32).reshape(2, 8)
    assert ptx_simt.ld_shared_v4(arr, 1, 4) == (12.0, 13.0, 14.0, 15.0)
    with pytest.raises(IndexError, match="misaligned address"):
        ptx_simt.ld_shared_v4(arr, 0, 2)


def test_overlapped_loop_at_bk16():
    """One tile (K=1), two (one cut by K), three (an odd count: the loop's second half)."""
    cfg = dict(SIM_CONFIGS["k04_register_tiling"], BK=16)
    cases = [harness.Case("K=1", 25, 41, 1), harness.Case("ragged", 37, 45, 29),
             harness.Case("three tiles", 32, 32, 48)]
    rep = harness.check(lambda a, b, c: k04.register_tiling(a, b, c, **cfg), "BK=16",
                        cases=cases, raise_on_fail=False)
    assert rep.ok, str(rep)


# ---------------------------------------------------------------- bank conflicts (traced)
@sim_only
def test_warp_tiles_read_shared_memory_without_conflicts():
    """One 128 x 128 block, one k tile, GPU tile sizes: k04_vectorized's float4 loads of sB
    take 4 passes where 2 would do; warp tiles read both tiles at the minimum."""
    def passes(name, module):
        t, ok = lab.trace(name, GPU_CONFIGS[name], 128, 128, 8)
        assert ok
        return banks.passes(t, module)
    vec = passes("k04_vectorized", k04_vectorized)
    assert vec["sA"]["load"] == (1.0, 1.0) and vec["sB"]["load"] == (4.0, 2.0)
    warp = passes("k04_warp_tiling", k04_warp_tiling)
    assert warp["sA"]["load"] == warp["sB"]["load"] == (1.0, 1.0)
    assert warp["sA"]["store"] == (1.0, 1.0)         # padded rows: transposed stores 1-way


# ---------------------------------------------------------------------------- PTX facts
def _count(text, op):
    return len(re.findall(re.escape(op) + r"\s", text))


@pytest.fixture(scope="module")
def ptx():
    """sm_90 PTX of every step's GPU configuration, compiled in one (child) process."""
    return lab.ptx_of(STEPS, (9, 0))


@pytest.mark.parametrize("name", STEPS)
def test_fragments_and_accumulators_stay_in_registers(ptx, name):
    text = ptx[name]
    assert "ld.local" not in text and "st.local" not in text
    rep = compiled.ptxas_report(text, (9, 0))
    if rep is not None:
        assert rep["spill_stores"] == rep["spill_loads"] == rep["stack_bytes"] == 0, rep


def test_scalar_steps_then_128_bit_loads(ptx):
    for name in STEPS[:2]:
        assert ".v4." not in ptx[name] and "ld.shared.f32" in ptx[name], name
    for name in VECTOR:
        text = ptx[name]
        assert _count(text, "ld.global.nc.v4.f32") >= 2, name   # A and B tiles
        assert _count(text, "ld.shared.v4.f32") >= 4, name      # fragments
        assert _count(text, "st.shared.v4.f32") >= 1, name      # the B tile
        assert _count(text, "st.global.v4.f32") >= 1, name      # C
        assert "ld.shared.f32" not in text, name                 # no scalar shared loads


def test_barriers_per_tile(ptx):
    """Single buffer: two barriers per tile. Double buffer: one per tile, two tiles per trip.
    Overlapped: one per tile, and one before the loop."""
    for name in STEPS[:6]:
        assert _count(ptx[name], "bar.sync") == 2, name
    assert _count(ptx["k04_double_buffer"], "bar.sync") == 2
    assert _count(ptx["k04_register_tiling"], "bar.sync") == 3


def test_the_next_tile_is_loaded_before_the_math(ptx):
    """k04_thread_tile stores each loaded float4 at once, before the barrier and the math;
    from k04_prefetch on, the next tile's global loads are issued after the barrier, before
    the math, and stored only after it."""
    assert lab.memory_order(ptx["k04_thread_tile"])[-4:] == [
        "st.shared", "bar.sync", "math", "bar.sync"]
    assert lab.memory_order(ptx["k04_prefetch"]) == [
        "ld.global", "st.shared", "bar.sync", "ld.global", "math", "bar.sync"]
    assert lab.memory_order(ptx["k04_double_buffer"])[3:] == [
        "ld.global", "math", "st.shared", "bar.sync", "ld.global", "math"]


# The diffs lesson 04 shows a part at a time (labs.k04.show_diff_part): the parts together
# are the whole diff, and no part is longer than a screen.
DIFF_PARTS = {
    ("k04_1d_tiling", "k04_2d_tiling"): ["for k0 in range"],
    ("k04_2d_tiling", "k04_vectorized"): ["for k0 in range"],
    ("k04_vectorized", "k04_warp_tiling"): ["for k0 in range"],
    ("k04_warp_tiling", "k04_thread_tile"): ["sA = cuda.shared.array(SA"],
    ("k04_thread_tile", "k04_prefetch"): ["@cuda.jit(**launch_bounds"],
    ("k04_prefetch", "k04_double_buffer"): ["@cuda.jit(**launch_bounds", "m0 = cuda.blockIdx.y"],
    ("k04_double_buffer", "k04_register_tiling"): ["def tile(", "sA = cuda.shared.array(SA"],
}


def _printed(fn, *args):
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args)
    return out.getvalue().splitlines()


@pytest.mark.parametrize("old, new", sorted(DIFF_PARTS))
def test_diff_parts_make_the_whole_diff_a_screen_each(old, new):
    changed = lambda lines: [l for l in lines if l[:1] in "+-" and l[:3] not in ("+++", "---")]
    marks = [None] + DIFF_PARTS[old, new] + [None]
    parts = [_printed(lab.show_diff_part, old, new, a, b) for a, b in zip(marks, marks[1:])]
    # the same lines added and removed (a part may align a moved blank line differently)
    assert sorted(l for p in parts for l in changed(p)) == \
        sorted(changed(_printed(gl.show_diff, old, new)))
    assert max(len(p) for p in parts) <= 65, [len(p) for p in parts]


def test_overlapped_loop_is_written_out(ptx):
    """Every k step of both tiles of a trip written out: 2 * BK * TM * TN FMAs."""
    cfg = GPU_CONFIGS["k04_register_tiling"]
    assert _count(ptx["k04_register_tiling"], "fma.rn.f32") == 2 * cfg["BK"] * cfg["TM"] * cfg["TN"]


def test_each_shared_load_feeds_more_fmas(ptx):
    """FMAs per shared-memory load instruction: the point of register tiling."""
    def ratio(text):
        loads = _count(text, "ld.shared.f32") + _count(text, "ld.shared.v4.f32")
        return _count(text, "fma.rn.f32") / loads
    assert ratio(ptx["k04_2d_tiling"]) >= 4                      # lesson 02: 1 FMA per 2 loads
    # the finished loop: (TM + TN) / 4 float4 loads per k, 2 * BK k per trip, + the first k's
    cfg = GPU_CONFIGS["k04_register_tiling"]
    loads = _count(ptx["k04_register_tiling"], "ld.shared.v4.f32")
    assert loads == (2 * cfg["BK"] + 1) * (cfg["TM"] + cfg["TN"]) // 4
    assert ratio(ptx["k04_register_tiling"]) > 20


def test_finished_kernel_fits_an_sm(ptx):
    rep = compiled.ptxas_report(ptx["k04_register_tiling"], (9, 0))
    if rep is None:
        pytest.skip("ptxas not installed")
    threads = Tiles(**GPU_CONFIGS["k04_register_tiling"]).threads
    # a block's warps share the SM's 64K registers, allocated per warp in units of 256
    per_warp = -(-rep["registers"] * 32 // 256) * 256
    assert (threads // 32) * per_warp <= 65536, (rep, threads)
