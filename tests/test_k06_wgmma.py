"""Lesson 06, last step: Hopper's wgmma fed by cp.async into swizzled shared memory.

The tests prove the lesson's points: the PTX holds ``wgmma.mma_async`` with two
descriptors (sm_90a), the fences and the waits, and no local memory, and ptxas serializes
no wgmma; the 128-byte swizzle keeps 16-byte chunks whole and spreads the 8 rows a tensor
core reads together over all banks; the emulation places each product element in the
accumulator fragment the PTX ISA documents; the kernel is right on the shape suite (on a
GPU: the hardware agrees with the emulation's layout model), and alpha/beta follow BLAS.
"""
import gemm_lessons as gl  # first: it picks the engine
import numpy as np
import numba.types as nt
import pytest
import torch
from numba import cuda

from gemm_lessons import compiled, engines, harness, ptx, ptx_hopper
from gemm_lessons.kernels import k06_wgmma as k06w
from gemm_lessons.ptx import PTXUsageError

SIM = not engines.on_gpu()


@pytest.fixture(autouse=True, scope="module")
def copies_land_at_random_moments():
    # on the simulator every copy lands at a random moment between its issue and its wait
    # (seeded), so a kernel that overwrote a buffer still in flight or still being read
    # would fail these checks (on a GPU the hardware decides; this changes nothing there)
    with ptx.cp_async_landing("random", seed=6):
        yield
NAME = "k06_wgmma"
HOPPER = SIM or engines.engine().capability >= (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="wgmma needs compute capability 9.0")


@needs_hopper
def test_correct_on_the_suite_in_fp16_and_bf16():
    report = gl.check(NAME)
    assert report.ok and str(report) == "k06_wgmma: correct on 9 shapes (bfloat16, float16)"


@needs_hopper
@pytest.mark.parametrize("cfg", [dict(BM=128, BN=64 if SIM else 128, STAGES=3),
                                 dict(BM=64, BN=128, STAGES=4)])
def test_other_tiles_and_depths_are_correct(cfg):
    run = lambda a, b, out: k06w.run(a, b, None, out, config=cfg)  # noqa: E731
    cases = [c for c in harness.shape_suite() if c.name in ("ragged", "K=1", "sliced")]
    cases.append(harness.Case("long K", 70, 130, 400 if SIM else 3000))
    assert harness.check(run, f"k06_wgmma {cfg}", (torch.float16,), cases).ok


def test_the_simulator_configuration_differs_only_in_tile_sizes():
    gpu, sim = k06w.GPU_CONFIG, k06w.SIM_CONFIG
    differ = {f for f in vars(gpu) if getattr(gpu, f) != getattr(sim, f)}
    assert type(gpu) is type(sim) and differ <= {"BM", "BN"}   # same stages, same waits


@pytest.mark.skipif(not SIM, reason="the GPU runs its own configuration in every test")
def test_the_gpu_configuration_itself_is_correct_on_the_simulator():
    # two warpgroups, m64n256k16: the very loop the GPU runs, on one small ragged shape
    run = lambda a, b, out: k06w.run(a, b, None, out, config=k06w.GPU_CONFIG)  # noqa: E731
    case = harness.Case("ragged, two tiles", 70, 40, 100)
    assert harness.check(run, NAME, (torch.float16,), [case]).ok


def test_the_checkpoint_prints_the_same_line_on_any_machine():
    # on an Ampere GPU, check_anywhere runs the check in a simulator child process
    want = "k06_wgmma: correct on 9 shapes (bfloat16, float16)"
    if HOPPER:
        assert gl.check_anywhere(NAME) == want
    else:
        from gemm_lessons import api
        assert api._check_in_child(NAME) == want


@needs_hopper
def test_gemm_alpha_beta_follow_blas():
    M, N, K = (70, 66, 90) if SIM else (600, 520, 330)
    rel, beta0_ignores_c, alpha0_ignores_a = harness.check_alpha_beta(NAME, torch.bfloat16,
                                                                      M, N, K, seed=6)
    assert rel < 1e-2 and beta0_ignores_c and alpha0_ignores_a


def test_ptx_is_wgmma_with_descriptors_fences_and_waits():
    text = compiled.ptx(NAME, (9, 0))
    assert ".target sm_90a" in text                      # wgmma is arch-specific
    n = k06w.GPU_CONFIG.BN
    assert text.count(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16") == 4
    for op in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
               "wgmma.wait_group.sync.aligned 1", "wgmma.wait_group.sync.aligned 0",
               "fence.proxy.async.shared::cta", "cp.async.cg.shared.global"):
        assert op in text, op
    assert "ld.local" not in text and "st.local" not in text   # accumulators in registers
    assert "ldmatrix" not in text                        # no fragments: wgmma reads smem
    rep = compiled.ptxas_report(text, (9, 0), warnings=True)
    if rep is not None:
        assert rep["spill_stores"] == 0 and rep["registers"] <= 255
        assert rep["warnings"] == []                     # no wgmma serialized by ptxas


