"""mbarriers (gemm_lessons.ptx_mbarrier): the PTX ISA's phase rules in the emulation, a ring
of stages handed between a producer and consumers through full/empty barriers, and each
way of getting the barriers wrong failing within seconds with a message that names the
barrier, its stage and its phase (simulator); the PTX compiles for sm_90a with ptxas."""
import gemm_lessons as gl  # noqa: I001  (first: it picks the engine)
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from numba import cuda, float32, int64

from gemm_lessons import compiled, engines, ptx_mbarrier as mb
from gemm_lessons.ptx import PTXUsageError

SIM = not engines.on_gpu()
HOPPER = SIM or engines.engine().capability >= (9, 0)
sim_only = pytest.mark.skipif(not SIM, reason="a broken barrier hangs a GPU: simulator only")
needs_hopper = pytest.mark.skipif(not HOPPER, reason="mbarrier waits need compute capability 9.0")

STAGES, ROUNDS, CONSUMERS = 2, 5, 64


# --------------------------------------------------------------- the phase rules, one call at a time
@sim_only
def test_a_phase_completes_when_arrivals_and_bytes_are_both_done():
    bars = np.zeros(2, np.int64)
    mb.mbarrier_init(bars, 0, 2)
    assert mb.mbarrier_try_wait_parity(bars, 0, 1)      # the phase before the first: complete
    mb.mbarrier_arrive(bars, 0)
    state = mb._bars[bars.ctypes.data]
    assert (state.phase, state.pending) == (0, 1)        # one of two arrivals
    mb.mbarrier_arrive(bars, 0)
    assert (state.phase, state.pending) == (1, 2)        # flipped, count reset
    assert mb.mbarrier_try_wait_parity(bars, 0, 0)       # phase 0 has completed
    mb.mbarrier_init(bars, 1, 1)
    mb.mbarrier_arrive_expect_tx(bars, 1, 256)
    tx = mb._bars[bars.ctypes.data + 8]
    assert (tx.phase, tx.pending, tx.tx) == (0, 0, 256)  # arrived, 256 bytes to come
    mb.complete_tx(bars, 1, 200)
    assert tx.phase == 0
    mb.complete_tx(bars, 1, 56)
    assert (tx.phase, tx.tx) == (1, 0)


@sim_only
def test_more_bytes_than_expected_is_an_error_naming_the_barrier_and_phase():
    full = np.zeros(3, np.int64)
    mb.mbarrier_init(full, 2, 1)
    mb.mbarrier_arrive_expect_tx(full, 2, 128)
    with pytest.raises(mb.MbarrierTxError, match=r"full\[2\] \(stage 2\), phase 0 .*64 bytes "
                                                 r"more than"):
        mb.complete_tx(full, 2, 192)


@sim_only
def test_an_arrival_beyond_the_count_is_an_error_naming_the_barrier_and_phase():
    full = np.zeros(2, np.int64)
    for arrive in (lambda: mb.mbarrier_arrive(full, 1),
                   lambda: mb.mbarrier_arrive_expect_tx(full, 1, 64)):
        mb.mbarrier_init(full, 1, 1)
        mb.mbarrier_arrive_expect_tx(full, 1, 128)      # the one arrival; bytes to come
        with pytest.raises(mb.MbarrierTxError, match=r"full\[1\] \(stage 1\), phase 0: "
                                                     r"mbarrier_arrive.* no arrival pending"):
            arrive()


@sim_only
def test_bad_arguments_get_clear_errors():
    bars = np.zeros(2, np.int64)
    with pytest.raises(PTXUsageError, match="never initialized"):
        mb.mbarrier_arrive(bars, 1)
    with pytest.raises(PTXUsageError, match="count .* from 1 to"):
        mb.mbarrier_init(bars, 0, 0)
    with pytest.raises(PTXUsageError, match="int64"):
        mb.mbarrier_init(np.zeros(2, np.float32), 0, 1)
    with pytest.raises(IndexError):
        mb.mbarrier_init(bars, 2, 1)
    mb.mbarrier_init(bars, 0, 1)
    with pytest.raises(PTXUsageError, match="nbytes .* from 0 to"):
        mb.mbarrier_arrive_expect_tx(bars, 0, mb.TX_LIMIT + 1)


