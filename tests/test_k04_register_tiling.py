"""Lesson 04: register tiling keeps fragments and accumulators in registers, the last two
steps load 128 bits at a time, and the finished kernel reads shared memory conflict-free."""
import re

import pytest
import torch

import gemm_lessons as gl
from gemm_lessons import compiled, counters, engines, harness, ptx_simt
from gemm_lessons.kernels import k04_register_tiling as k04

STEPS = ["k04_1d_tiling", "k04_2d_tiling", "k04_vectorized", "k04_register_tiling"]
sim_only = pytest.mark.skipif(engines.on_gpu(), reason="runs the simulator")


@pytest.mark.parametrize("name", STEPS)
def test_correct_on_the_suite(name):
    assert gl.check(name).ok


def _count(text, op):
    return len(re.findall(re.escape(op) + r"\s", text))


@pytest.fixture(scope="module")
def ptx():   # each compiles in a child process (no GPU here): the two that make the point
    return {name: compiled.ptx(name, (9, 0)) for name in ("k04_2d_tiling", "k04_register_tiling")}


def test_fragments_and_accumulators_stay_in_registers(ptx):
    for name, text in ptx.items():
        assert "ld.local" not in text and "st.local" not in text, name
        rep = compiled.ptxas_report(text, (9, 0))
        if rep is not None:
            assert rep["spill_stores"] == rep["spill_loads"] == rep["stack_bytes"] == 0, name


