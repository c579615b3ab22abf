"""Lesson 06, warp specialization: a TMA producer warpgroup and wgmma consumer warpgroups on
a ring of stages guarded by full/empty mbarriers.

The tests prove the lesson's points: the kernel is right on the shape suite and on ragged
shapes that take the TMA path (zero fill at every edge), under random landing of the
copies, with alpha/beta as BLAS says; what TMA cannot address runs k06_wgmma with the same
result; a ring with a wrong parity or a missing release is reported within seconds as a
deadlock naming the barrier, its stage and its phase; the PTX holds TMA copies, mbarrier
waits and wgmma for sm_90a, with no local memory and no serialized wgmma (ptxas).
"""
import gemm_lessons as gl  # noqa: I001  (first: it picks the engine)
import time

import pytest
import torch

from gemm_lessons import compiled, engines, harness, ptx
from gemm_lessons.kernels import k06_producer_consumer as k06pc
from gemm_lessons.ptx_mbarrier import MbarrierDeadlock

NAME = "k06_producer_consumer"
SIM = not engines.on_gpu()
HOPPER = SIM or engines.engine().capability >= (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="TMA and wgmma need compute capability 9.0")
sim_only = pytest.mark.skipif(not SIM, reason="a broken ring hangs a GPU: simulator only")

# shapes whose rows TMA can address (K and N multiples of 8), ragged against every tile
TMA_CASES = ([harness.Case("ragged, TMA", 70, 72, 136), harness.Case("M=1, TMA", 1, 136, 72),
              harness.Case("one k-tile", 130, 64, 8),
              harness.Case("the ring wraps twice", 130, 72, 600)] if SIM else
             [harness.Case("ragged, TMA", 597, 728, 472), harness.Case("M=1, TMA", 1, 648, 392),
              harness.Case("one k-tile", 300, 264, 8),
              harness.Case("the ring wraps twice", 300, 264, 1000)])


@needs_hopper
def test_correct_on_the_suite_in_fp16_and_bf16():
    report = gl.check(NAME)
    assert report.ok and str(report) == f"{NAME}: correct on 9 shapes (bfloat16, float16)"


@needs_hopper
def test_ragged_shapes_on_the_tma_path_are_correct():
    for case in TMA_CASES:
        a, b = harness.make_operands(case.M, case.N, case.K, torch.float16)
        assert k06pc.will_use_tma(a, b) == (True, "")
    assert harness.check(lambda a, b, out: k06pc.run(a, b, None, out), NAME,
                         (torch.float16, torch.bfloat16), TMA_CASES).ok


@needs_hopper
def test_sliced_operands_with_aligned_rows_take_the_tma_path():
    g = torch.Generator().manual_seed(4)
    dev = engines.device()
    wide_a = torch.randn(70, 200, generator=g).half().to(dev)
    wide_b = torch.randn(140, 96, generator=g).half().to(dev)
    a, b = wide_a[3:, 8:144], wide_b[4:, 16:88]         # offsets and strides: 16-byte multiples
    assert k06pc.will_use_tma(a, b) == (True, "")
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=a.dtype, device=dev)
    k06pc.run(a, b, None, out)
    ok, rel, _ = harness.compare(out, harness.reference(a, b), a, b, torch.float16)
    assert ok, rel