# ------------------------------------------------- a ring of stages: one producer, many consumers
def make_ring(bug=None):
    """Thread 0 produces ROUNDS values into a ring of STAGES shared slots; threads 1..
    CONSUMERS read each and add it up. full[s]: the slot holds a value (1 arrival: the
    producer's); empty[s]: every consumer has read it (CONSUMERS arrivals). ``bug``: None,
    'parity' (the producer's first wait on empty has parity 0, not 1), 'no_release' (the
    consumers never arrive on empty), 'tx' (the producer announces 64 bytes no copy
    delivers)."""
    first_empty_parity = 0 if bug == "parity" else 1
    expect_tx, release = bug == "tx", bug != "no_release"     # constants of the kernel

    @cuda.jit
    def ring(out):
        full = cuda.shared.array(STAGES, int64)
        empty = cuda.shared.array(STAGES, int64)
        slot = cuda.shared.array(STAGES, float32)
        tid = cuda.threadIdx.x
        if tid == 0:
            for s in range(STAGES):
                mb.mbarrier_init(full, s, 1)
                mb.mbarrier_init(empty, s, CONSUMERS)
            mb.fence_mbarrier_init()
        cuda.syncthreads()
        if tid == 0:                                       # the producer
            for r in range(ROUNDS):
                s, ph = r % STAGES, (r // STAGES) & 1
                mb.mbarrier_wait(empty, s, ph ^ first_empty_parity)   # slot free
                slot[s] = float32(r + 1)
                if expect_tx:
                    mb.mbarrier_arrive_expect_tx(full, s, 64)
                else:
                    mb.mbarrier_arrive(full, s)             # slot full
        else:                                              # the consumers
            total = float32(0.0)
            for r in range(ROUNDS):
                s, ph = r % STAGES, (r // STAGES) & 1
                mb.mbarrier_wait(full, s, ph)
                total += slot[s]
                if release:
                    mb.mbarrier_arrive(empty, s)
            out[tid] = total
    return ring


@needs_hopper
def test_the_ring_hands_every_value_to_every_consumer():
    out = np.full(CONSUMERS + 1, np.nan, np.float32)
    make_ring()[1, CONSUMERS + 1](out)
    assert (out[1:] == ROUNDS * (ROUNDS + 1) / 2).all()


def _deadlock(bug):
    out = np.full(CONSUMERS + 1, np.nan, np.float32)
    t0 = time.monotonic()
    with pytest.raises(mb.MbarrierDeadlock) as info:
        make_ring(bug)[1, CONSUMERS + 1](out)
    assert time.monotonic() - t0 < 20
    import threading
    from numba.cuda.simulator.kernel import BlockThread
    assert not [t for t in threading.enumerate() if isinstance(t, BlockThread) and t.is_alive()]
    return str(info.value)


@sim_only
def test_a_wrong_parity_is_a_deadlock_naming_the_barrier_stage_and_phase():
    msg = _deadlock("parity")
    # the producer waits for phase 0 of empty[0] to complete; the consumers wait on full[0]
    assert "1 thread(s) wait with parity 0 on mbarrier empty[0] (stage 0): its phase 0 " \
           "(parity 0) never completes, 64 of 64 arrivals pending" in msg
    assert f"{CONSUMERS} thread(s) wait with parity 0 on mbarrier full[0] (stage 0)" in msg


@sim_only
def test_a_missing_arrive_is_a_deadlock_naming_the_barrier_stage_and_phase():
    msg = _deadlock("no_release")
    # the producer filled both stages, then waits for stage 0 to be released: never
    assert "wait with parity 0 on mbarrier empty[0] (stage 0): its phase 0 (parity 0) " \
           "never completes, 64 of 64 arrivals pending" in msg


@sim_only
def test_bytes_that_never_arrive_are_a_deadlock_naming_the_barrier_and_the_bytes():
    msg = _deadlock("tx")
    assert f"{CONSUMERS} thread(s) wait with parity 0 on mbarrier full[0] (stage 0): its " \
           "phase 0 (parity 0) never completes, 0 of 1 arrivals pending, 64 transaction " \
           "bytes outstanding" in msg


@sim_only
def test_after_a_deadlock_the_simulator_runs_the_next_kernel():
    _deadlock("no_release")
    test_the_ring_hands_every_value_to_every_consumer()


# --------------------------------------------------------------------------------- the PTX
_COMPILE = """
import json, sys
import gemm_lessons
from numba import cuda
sys.path.insert(0, {tests!r})
import test_ptx_mbarrier as t
text = [cuda.compile_ptx(t.make_ring(bug).py_func, "void(float32[::1])", cc=(9, 0, "a"))[0]
        for bug in (None, "tx")]
print(json.dumps(text))
"""


def ring_ptx():
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "TRITON_INTERPRET")}
    env["GEMM_LESSONS_ENGINE"] = "compile"
    code = _COMPILE.format(tests=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_ptx_has_each_instruction_and_ptxas_takes_it_for_sm_90a():
    plain, tx = ring_ptx()
    assert ".target sm_90a" in plain
    for op in ("mbarrier.init.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
               "mbarrier.try_wait.parity.shared::cta.b64", "fence.mbarrier_init.release.cluster"):
        assert op in plain, op
    assert "mbarrier.arrive.expect_tx.shared::cta.b64" in tx
    for text in (plain, tx):
        rep = compiled.ptxas_report(text, (9, 0))
        if rep is not None:
            assert rep["spill_stores"] == 0 and rep["stack_bytes"] == 0


# ------------------------------------------------------------- named barriers: part of a block
def make_named(parties):
    """Threads 0..63 meet at named barrier 1 (expecting ``parties`` threads), then read what
    the others wrote; threads 64..95 take no part."""
    @cuda.jit
    def named(out):
        s = cuda.shared.array(64, float32)
        tid = cuda.threadIdx.x
        if tid < 64:
            s[tid] = float32(tid)
            mb.named_barrier_sync(1, parties)
            out[tid] = s[63 - tid]
    return named


@needs_hopper
def test_a_named_barrier_orders_the_threads_that_take_part():
    out = np.full(96, np.nan, np.float32)
    make_named(64)[1, 96](out)
    assert (out[:64] == np.arange(64)[::-1]).all() and np.isnan(out[64:]).all()


@sim_only
def test_a_named_barrier_that_never_fills_is_a_deadlock():
    with pytest.raises(mb.MbarrierDeadlock, match=r"64 thread\(s\) wait with parity 0 on "
                       r"named barrier 1: its phase 0 \(parity 0\) never completes, 32 of 96 "
                       r"arrivals pending"):
        make_named(96)[1, 96](np.zeros(96, np.float32))
