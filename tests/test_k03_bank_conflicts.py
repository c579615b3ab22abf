"""Lesson 03: the column walk conflicts 32-way, one padding word per row makes it 1-way,
and nothing else changes."""
import functools
import re

import pytest
import torch
from numba import cuda, float32

import gemm_lessons as gl
from gemm_lessons import compiled, counters, engines, harness
from gemm_lessons.kernels import k03_bank_conflicts as k03

sim_only = pytest.mark.skipif(engines.on_gpu(), reason="counts accesses in the simulator")


@pytest.mark.parametrize("name", ["k03_bank_conflicts", "k03_padded"])
def test_correct_on_the_suite(name):
    assert gl.check(name).ok


@functools.lru_cache(maxsize=None)
def _shared(name):
    """{'sA' | 'sB': {'load': ways, 'store': ways}} of one 32 x 32 x 64 launch, and its trace."""
    a, b = harness.make_operands(32, 32, 64)
    c = torch.empty(32, 32)
    with counters.trace(A=a, B=b, C=c) as t:
        gl.matmul(a, b, name, out=c)
    arrays = sorted(t.shared_summary())      # sA is declared first, on the lower line
    assert len(arrays) == 2
    out = dict(zip(("sA", "sB"), (t.shared_summary()[x] for x in arrays)))
    return out, t


@sim_only
def test_unpadded_column_walk_is_32_way():
    s, t = _shared("k03_bank_conflicts")
    assert s["sA"]["load"] == 32          # every request of the inner loop
    assert s["sB"]["load"] == 1           # a broadcast
    assert s["sA"]["store"] == 1 and s["sB"]["store"] == 1
    assert t.max_shared_ways("load") == 32


@sim_only
def test_padded_is_conflict_free():
    s, t = _shared("k03_padded")
    assert s["sA"]["load"] == 1 and s["sB"]["load"] == 1
    assert t.max_shared_ways() == 1


@sim_only
def test_lane_to_bank_map():
    _, t = _shared("k03_bank_conflicts")
    name = sorted(t.shared_summary())[0]
    req = next(iter(t.requests("shared", name, "load").values()))
    banks = counters.banks_of_request(req)
    assert list(banks) == [0] and len(banks[0]) == 32       # 32 lanes, one bank
    _, t = _shared("k03_padded")
    name = sorted(t.shared_summary())[0]
    req = next(iter(t.requests("shared", name, "load").values()))
    assert sorted(counters.banks_of_request(req)) == list(range(32))


def _count(text, op):
    return len(re.findall(re.escape(op) + r"\s", text))


def test_padding_changes_only_the_shared_array():
    plain = compiled.ptx("k03_bank_conflicts", (9, 0))
    padded = compiled.ptx("k03_padded", (9, 0))
    assert "ld.shared.f32" in plain
    for op in ("ld.shared.f32", "fma.rn.f32", "bar.sync"):  # the same kind of code...
        assert _count(plain, op) > 0 and _count(padded, op) > 0, op
    sizes = [re.search(r"\.shared .*\[(\d+)\]", t).group(1) for t in (plain, padded)]
    assert int(sizes[1]) == int(sizes[0]) + 32 * 4          # ...one word more per row
    for t in (plain, padded):
        rep = compiled.ptxas_report(t, (9, 0))
        if rep is not None:
            assert rep["registers"] <= 64 and rep["spill_stores"] == 0


def _make_reads_the_pad(BN):
    """A padded kernel with a classic bug: the k loop runs over the array's width, which
    now includes the padding column (uninitialised shared memory)."""
    BM, BK = k03.BM, k03.BK

    @cuda.jit
    def reads_pad(A, B, C):
        sA = cuda.shared.array((32, 33), float32)
        sB = cuda.shared.array((32, BN), float32)
        M, K = A.shape
        N = B.shape[1]
        lane = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        t = ty * BM + lane
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        acc = float32(0.0)
        for k0 in range(0, K, BK):
            for r in range(ty, BM, BN):
                sA[r, 32] = 1.0                       # whatever sits in the padding
                if m0 + r < M and k0 + lane < K:
                    sA[r, lane] = A[m0 + r, k0 + lane]
                else:
                    sA[r, lane] = 0.0
            for e in range(t, BK * BN, BM * BN):
                kr = e // BN
                c = e % BN
                if k0 + kr < K and n0 + c < N:
                    sB[kr, c] = B[k0 + kr, n0 + c]
                else:
                    sB[kr, c] = 0.0
            cuda.syncthreads()
            for k in range(sA.shape[1]):              # BUG: 33, not BK = 32
                acc += sA[lane, k] * sB[k % 32, ty]
            cuda.syncthreads()
        if m0 + lane < M and n0 + ty < N:
            C[m0 + lane, n0 + ty] = acc
    return reads_pad


def test_check_catches_a_loop_over_the_padding():
    BN = k03.config()["BN"]
    kernel = _make_reads_the_pad(BN)

    def run(a, b, c):
        M, N = c.shape
        grid = ((N + BN - 1) // BN, (M + 31) // 32)
        kernel[grid, (32, BN), engines.numba_stream()](
            engines.as_numba(a), engines.as_numba(b), engines.as_numba(c))

    with pytest.raises(harness.CheckError, match="square"):
        harness.check(run, "reads_pad", cases=harness.shape_suite()[:1])