@needs_hopper
def test_what_tma_cannot_address_runs_k06_wgmma_with_the_same_result():
    a, b = harness.make_operands(37, 45, 29, torch.float16)         # K, N odd: 58, 90 bytes
    assert k06pc.will_use_tma(a, b) == (False, "A: its row stride (58 bytes) is not a "
                                               "positive multiple of 16 bytes")
    at, _ = harness.make_operands(40, 48, 32, torch.float16, a="transposed")
    assert not k06pc.will_use_tma(at, b)[0]
    for x, y in ((a, b), (at, harness.make_operands(40, 48, 32, torch.float16)[1])):
        out = torch.full((x.shape[0], y.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
        k06pc.run(x, y, None, out)
        ok, rel, _ = harness.compare(out, harness.reference(x, y), x, y, torch.float16)
        assert ok, rel


@sim_only
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_correct_when_copies_land_at_random_moments(seed):
    # every TMA copy lands at a random mbarrier operation after its issue: a consumer that
    # read a stage before its full phase, or a producer that refilled a stage some consumer
    # thread still had to read, gives a wrong product (the last case reuses every stage)
    with ptx.cp_async_landing("random", seed=seed):
        assert harness.check(lambda a, b, out: k06pc.run(a, b, None, out), NAME,
                             (torch.float16,), [TMA_CASES[0], TMA_CASES[3]], seed=seed).ok


@pytest.mark.skipif(not SIM, reason="the GPU runs its own configuration in every test")
def test_the_gpu_configuration_itself_is_correct_on_the_simulator():
    # two consumers of m64n256k16 and four stages: the very ring the GPU runs
    run = lambda a, b, out: k06pc.run(a, b, None, out, config=k06pc.GPU_CONFIG)  # noqa: E731
    case = harness.Case("ragged, two tiles", 70, 40, 328)
    assert harness.check(run, NAME, (torch.float16,), [case]).ok


@needs_hopper
def test_two_stages_and_one_consumer_are_correct_too():
    for cfg in (dict(BM=128, BN=128, STAGES=2), dict(BM=192, BN=64, STAGES=3)):
        run = lambda a, b, out: k06pc.run(a, b, None, out, config=cfg)  # noqa: E731
        assert harness.check(run, f"{NAME} {cfg}", (torch.float16,), TMA_CASES[:1]).ok


@needs_hopper
def test_gemm_alpha_beta_follow_blas():
    M, N, K = (70, 72, 88) if SIM else (600, 520, 336)
    rel, beta0_ignores_c, alpha0_ignores_a = harness.check_alpha_beta(NAME, torch.bfloat16,
                                                                      M, N, K, seed=6)
    assert rel < 1e-2 and beta0_ignores_c and alpha0_ignores_a


def test_the_checkpoint_prints_the_same_line_on_any_machine():
    want = f"{NAME}: correct on 9 shapes (bfloat16, float16)"
    if HOPPER:
        assert gl.check_anywhere(NAME) == want
    else:
        from gemm_lessons import api
        assert api._check_in_child(NAME) == want


def test_runs_on_hopper_only():
    from gemm_lessons import registry
    entry = registry.get(NAME)
    assert entry.runs_on((9, 0)) and not entry.runs_on((8, 9)) and not entry.runs_on((10, 0))
    assert gl.runs_here(NAME) == HOPPER


# ----------------------------------------------------------- a broken ring: said, not hung
def _deadlock(bug):
    a, b = harness.make_operands(70, 72, 520, torch.float16, seed=1)   # 9 k-tiles, 4 stages
    out = torch.full((70, 72), float("nan"), dtype=torch.float16)
    t0 = time.monotonic()
    with pytest.raises(MbarrierDeadlock) as info:
        k06pc.run(a, b, None, out, bug=bug)
    assert time.monotonic() - t0 < 30
    return str(info.value)


@sim_only
def test_a_wrong_parity_on_empty_is_a_deadlock_naming_the_barrier():
    msg = _deadlock("parity")
    # the producer waits for phase 0 of empty[0], which needs a full stage 0 first
    assert "1 thread(s) wait with parity 0 on mbarrier empty[0] (stage 0): its phase 0 " \
           "(parity 0) never completes, 256 of 256 arrivals pending" in msg
    assert "256 thread(s) wait with parity 0 on mbarrier full[0] (stage 0)" in msg


@sim_only
def test_a_missing_release_is_a_deadlock_naming_the_barrier():
    msg = _deadlock("no_release")
    # four stages filled and consumed, then the producer waits for stage 0 to be released
    assert "1 thread(s) wait with parity 0 on mbarrier empty[0] (stage 0): its phase 0 " \
           "(parity 0) never completes, 256 of 256 arrivals pending" in msg
    assert "256 thread(s) wait with parity 1 on mbarrier full[0] (stage 0): its phase 1" in msg


# ------------------------------------------------------------------------- the PTX, ptxas
def test_ptx_is_tma_mbarriers_and_wgmma_with_no_local_memory():
    text = compiled.ptx(NAME, (9, 0))
    assert ".target sm_90a" in text
    n = k06pc.GPU_CONFIG.BN
    assert text.count(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16") == 4
    # one A box and BN / 64 B boxes per stage; written once each in the loop
    assert text.count("cp.async.bulk.tensor.2d.shared::cluster.global.tile"
                      ".mbarrier::complete_tx::bytes") == 1 + n // 64
    for op in ("mbarrier.init.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
               "mbarrier.arrive.shared::cta.b64", "mbarrier.try_wait.parity.shared::cta.b64",
               "fence.mbarrier_init.release.cluster", "wgmma.wait_group.sync.aligned 1",
               "bar.sync"):
        assert op in text, op
    start, producer, consumer = k06pc.registers(k06pc.GPU_CONFIG)
    assert f"setmaxnreg.dec.sync.aligned.u32 {producer};" in text
    assert f"setmaxnreg.inc.sync.aligned.u32 {consumer};" in text
    assert "cp.async.cg" not in text and "ldmatrix" not in text
    assert "ld.local" not in text and "st.local" not in text   # accumulators in registers
    rep = compiled.ptxas_report(text, (9, 0), warnings=True)
    if rep is not None:
        threads = 128 * (1 + k06pc.GPU_CONFIG.BM // 64)
        assert rep["spill_stores"] == 0 and rep["registers"] * threads <= 65536
        # every thread starts at the count registers() assumes: what the producer gives
        # back is then exactly what the consumers' setmaxnreg.inc waits for
        assert rep["registers"] == start
        assert rep["warnings"] == []        # no wgmma serialized, no setmaxnreg ignored


def test_the_registers_the_producer_gives_back_cover_what_the_consumers_take():
    for bm in (128, 192):
        cfg = k06pc.ProducerConsumerConfig(BM=bm, BN=64)
        start, producer, consumer = k06pc.registers(cfg)
        consumers = bm // 64
        assert start * 128 * (1 + consumers) <= 65536
        assert 24 <= producer <= start <= consumer <= 256 and consumer % 8 == 0
        assert 128 * (start - producer) >= 128 * consumers * (consumer - start)
    assert k06pc.registers(k06pc.GPU_CONFIG) == (168, 40, 232)


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="BM 128 or 192"):
        k06pc.ProducerConsumerConfig(BM=96)
    with pytest.raises(ValueError, match="BN 64, 128, 192 or 256"):
        k06pc.ProducerConsumerConfig(BN=100)
    with pytest.raises(ValueError, match="STAGES >= 2"):
        k06pc.ProducerConsumerConfig(STAGES=1)
    with pytest.raises(ValueError, match="bug must be one of"):
        k06pc.make_kernel(k06pc.SIM_CONFIG, bug="late")
    if SIM:
        from gemm_lessons import ptx_hopper
        from gemm_lessons.ptx import PTXUsageError
        with pytest.raises(PTXUsageError, match="multiple of 8 from 24 to 256"):
            ptx_hopper.setmaxnreg_inc(260)
        with pytest.raises(PTXUsageError, match="multiple of 8 from 24 to 256"):
            ptx_hopper.setmaxnreg_dec(20)


# ------------------------------------------------------------ the lesson's recorded timeline
def test_the_recorded_ring_waits_with_the_parities_the_lesson_states():
    from gemm_lessons import ring_timeline as rt
    events = rt.record_ring(k_tiles=6, stages=4)
    rows = rt.phase_table(events).splitlines()[1:]
    assert len(rows) == 6
    for kt, row in enumerate(rows):
        s, r = kt % 4, kt // 4
        before = "(the phase before the first)" if r == 0 else f"(phase {r - 1})"
        assert f"empty[{s}]  parity {(r & 1) ^ 1} {before}" in row, row
        assert f"full[{s}]   parity {r & 1} (phase {r})" in row, row
    # every wait returns after the arrivals (and copies) that completed its phase
    t = rt.happens_before(events)
    for w in (e for e in events if e["op"] == "wait" and e["phase"] >= 0):
        fills = [e for e in events if e["op"] in ("arrive", "expect_tx", "complete_tx")
                 and (e["barrier"], e["kind"], e["phase"]) == (w["barrier"], w["kind"],
                                                               w["phase"])]
        assert fills and all(t[f["seq"]] < t[w["seq"]] for f in fills)
        assert all(f["seq"] < w["seq"] for f in fills)          # as the simulator ran them


def test_the_lesson_shows_what_a_broken_ring_reports():
    from gemm_lessons import ring_timeline as rt
    msg = rt.broken_ring("no_release")
    assert msg.startswith("MbarrierDeadlock: deadlock in block (0, 0, 0)")
    assert "mbarrier empty[0] (stage 0): its phase 0 (parity 0) never completes" in msg
