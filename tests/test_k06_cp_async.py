"""Lesson 06: cp.async pipelines feeding WMMA, and the BLAS epilogue.

The tests prove the lesson's points: the PTX holds cp.async.cg, commit_group and
wait_group STAGES - 2; the simulator emulates cp.async faithfully (a copy is not visible
before the wait that covers it, wait_group(N) lands all but the newest N groups, the
zero-filling form writes zeros), so the kernel that forgets the wait fails the check on a
laptop; every pipeline depth is correct; alpha/beta follow BLAS (beta == 0 never reads C,
alpha == 0 never reads A or B); aligned row-major operands reach the kernel without a copy.
"""
import gemm_lessons as gl  # first: it picks the engine
import numpy as np
import numba.types as nt
import pytest
import torch
from numba import cuda

from gemm_lessons import compiled, engines, harness, ptx
from gemm_lessons.kernels import k06_cp_async as k06

SIM = not engines.on_gpu()
NAME = "k06_cp_async"
DEV = engines.device()
CASES = [c for c in harness.shape_suite() if c.name in ("ragged", "K=1", "sliced")]


def test_correct_on_the_suite_in_fp16_and_bf16():
    report = gl.check(NAME)
    assert report.ok and str(report) == "k06_cp_async: correct on 9 shapes (bfloat16, float16)"


@pytest.mark.parametrize("stages", [2, 4])
def test_every_pipeline_depth_is_correct(stages):
    cfg = dict(k06.SIM_CONFIG if SIM else k06.GPU_CONFIG, STAGES=stages)
    run = lambda a, b, out: k06.run(a, b, None, out, config=cfg)  # noqa: E731
    # K = 80 walks 5 tiles of 16 through 2 or 4 buffers on the simulator
    cases = CASES + [harness.Case("long K", 24, 20, 80 if SIM else 1280)]
    assert harness.check(run, f"k06 STAGES={stages}", (torch.float16,), cases).ok


@pytest.mark.parametrize("stages", [2, 3])
def test_prefetching_fragments_across_the_barrier_is_correct(stages):
    base = dict(BM=32, BN=32, BK=32, WM=16, WN=16) if SIM else k06.GPU_CONFIG
    cfg = dict(base, STAGES=stages, PREFETCH=True)
    run = lambda a, b, out: k06.run(a, b, None, out, config=cfg)  # noqa: E731
    cases = CASES + [harness.Case("long K", 24, 20, 160 if SIM else 1280)]
    assert harness.check(run, f"k06 PREFETCH STAGES={stages}", (torch.float16,), cases).ok


def test_prefetch_with_four_slices_per_tile_is_correct():
    # BK = 64: four k-slices per tile, the copies of a tile issued in three parts
    base = dict(BM=32, BN=32, BK=64, WM=16, WN=16) if SIM else dict(k06.GPU_CONFIG, BK=64)
    cfg = dict(base, STAGES=3, PREFETCH=True)
    run = lambda a, b, out: k06.run(a, b, None, out, config=cfg)  # noqa: E731
    cases = CASES + [harness.Case("long K", 24, 20, 200 if SIM else 1304)]
    assert harness.check(run, "k06 PREFETCH BK=64", (torch.float16,), cases).ok


def test_kernel_for_is_the_object_run_launches():
    cfg = dict(STAGES=2)
    assert k06.kernel_for(cfg) is k06.make_kernel(**dict(k06._config(), **cfg), bf16=False,
                                                  wait=True)
    assert k06.kernel_for(cfg, bf16=True) is not k06.kernel_for(cfg)


@pytest.mark.parametrize("stages", [2, 3])
def test_forgetting_the_wait_fails_the_check(stages):
    cfg = dict(k06.SIM_CONFIG, STAGES=stages)
    run = lambda a, b, out: k06.run(a, b, None, out, config=cfg, wait=False)  # noqa: E731
    if not SIM:
        pytest.skip("on a GPU a missing wait is a race that may or may not show")
    report = harness.check(run, "k06 without cp_async_wait_group", (torch.float16,),
                           CASES[:1], raise_on_fail=False)
    assert not report.ok


def test_ptx_is_cp_async_cg_and_a_wait_for_all_but_stages_minus_two_groups():
    text = compiled.ptx(NAME, (9, 0))
    assert "cp.async.cg.shared.global" in text
    assert "cp.async.commit_group" in text
    waits = {line.strip() for line in text.splitlines() if "cp.async.wait_group" in line}
    assert waits == {f"cp.async.wait_group {k06.GPU_CONFIG['STAGES'] - 2};",
                     "cp.async.wait_group 0;"}
    assert "wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32" in text
    assert ".local" not in text                         # fragments and the plan in registers
    rep = compiled.ptxas_report(text, (9, 0))
    if rep is not None:
        assert rep["spill_stores"] == 0 and rep["registers"] <= 255


def test_pipeline_shared_memory_is_stages_times_a_tile():
    c = k06.GPU_CONFIG
    kernel = k06.make_kernel(**c)
    per_stage = (c["BM"] * (c["BK"] + k06.PAD) + c["BK"] * (c["BN"] + k06.PAD)) * 2
    assert kernel.smem_bytes == c["STAGES"] * per_stage
    assert 48 * 1024 < kernel.smem_bytes <= 227 * 1024   # needs the opt-in (_allow_smem)


def test_gemm_alpha_beta_follow_blas():
    M, N, K = (37, 29, 45) if SIM else (600, 520, 330)
    rel, beta0_ignores_c, alpha0_ignores_a = harness.check_alpha_beta(NAME, torch.float16,
                                                                      M, N, K)
    assert rel < 2e-3 and beta0_ignores_c and alpha0_ignores_a
    a, b = harness.make_operands(M, N, K, torch.float16)
    with pytest.raises(ValueError, match="does not support"):
        gl.gemm(a, b, bias=torch.zeros(N, dtype=a.dtype, device=DEV), kernel=NAME)


def test_aligned_operands_are_not_copied_others_are():
    a = torch.randn(24, 40).half().to(DEV)               # rows of 80 bytes: aligned
    flat, ld = k06._rows16(a, 24, 40)
    assert flat.data_ptr() == a.data_ptr() and ld == 40
    t = torch.randn(40, 24).half().to(DEV).t()            # transposed: copied
    flat, ld = k06._rows16(t, 24, 40)
    assert flat.data_ptr() != t.data_ptr() and ld == 40
    odd = torch.randn(24, 37).half().to(DEV)              # K = 37 padded to 40 with zeros
    flat, ld = k06._rows16(odd, 24, 40)
    assert ld == 40 and torch.equal(flat.view(24, 40)[:, 37:].float().cpu(),
                                    torch.zeros(24, 3))


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
