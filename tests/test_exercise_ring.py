"""Lesson 06's ring exercises (6 and 7): the sides they are given make a correct ring that
both checks accept, and the ring audit leaves the simulator as it found it, even after a
deadlock it reported (simulator only: the exercises choose it)."""
import gemm_lessons as gl  # noqa: F401,I001  (picks the engine first)
import pytest
from numba import cuda, float32, int64
from numba.types import float16

from gemm_lessons import engines
from gemm_lessons import exercise_checks as checks
from gemm_lessons import ptx_mbarrier as mb

pytestmark = pytest.mark.skipif(engines.on_gpu(), reason="the exercises run on the simulator")

ROWS, STAGES = 64, 3


def _ring(release=True, drain=False):
    """A ring kernel: exercise 6's given producer warp (fill_ring) and consumers written
    here with a (stage, phase) state (waiting on full, reading through add_row, and, unless
    ``release=False``, releasing on empty); ``drain=True``: exercise 7's given consumers
    (drain_ring) instead."""
    fill_ring = checks.k06_fill_ring(ROWS, STAGES)
    add_row = checks.k06_add_row(ROWS, STAGES)
    consumers = checks.k06_drain_ring(ROWS, STAGES) if drain else None   # a kernel only names

    @cuda.jit
    def ring(tA, tx, y, M, K):
        sA = cuda.shared.array(STAGES * ROWS * 64, float16)
        sx = cuda.shared.array(STAGES * 64, float16)
        full = cuda.shared.array(STAGES, int64)
        empty = cuda.shared.array(STAGES, int64)
        tid = cuda.threadIdx.x
        row0 = cuda.blockIdx.x * ROWS
        k_tiles = (K + 63) // 64
        if tid == 0:
            for s in range(STAGES):
                mb.mbarrier_init(full, s, 32)      # the producer warp's 32 lanes arrive
                mb.mbarrier_init(empty, s, ROWS)
            mb.fence_mbarrier_init()
        cuda.syncthreads()
        if tid < 32:
            fill_ring(sA, sx, full, empty, tA, tx, row0, k_tiles, tid)
        else:
            r = tid - 32
            if consumers is not None:
                acc = consumers(sA, sx, full, empty, r, k_tiles)
            else:
                acc = float32(0.0)
                s, phase = 0, 0
                for kt in range(k_tiles):
                    mb.mbarrier_wait(full, s, phase)
                    acc += add_row(sA, sx, s, r)
                    if release:
                        mb.mbarrier_arrive(empty, s)
                    s += 1
                    if s == STAGES:
                        s = 0
                        phase ^= 1
            if row0 + r < M:
                y[row0 + r] = acc
    return ring


def _divided_ring():
    """Exercise 6's ring with consumers that divide the k-tile index, as drain_ring and the
    lessons' kernels do: right numbers, but not the exercise's state."""
    fill_ring = checks.k06_fill_ring(ROWS, STAGES)
    add_row = checks.k06_add_row(ROWS, STAGES)

    @cuda.jit
    def ring(tA, tx, y, M, K):
        sA = cuda.shared.array(STAGES * ROWS * 64, float16)
        sx = cuda.shared.array(STAGES * 64, float16)
        full = cuda.shared.array(STAGES, int64)
        empty = cuda.shared.array(STAGES, int64)
        tid = cuda.threadIdx.x
        row0 = cuda.blockIdx.x * ROWS
        k_tiles = (K + 63) // 64
        if tid == 0:
            for s in range(STAGES):
                mb.mbarrier_init(full, s, 32)
                mb.mbarrier_init(empty, s, ROWS)
            mb.fence_mbarrier_init()
        cuda.syncthreads()
        if tid < 32:
            fill_ring(sA, sx, full, empty, tA, tx, row0, k_tiles, tid)
        else:
            r = tid - 32
            acc = float32(0.0)
            for kt in range(k_tiles):
                mb.mbarrier_wait(full, kt % STAGES, (kt // STAGES) & 1)
                acc += add_row(sA, sx, kt % STAGES, r)
                mb.mbarrier_arrive(empty, kt % STAGES)
            if row0 + r < M:
                y[row0 + r] = acc
    return ring


def test_the_given_producer_and_a_correct_consumer_loop_pass_exercise_6():
    assert checks.ex06_ring_consumer(_ring()).startswith("consumer loop: y = A @ x right on 3 ")


def test_exercise_6_refuses_exercise_7s_given_consumers():
    with pytest.raises(checks.ExerciseError):
        checks.ex06_ring_consumer(_ring(drain=True))


def test_exercise_6_refuses_a_divided_k_tile_index():
    with pytest.raises(checks.ExerciseError, match="divides the k-tile index"):
        checks.ex06_ring_consumer(_divided_ring())


def test_after_a_reported_deadlock_the_simulator_is_as_it_was():
    from numba.cuda.simulator import kernelapi

    from gemm_lessons import ptx_tma
    shared, tma = kernelapi.FakeCUDAShared.array, ptx_tma.tma_load_2d
    with pytest.raises(checks.ExerciseError, match="a missing release"):
        checks.ex06_ring_consumer(_ring(release=False))
    assert kernelapi.FakeCUDAShared.array is shared and ptx_tma.tma_load_2d is tma
    assert checks.ex06_ring_consumer(_ring()).startswith("consumer loop")


def test_the_helpers_refuse_another_ring():
    with pytest.raises(ValueError, match="ROWS = 64 and STAGES = 3"):
        checks.k06_fill_ring(64, 4)
