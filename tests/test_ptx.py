"""The cp.async emulation's landing modes (simulator only).

By default a copy lands at the ``cp_async_wait_group`` that covers it. In the random mode
(``ptx.cp_async_landing("random", seed)`` or ``GEMM_LESSONS_CP_ASYNC_LANDING=random:SEED``)
each copy lands at a random landing point of its thread between its issue and that wait:
kernels that overwrite a buffer still in flight or still being read then fail, correct
kernels stay correct, and ``wait_group(N)`` still lands all but the newest N groups.
"""
import gemm_lessons as gl  # noqa: F401,I001  (first: it picks the engine)
import os
import subprocess
import sys

import numba.types as nt
import numpy as np
import pytest
import torch
from numba import cuda

from gemm_lessons import engines, harness, ptx

pytestmark = pytest.mark.skipif(engines.on_gpu(), reason="the emulation runs in the simulator")

THREADS, TILES = 32, 4      # one warp; each thread copies one 16-byte chunk (4 floats) a tile


@cuda.jit
def _prefetch_into_the_buffer_being_read(G, out):
    """Sums tiles 0..TILES-1 of G, but issues the copy of tile k + 1 into the one buffer
    before it has read tile k from it: correct only if no copy lands before its wait."""
    buf = cuda.shared.array(THREADS * 4, nt.float32)
    t = cuda.threadIdx.x
    ptx.cp_async16(buf, 4 * t, G, (0, 4 * t))
    ptx.cp_async_commit_group()
    ptx.cp_async_wait_group(0)
    acc = 0.0
    for k in range(TILES):
        if k + 1 < TILES:
            ptx.cp_async16(buf, 4 * t, G, (k + 1, 4 * t))    # BUG: buf is still being read
            ptx.cp_async_commit_group()
        for j in range(4):
            acc += buf[4 * t + j]
        ptx.cp_async_wait_group(0)
    out[t] = acc


@cuda.jit
def _two_copies_in_flight_to_one_buffer(G, out):
    """Copies tile 0 and then tile 1 into the same chunk with no wait between: which one
    the chunk holds after the wait is not defined on a GPU."""
    buf = cuda.shared.array(THREADS * 4, nt.float32)
    t = cuda.threadIdx.x
    ptx.cp_async16(buf, 4 * t, G, (0, 4 * t))
    ptx.cp_async_commit_group()
    ptx.cp_async16(buf, 4 * t, G, (1, 4 * t))                # BUG: tile 0 is in flight
    ptx.cp_async_commit_group()
    ptx.cp_async_wait_group(0)
    out[t] = buf[4 * t]


@cuda.jit
def _waits(G, out):
    """After wait_group(1) the older of two groups has landed; after wait_group(0), all."""
    buf = cuda.shared.array(THREADS * 8, nt.float32)
    t = cuda.threadIdx.x
    for j in range(8):
        buf[8 * t + j] = -1.0
    ptx.cp_async16(buf, 8 * t, G, (0, 4 * t))
    ptx.cp_async_commit_group()
    ptx.cp_async16(buf, 8 * t + 4, G, (1, 4 * t))
    ptx.cp_async_commit_group()
    ptx.cp_async_wait_group(1)
    out[t, 0] = buf[8 * t]
    cuda.syncthreads()
    ptx.cp_async_wait_group(0)
    out[t, 1] = buf[8 * t + 4]


def _tiles():
    return (np.arange(TILES * THREADS * 4, dtype=np.float32).reshape(TILES, THREADS * 4)
            % 7 + 1)


def _run_prefetch():
    G = _tiles()
    out = np.full(THREADS, np.nan, np.float32)
    _prefetch_into_the_buffer_being_read[1, THREADS](G, out)
    want = G.reshape(TILES, THREADS, 4).sum(axis=(0, 2))
    return out, want


def test_by_default_a_copy_lands_at_its_wait_so_the_bug_stays_hidden():
    out, want = _run_prefetch()
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_landing_exposes_a_copy_into_the_buffer_being_read(seed):
    with ptx.cp_async_landing("random", seed=seed):
        out, want = _run_prefetch()
    assert (out != want).sum() >= THREADS // 4      # many threads read the next tile early


def test_random_landing_is_reproducible_for_a_seed():
    with ptx.cp_async_landing("random", seed=5):
        first, _ = _run_prefetch()
        again, _ = _run_prefetch()
    with ptx.cp_async_landing("random", seed=6):
        other, _ = _run_prefetch()
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_random_landing_exposes_two_copies_in_flight_to_one_buffer():
    G = _tiles()
    out = np.full(THREADS, np.nan, np.float32)
    _two_copies_in_flight_to_one_buffer[1, THREADS](G, out)
    np.testing.assert_array_equal(out, G[1, ::4])               # in issue order
    with ptx.cp_async_landing("random", seed=0):
        _two_copies_in_flight_to_one_buffer[1, THREADS](G, out)
    assert (out == G[0, ::4]).any() and (out == G[1, ::4]).any()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_landing_keeps_what_wait_group_promises(seed):
    G = _tiles()
    out = np.full((THREADS, 2), np.nan, np.float32)
    with ptx.cp_async_landing("random", seed=seed):
        _waits[1, THREADS](G, out)
    np.testing.assert_array_equal(out[:, 0], G[0, ::4])
    np.testing.assert_array_equal(out[:, 1], G[1, ::4])


@pytest.mark.parametrize("kernel", ["k06_cp_async", "k06_wgmma"])
def test_correct_pipelines_stay_correct_under_random_landing(kernel):
    cases = [c for c in harness.shape_suite() if c.name in ("ragged", "K=1")]
    cases.append(harness.Case("long K", 24, 20, 80))
    for seed in (0, 1, 2):
        with ptx.cp_async_landing("random", seed=seed):
            report = harness.check(lambda a, b, out: gl.matmul(a, b, kernel, out=out),
                                   f"{kernel} random landing {seed}", (torch.float16,), cases)
        assert report.ok


def test_the_environment_variable_picks_the_mode_and_a_bad_value_is_refused():
    code = "import gemm_lessons.ptx as p; print(p.cp_async_landing_mode())"
    env = dict(os.environ, GEMM_LESSONS_CP_ASYNC_LANDING="random:7")
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert got.strip() == "('random', 7)"
    with pytest.raises(ValueError, match="random:SEED"):
        with ptx.cp_async_landing("sometimes"):
            pass


def test_a_misaligned_source_reports_its_offset_from_16_bytes():
    s = np.zeros(32, np.float16)
    g = np.zeros(64, np.float16)
    with pytest.raises(ptx.PTXUsageError, match="16-byte aligned .* is 2 bytes past"):
        ptx.cp_async16(s, 0, g, 1)