def test_final_kernel_fits_an_sm_without_spills(ptx):
    rep = compiled.ptxas_report(ptx["k04_register_tiling"], (9, 0))
    if rep is None:
        pytest.skip("ptxas not installed")
    assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0, rep
    threads = k04.make_register_tiling(**k04.GPU_CONFIGS["k04_register_tiling"]).threads
    # a block's warps share the SM's 64K registers, allocated per warp in units of 256
    per_warp = -(-rep["registers"] * 32 // 256) * 256
    assert (threads // 32) * per_warp <= 65536, (rep, threads)


def test_scalar_steps_then_128_bit_loads(ptx):
    assert ".v4." not in ptx["k04_2d_tiling"] and "ld.shared.f32" in ptx["k04_2d_tiling"]
    for name in ("k04_register_tiling",):
        text = ptx[name]
        assert _count(text, "ld.global.nc.v4.f32") >= 2, name   # A and B tiles
        assert _count(text, "ld.shared.v4.f32") >= 4, name      # fragments
        assert _count(text, "st.shared.v4.f32") >= 1, name      # the B tile
        assert _count(text, "st.global.v4.f32") >= 1, name      # C
        assert "ld.shared.f32" not in text, name                 # no scalar shared loads


def test_each_shared_load_feeds_more_fmas(ptx):
    """FMAs per shared-memory load instruction: the point of register tiling."""
    def ratio(text):
        loads = _count(text, "ld.shared.f32") + _count(text, "ld.shared.v4.f32")
        return _count(text, "fma.rn.f32") / loads
    r2d, rf = ratio(ptx["k04_2d_tiling"]), ratio(ptx["k04_register_tiling"])
    assert r2d >= 4 and rf >= 16, (r2d, rf)      # lesson 02: 1 FMA per 2 loads


def _ways(make, cfg, M, N, K, vector):
    """Shared-memory ways of one launch of a GPU configuration, in the simulator."""
    a, b = harness.make_operands(M, N, K)
    c = torch.empty(M, N)
    kernel = make(**cfg)
    threads = (cfg["BM"] // cfg["TM"]) * (cfg["BN"] // cfg["TN"]) if "WM" not in cfg \
        else kernel.threads
    grid = ((N + cfg["BN"] - 1) // cfg["BN"], (M + cfg["BM"] - 1) // cfg["BM"])
    args = [engines.as_numba(x) for x in (a, b, c)] + ([1] if vector else [])
    with counters.trace(A=a, B=b, C=c) as t:
        kernel[grid, threads](*args)
    ref = harness.reference(a, b)
    assert harness.compare(c, ref, a, b, torch.float32)[0]
    return t.shared_summary()


@sim_only
def test_final_kernel_reads_shared_memory_without_conflicts():
    """At the GPU configuration (one 128 x 128 block, one k tile), the 2-D step's scalar
    fragment loads conflict, the finished kernel's float4 loads do not."""
    s2d = _ways(k04.make_2d_tiling, k04.GPU_CONFIGS["k04_2d_tiling"], 128, 128, 8, False)
    ways2d = sorted(v["load"] for v in s2d.values())
    assert ways2d == [2, 4]                      # sA 2-way, sB 4-way
    fin = _ways(k04.make_register_tiling, k04.GPU_CONFIGS["k04_register_tiling"],
                128, 128, 8, True)      # loads: 1-way; sB stores: 4 passes = 512 B, ideal
    assert [v["load"] for v in fin.values()] == [1, 1]
    sA = min(fin)                                # declared first: the transposed A tile
    assert fin[sA]["store"] == 1                 # padding: transposed stores are 1-way too


def test_launcher_copies_only_what_float4_loads_cannot_read():
    a, b = harness.make_operands(64, 64, 64)
    assert k04._padded4(a) is a and k04._padded4(b) is b
    at = harness.make_operands(64, 64, 64, a="transposed")[0]
    sl = harness.make_operands(30, 26, 22, a="sliced")[0]
    for t in (at, sl, a[:, :63]):
        p = k04._padded4(t)
        assert p is not t and p.shape[1] % 4 == 0 and k04._float4_ready(p)
        assert torch.equal(p[:, :t.shape[1]], t) and not p[:, t.shape[1]:].any()


@sim_only
def test_vector_load_emulation_refuses_misaligned_columns():
    import numpy as np
    arr = np.arange(16, dtype=np.float32).reshape(2, 8)
    assert ptx_simt.ld_shared_v4(arr, 1, 4) == (12.0, 13.0, 14.0, 15.0)
    with pytest.raises(IndexError, match="misaligned address"):
        ptx_simt.ld_shared_v4(arr, 0, 2)


@sim_only   # on a GPU this is a "misaligned address" error, fatal to the CUDA context
def test_launcher_that_skips_the_copy_stops_on_misaligned_loads():
    """Without the launcher's copy, an operand whose width is not a multiple of 4 breaks
    the float4 loads: the simulator stops as the GPU would."""
    cfg = k04.config("k04_register_tiling")
    kernel = k04.make_register_tiling(**cfg)

    def no_copy(a, b, c):
        M, N = c.shape
        grid = ((N + cfg["BN"] - 1) // cfg["BN"], (M + cfg["BM"] - 1) // cfg["BM"])
        a, b = a.contiguous(), k04._padded4(b)    # kept alive until the launch is queued
        kernel[grid, kernel.threads, engines.numba_stream()](
            engines.as_numba(a), engines.as_numba(b), engines.as_numba(c), 0)

    case = harness.Case("ragged", 21, 24, 19, hint="K % 4 != 0")
    with pytest.raises(IndexError, match="misaligned address"):
        harness.check(no_copy, "no_copy", cases=[case])


# ---- OVERLAP=True: the CUTLASS-style main loop (tile unrolled, barrier before the last k)
OVERLAP_SIM = dict(BM=32, BN=32, BK=8, WM=32, WN=16, TM=4, TN=4, OVERLAP=True)
OVERLAP_GPU = dict(BM=128, BN=256, BK=8, WM=64, WN=64, TM=16, TN=8, OVERLAP=True)


def _run(cfg):
    return lambda a, b, c: k04.register_tiling(a, b, c, **cfg)


def test_overlapped_main_loop_is_correct():
    assert harness.check(_run(OVERLAP_SIM), "k04 OVERLAP", raise_on_fail=False).ok


def test_overlapped_main_loop_is_correct_at_bk16():
    """One tile (K=1), two (one cut by K), three (an odd count: the loop's second half)."""
    cases = [harness.Case("K=1", 25, 41, 1), harness.Case("ragged", 37, 45, 29),
             harness.Case("three tiles", 32, 32, 48)]
    rep = harness.check(_run(dict(OVERLAP_SIM, BK=16)), "k04 OVERLAP BK=16", cases=cases,
                        raise_on_fail=False)
    assert rep.ok, str(rep)


def _ptx_of(cfg):
    """PTX of a k04_register_tiling configuration for sm_90 (a child process without GPU)."""
    import os
    import subprocess
    import sys
    code = ("import sys; import gemm_lessons; from numba import cuda; "
            "from gemm_lessons.kernels import k04_register_tiling as k04; "
            f"k = k04.make_register_tiling(**{cfg!r}); "
            "sys.stdout.write(cuda.compile_ptx(k.py_func, k04._SIG_VEC, cc=(9, 0), "
            "launch_bounds=k.launch_bounds)[0])")
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "TRITON_INTERPRET")}
    env["GEMM_LESSONS_ENGINE"] = "compile"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_overlapped_main_loop_unrolls_without_local_memory():
    """Every k step of both tiles of a trip unrolled (2 * BK * TM * TN FMAs), in registers
    (no local memory, no spills), with one barrier per tile (+1 before the loop)."""
    text = _ptx_of(OVERLAP_GPU)
    assert "ld.local" not in text and "st.local" not in text
    cfg = OVERLAP_GPU
    assert _count(text, "fma.rn.f32") == 2 * cfg["BK"] * cfg["TM"] * cfg["TN"]
    assert _count(text, "bar.sync") == 3
    rep = compiled.ptxas_report(text, (9, 0))
    if rep is not None:
        assert rep["spill_stores"] == rep["spill_loads"] == rep["stack_bytes"] == 0, rep
