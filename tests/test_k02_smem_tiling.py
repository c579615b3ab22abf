"""Lesson 02: tiles in shared memory cut global loads by the tile size, and the check
catches the mistakes the lesson warns about."""
import pytest
import torch
from numba import cuda, float32

import gemm_lessons as gl
from gemm_lessons import compiled, counters, engines, harness
from gemm_lessons.kernels import k02_smem_tiling as k02

sim_only = pytest.mark.skipif(engines.on_gpu(), reason="counts accesses in the simulator")


def test_correct_on_the_suite():
    assert gl.check("k02_smem_tiling").ok


def test_ptx_stages_tiles_in_shared_memory():
    text = compiled.ptx("k02_smem_tiling", (9, 0))
    assert "st.shared.f32" in text and "ld.shared.f32" in text   # the tiles
    assert "bar.sync" in text                                     # syncthreads
    assert "ld.local" not in text and "st.local" not in text
    rep = compiled.ptxas_report(text, (9, 0))
    if rep is not None:   # 1024 threads per block fit only with <= 64 registers each
        assert rep["registers"] <= 64 and rep["spill_stores"] == 0


def _load_requests(kernel, M=32, N=32, K=32):
    a, b = harness.make_operands(M, N, K)
    c = torch.empty(M, N)
    with counters.trace(A=a, B=b, C=c) as t:
        gl.matmul(a, b, kernel, out=c)
    return {x: len(t.requests("global", x, "load")) for x in ("A", "B")}


@sim_only
def test_global_loads_drop_by_the_tile_size():
    TILE = k02.config()["TILE"]
    naive = _load_requests("k01_coalesced")
    tiled = _load_requests("k02_smem_tiling")
    for x in ("A", "B"):
        assert naive[x] == tiled[x] * TILE, (x, naive, tiled)


def _make_without_zero_fill(TILE):
    """The lesson-02 kernel with a classic bug: out-of-range tile elements are skipped
    instead of set to 0, so a partial last K tile multiplies stale (or garbage) values."""
    @cuda.jit
    def no_zero_fill(A, B, C):
        sA = cuda.shared.array((TILE, TILE), float32)
        sB = cuda.shared.array((TILE, TILE), float32)
        M, K = A.shape
        N = B.shape[1]
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        row = cuda.blockIdx.y * TILE + ty
        col = cuda.blockIdx.x * TILE + tx
        acc = float32(0.0)
        for k0 in range(0, K, TILE):
            if row < M and k0 + tx < K:
                sA[ty, tx] = A[row, k0 + tx]
            if k0 + ty < K and col < N:
                sB[ty, tx] = B[k0 + ty, col]
            cuda.syncthreads()
            for k in range(TILE):
                acc += sA[ty, k] * sB[k, tx]
            cuda.syncthreads()
        if row < M and col < N:
            C[row, col] = acc
    return no_zero_fill


def test_check_catches_a_missing_k_mask():
    TILE = k02.config()["TILE"]
    kernel = _make_without_zero_fill(TILE)

    def run(a, b, c):
        M, N = c.shape
        grid = ((N + TILE - 1) // TILE, (M + TILE - 1) // TILE)
        kernel[grid, (TILE, TILE), engines.numba_stream()](
            engines.as_numba(a), engines.as_numba(b), engines.as_numba(c))

    s = 1 if not engines.on_gpu() else 16
    case = harness.Case("ragged", 20 * s + 1, 18 * s + 3, 2 * TILE + 5,
                        hint="a missing K mask")
    with pytest.raises(harness.CheckError, match="ragged"):
        harness.check(run, "no_zero_fill", cases=[case])
