"""Lesson 06's broken pipelines, and the cp.async emulation that makes them fail.

``gemm_lessons.labs.k06`` keeps the bug demos as small named kernels: the one that forgets
``cp_async_wait_group`` is wrong on every engine (on the simulator because a copy lands no
earlier than its issue and no later than its wait, so the read sees the old buffer; on a
GPU because the read follows the copy's issue by far less than a global-memory latency);
its twin with the wait is right. The one that issues the next copy before the barrier, so
that a fast thread overwrites a buffer slower threads still read, is right when every copy
lands at its wait and caught when copies land at random moments between issue and wait
(``ptx.cp_async_landing("random", seed)``). The emulation itself: a copy is not visible before the
wait that covers it, wait_group(N) lands all but the newest N groups, the zero-filling form
writes zeros, misaligned or out-of-range copies are refused.
"""
import gemm_lessons as gl  # noqa: F401  (first: it picks the engine)
import numpy as np
import numba.types as nt
import pytest
from numba import cuda

from gemm_lessons import engines, ptx
from gemm_lessons.labs import k06 as lab

from gemm_lessons.common import run_on_simulator  # noqa: E402

SIM = not engines.on_gpu()


@pytest.mark.parametrize("seed", [1, 2])
def test_the_pipeline_with_its_wait_is_right_and_without_it_wrong(seed):
    # right on this process's engine (the simulator, copies landing at their wait, or the
    # GPU); wrong without its wait in the simulator, which lands a copy at the last moment
    # PTX allows (on a GPU the same code is a race whose outcome varies from run to run)
    with ptx.cp_async_landing("wait"):
        assert lab.run_column_sums("column_sums", seed=seed)[0]
    ok, err = run_on_simulator("gemm_lessons.labs.k06:run_column_sums",
                               "column_sums_missing_wait", seed)
    assert not ok and err > 1e-3


@pytest.mark.skipif(not SIM, reason="the landing modes are the simulator's")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_landing_catches_a_copy_into_a_buffer_still_being_read(seed):
    with ptx.cp_async_landing("wait"):           # the bug hides: copies land at the wait
        assert lab.run_column_sums("column_sums_early_copy", seed=seed)[0]
    with ptx.cp_async_landing("random", seed):
        assert lab.run_column_sums("column_sums", seed=seed)[0]      # the rules kept
        ok, err = lab.run_column_sums("column_sums_early_copy", seed=seed)
    assert not ok and err > 1e-3


def test_the_early_copy_demo_prints_the_same_everywhere():
    assert lab.early_copy_demo(0) == {
        "wait": {"column_sums": True, "column_sums_early_copy": True},
        "random": {"column_sums": True, "column_sums_early_copy": False}}


def test_the_missing_wait_demo_prints_the_same_everywhere():
    # on the simulator: here, or in a child process when this one runs a GPU
    demo = lab.missing_wait_demo()
    assert demo == {"before": -1.0, "after": 1.0,
                    "correct": {"column_sums": True, "column_sums_missing_wait": False}}


# ------------------------------------------------- the cp.async emulation (simulator only)
@cuda.jit
def _copy_timeline(G, out):
    s = cuda.shared.array(32, nt.float16)
    if cuda.threadIdx.x == 0:
        for i in range(32):
            s[i] = 0
        ptx.cp_async16(s, 0, G, 0)               # group 1: G[0:8] -> s[0:8]
        ptx.cp_async_commit_group()
        out[0] = s[0]                            # not waited for: still the old value
        ptx.cp_async16(s, 8, G, 8)               # group 2: G[8:16] -> s[8:16]
        ptx.cp_async_commit_group()
        ptx.cp_async_wait_group(1)               # all but the newest group have landed
        out[1], out[2] = s[0], s[8]
        ptx.cp_async16_zfill(s, 16, G, 16, 6)    # 3 halves from G, then 5 zeros
        ptx.cp_async_ca(s, 24, G, 24, 8)         # 4 halves, cached in L1 too
        ptx.cp_async_commit_group()
        ptx.cp_async_wait_group(0)
        out[3] = s[8]
        for i in range(16):
            out[4 + i] = s[16 + i]


@pytest.mark.skipif(not SIM, reason="the emulation runs in the simulator")
def test_emulated_cp_async_lands_at_the_wait_that_covers_it():
    g = (np.arange(32) + 1).astype(np.float16)
    out = np.full(20, -1, np.float16)
    s_before = np.float16(0)
    _copy_timeline[1, 32](g, out)
    assert out[0] == s_before                     # read before any wait: stale
    assert out[1] == g[0] and out[2] == s_before  # wait_group(1): group 1 only
    assert out[3] == g[8]                         # wait_group(0): everything
    np.testing.assert_array_equal(out[4:7], g[16:19])         # the 6 bytes read
    np.testing.assert_array_equal(out[7:12], np.zeros(5))     # zero-filled
    np.testing.assert_array_equal(out[12:16], g[24:28])       # the 8-byte .ca copy


@pytest.mark.skipif(not SIM, reason="the emulation runs in the simulator")
def test_emulated_cp_async_refuses_misaligned_or_out_of_range_copies():
    s = np.zeros(32, np.float16)
    g = np.zeros(64, np.float16)
    with pytest.raises(ptx.PTXUsageError, match="16-byte aligned"):
        ptx.cp_async16(s, 4, g, 0)
    with pytest.raises(ptx.PTXUsageError, match="0 to 16"):
        ptx.cp_async16_zfill(s, 0, g, 0, 17)
    with pytest.raises(IndexError, match="past the end"):
        ptx.cp_async16(s, 0, g[:60], 56)          # elements 56..63 of a 60-element array
    with pytest.raises(ptx.PTXUsageError, match="compile-time constant"):
        ptx.cp_async_wait_group(1.5)


COMPILE_LABS = r"""
import gemm_lessons
from gemm_lessons.labs import k06
from numba import cuda
sig = "void(float16[::1], int64, float32[::1])"
for f in (k06.column_sums, k06.column_sums_missing_wait, k06.column_sums_early_copy):
    ptx, _ = cuda.compile_ptx(f.py_func, sig, cc=(9, 0))
    print(f.py_func.__name__, ptx.count("cp.async.cg.shared.global"))
"""


def test_the_demo_kernels_compile_for_a_gpu(py):
    # the simulator accepts what a GPU's compiler refuses (a shared array whose size is not
    # a constant): compile the demos as numba does for a GPU
    res = py(COMPILE_LABS, env_extra={"GEMM_LESSONS_ENGINE": "compile"})
    assert res.returncode == 0, res.stderr[-2000:]
    counts = dict(line.split() for line in res.stdout.splitlines())
    assert set(counts) == {"column_sums", "column_sums_missing_wait", "column_sums_early_copy"}
    assert all(int(n) >= 1 for n in counts.values()), counts