def test_wgmma_runs_on_hopper_only():
    from gemm_lessons import registry
    entry = registry.get(NAME)
    assert entry.runs_on((9, 0)) and not entry.runs_on((8, 9)) and not entry.runs_on((10, 0))
    assert gl.runs_here(NAME) == HOPPER


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="BM a multiple of 64"):
        k06w.WgmmaConfig(BM=96)
    with pytest.raises(ValueError, match="BN 64, 128, 192 or 256"):
        k06w.WgmmaConfig(BN=100)
    with pytest.raises(ValueError, match="STAGES >= 3"):
        k06w.WgmmaConfig(STAGES=2)
    with pytest.raises(ValueError, match="multiple of 8 rows apart"):
        k06w.WgmmaConfig(BM=64, BN=256)
    if SIM:
        acc = np.zeros(32, np.float32)
        s = np.zeros(64 * 64, np.float16)
        with pytest.raises(PTXUsageError, match="N .* must be 64, 128, 192 or 256"):
            ptx_hopper.wgmma_mma(acc, s, 0, s, 0, 100, 8192)
        with pytest.raises(PTXUsageError, match="16-byte aligned"):
            ptx_hopper.wgmma_mma(acc, s, 4, s, 0, 64, 8192)


# ---------------------------------------------------------------- the swizzle, the layout
def test_swizzle128_keeps_chunks_whole_and_spreads_rows_over_the_banks():
    sw = np.array([ptx_hopper.swizzled_offset(o) for o in range(1024)])
    assert sorted(sw) == list(range(1024))               # a permutation of the atom
    assert (sw[1::2] - sw[::2] == 1).all() and (sw % 16 == np.arange(1024) % 16).all()
    for chunk in range(8):                               # one chunk column, 8 rows
        col = sw[[r * 128 + chunk * 16 for r in range(8)]]
        assert len({(c % 128) // 16 for c in col}) == 8  # 8 different groups of 4 banks


def test_accumulator_fragment_matches_the_ptx_isa():
    # thread 0 holds D[0, 0:2] and D[8, 0:2]; thread 5 (lane 5) rows 1 and 9, columns 2-3
    assert [ptx_hopper.acc_row_col(0, i) for i in range(4)] == [(0, 0), (0, 1), (8, 0), (8, 1)]
    assert ptx_hopper.acc_row_col(5, 4) == (1, 10)
    assert ptx_hopper.acc_row_col(32 * 3 + 31, 2 * 4 * 7 + 3) == (16 * 3 + 7 + 8, 8 * 14 + 7)
    cells = {ptx_hopper.acc_row_col(t, i) for t in range(128) for i in range(128)}
    assert cells == {(r, c) for r in range(64) for c in range(256)}   # each cell once


def _swizzled(a, b):
    """A (64 x 16) and B (16 x 64) laid out as wgmma_mma reads them: A K-major in one
    128-byte-swizzle atom column (row m at m * 128 bytes, k in the first 32 bytes), B
    N-major (k-row k at k * 128 bytes); both swizzled."""
    sA = np.zeros(64 * 64, np.float16)
    sB = np.zeros(16 * 64, np.float16)
    for m in range(64):
        for k in range(16):
            sA[ptx_hopper.swizzled_offset(m * 128 + 2 * k) // 2] = a[m, k]
    for k in range(16):
        for n in range(64):
            sB[ptx_hopper.swizzled_offset(k * 128 + 2 * n) // 2] = b[k, n]
    return sA, sB


@cuda.jit
def _one_wgmma(SA, SB, D):
    sA = cuda.shared.array(64 * 64, nt.float16)
    sB = cuda.shared.array(16 * 64, nt.float16)
    sD = cuda.shared.array(64 * 64, nt.float32)
    t = cuda.threadIdx.x
    for i in range(t, 64 * 64, 128):
        sA[i] = SA[i]
    for i in range(t, 16 * 64, 128):
        sB[i] = SB[i]
    acc = cuda.local.array(32, nt.float32)
    for i in range(32):
        acc[i] = 1.0                                     # D += A @ B starts from ones
    ptx_hopper.fence_proxy_async()
    cuda.syncthreads()
    ptx_hopper.wgmma_fence()
    ptx_hopper.wgmma_mma(acc, sA, 0, sB, 0, 64, 8192)
    ptx_hopper.wgmma_commit_group()
    ptx_hopper.wgmma_wait_group(0, acc, 32)
    ptx_hopper.wgmma_store_d(sD, 0, 64, acc, 64)
    cuda.syncthreads()
    for i in range(t, 64 * 64, 128):
        D[i] = sD[i]


@pytest.mark.skipif(not SIM, reason="the emulation itself (the GPU runs it through the kernel)")
def test_one_emulated_wgmma_is_the_product_in_fragment_order():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 16)).astype(np.float16)
    b = rng.standard_normal((16, 64)).astype(np.float16)
    sA, sB = _swizzled(a, b)
    d = np.full(64 * 64, np.nan, np.float32)
    _one_wgmma[1, 128](sA, sB, d)
    ref = 1.0 + a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(d.reshape(64, 64), ref, rtol=1e-3, atol=1e-3)
