"""Lesson 06, a persistent grid: one block per SM walks many tiles through one ring of stages,
its producer loading the next tile while the consumers take turns storing the last one.

The tests prove the lesson's points: the kernel is right on the shape suite and on ragged
shapes where each block walks several tiles (a grid smaller than the tile count), with a
K-tile count that is not a multiple of STAGES, so that a tile's first K-tile lands in the
middle of the ring and the ring wraps several times across tiles; the stage and the phase
come from one running count (recorded from the simulator's barriers); copies landing at
random moments change nothing; alpha/beta follow BLAS; what TMA cannot address runs
k06_wgmma; a broken ring is still reported as a deadlock; the PTX holds TMA copies, mbarrier
waits and wgmma for sm_90a, with no local memory, no spills and no serialized wgmma (ptxas).
"""
import gemm_lessons as gl  # noqa: I001  (first: it picks the engine)
import time

import pytest
import torch

from gemm_lessons import compiled, engines, harness, ptx
from gemm_lessons.common import cdiv, sm_count
from gemm_lessons.kernels import k06_persistent as kp
from gemm_lessons.kernels import k06_producer_consumer as k06pc
from gemm_lessons.ptx_mbarrier import MbarrierDeadlock

NAME = "k06_persistent"
SIM = not engines.on_gpu()
HOPPER = SIM or engines.engine().capability >= (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="TMA and wgmma need compute capability 9.0")
sim_only = pytest.mark.skipif(not SIM, reason="the simulator's barriers are recorded; a broken "
                                              "ring hangs a GPU")

# (case, blocks): shapes whose rows TMA can address (K and N multiples of 8), ragged against
# every tile, on grids smaller than their tile count; K-tiles per tile not a multiple of the
# simulator's 3 stages (nor of the GPU's)
# (one block walking every tile: test_the_ring_is_one_ring_across_tiles)
WALKS = ([(harness.Case("8 tiles on 3 blocks", 130, 200, 264), 3),
          (harness.Case("M=1, 3 tiles on 2 blocks", 1, 136, 72), 2)] if SIM else
         [(harness.Case("12 tiles on 3 blocks", 300, 1000, 1000), 3),
          (harness.Case("9 tiles on 1 block", 300, 600, 392), 1),
          (harness.Case("M=1, 3 tiles on 2 blocks", 1, 520, 72), 2),
          (harness.Case("256 tiles on one block per SM", 2000, 4000, 264), None)])


def _walk(blocks, **kw):
    return lambda a, b, out: kp.run(a, b, None, out, blocks=blocks, **kw)


@needs_hopper
def test_correct_on_the_suite_in_fp16_and_bf16():
    report = gl.check(NAME)
    assert report.ok and str(report) == f"{NAME}: correct on 9 shapes (bfloat16, float16)"


@needs_hopper
@pytest.mark.parametrize("case, blocks", WALKS, ids=[c.name for c, _ in WALKS])
def test_blocks_that_walk_several_tiles_are_correct(case, blocks):
    a, b = harness.make_operands(case.M, case.N, case.K, torch.float16)
    assert k06pc.will_use_tma(a, b) == (True, "")
    cfg = kp.kernel_for().config
    tiles = cdiv(case.M, cfg.BM) * cdiv(case.N, cfg.BN)
    grid = kp.grid_size(case.M, case.N, cfg, blocks)
    assert grid < tiles                       # some block walks more than one tile
    assert f"{tiles} tiles on " in case.name
    assert cdiv(case.K, 64) % cfg.STAGES      # a tile's first K-tile: mid-ring
    assert harness.check(_walk(blocks), NAME, (torch.float16, torch.bfloat16), [case]).ok


def test_the_grid_is_one_block_per_sm_and_never_more_than_the_tiles():
    cfg = kp.GPU_CONFIG
    sms = sm_count()
    assert kp.grid_size(4096, 4096, cfg) == min(sms, 32 * 16)
    assert kp.grid_size(8192, 8192, cfg) == sms
    assert kp.grid_size(128, 256, cfg) == 1 and kp.grid_size(129, 257, cfg) == 4
    assert kp.grid_size(4096, 4096, cfg, blocks=7) == 7
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="blocks must be a positive integer"):
            kp.grid_size(128, 128, cfg, blocks=bad)


@sim_only
def test_the_ring_is_one_ring_across_tiles():
    # one block walks 3 tiles of 5 K-tiles through 3 stages: its k-tile `it` (0..14, over
    # all tiles) waits on full[it % 3] for phase it // 3, and the producer on
    # empty[it % 3] for phase it // 3 - 1 (-1: the one before the first). Reset per tile,
    # the second tile would start again at full[0], phase 0.
    from gemm_lessons import ptx_mbarrier
    a, b = harness.make_operands(128, 192, 320, torch.float16, seed=2)
    out = torch.full((128, 192), float("nan"), dtype=torch.float16)
    with ptx_mbarrier.record() as events:
        kp.run(a, b, None, out, blocks=1)
    events = list(events)
    assert harness.compare(out, harness.reference(a, b), a, b, torch.float16)[0]
    stages = kp.SIM_CONFIG.STAGES
    waits = lambda th, bar: [(e["barrier"], e["phase"], e["parity"]) for e in events  # noqa
                             if e["thread"] == th and e["op"] == "wait"
                             and e["barrier"].startswith(bar)]
    n = 3 * cdiv(320, 64)
    assert waits(128, "full") == [(f"full[{i % stages}]", i // stages, (i // stages) & 1)
                                  for i in range(n)]
    assert waits(0, "empty") == [(f"empty[{i % stages}]", i // stages - 1,
                                  ((i // stages) & 1) ^ 1) for i in range(n)]
    # every stage a consumer thread read was released: 15 arrivals of thread 128 on empty
    assert sum(e["thread"] == 128 and e["op"] == "arrive" and e["barrier"].startswith("empty")
               for e in events) == n


@sim_only
@pytest.mark.parametrize("seed", [0])
def test_correct_when_copies_land_at_random_moments(seed):
    # every TMA copy lands at a random mbarrier operation after its issue: a consumer that
    # read a stage before its full phase, or a producer that refilled a stage (for the next
    # tile) that some consumer thread still had to read, gives a wrong product
    case, blocks = WALKS[0]
    with ptx.cp_async_landing("random", seed=seed):
        assert harness.check(_walk(blocks), NAME, (torch.float16,), [case], seed=seed).ok


@pytest.mark.skipif(not SIM, reason="the GPU runs its own configuration in every test")
def test_the_gpu_configuration_itself_is_correct_on_the_simulator():
    # two consumers of m64n256k16 and three stages, 4 tiles on 3 blocks: the GPU's ring
    case = harness.Case("ragged, 4 tiles on 3 blocks", 130, 264, 200)
    run = _walk(3, config=kp.GPU_CONFIG)
    assert harness.check(run, NAME, (torch.float16,), [case]).ok


@needs_hopper
def test_other_configurations_are_correct_too():
    case, blocks = WALKS[0]
    # (BN 192: a half of 96 columns per epilogue pass, the other layout that fits 4 stages)
    cfgs = [dict(BM=128, BN=128, STAGES=2), dict(BM=192, BN=64, STAGES=4),
            dict(BM=128, BN=192, STAGES=4)]
    for cfg in cfgs[2:] if SIM else cfgs:     # the simulator: the layout unlike the others
        run = _walk(blocks, config=cfg)
        assert harness.check(run, f"{NAME} {cfg}", (torch.float16,), [case]).ok


@needs_hopper
def test_gemm_alpha_beta_follow_blas():
    M, N, K = (130, 136, 88) if SIM else (600, 520, 336)
    rel, beta0_ignores_c, alpha0_ignores_a = harness.check_alpha_beta(NAME, torch.bfloat16,
                                                                      M, N, K, seed=6)
    assert rel < 1e-2 and beta0_ignores_c and alpha0_ignores_a


@needs_hopper
def test_what_tma_cannot_address_runs_k06_wgmma_with_the_same_result():
    a, b = harness.make_operands(37, 45, 29, torch.float16)         # K, N odd: 58, 90 bytes
    assert not k06pc.will_use_tma(a, b)[0]
    at, bt = harness.make_operands(40, 48, 32, torch.float16, a="transposed")
    assert not k06pc.will_use_tma(at, bt)[0]
    for x, y in ((a, b), (at, bt)):
        out = torch.full((x.shape[0], y.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
        kp.run(x, y, None, out)
        ok, rel, _ = harness.compare(out, harness.reference(x, y), x, y, torch.float16)
        assert ok, rel


def test_the_checkpoint_prints_the_same_line_on_any_machine():
    want = f"{NAME}: correct on 9 shapes (bfloat16, float16)"
    if HOPPER:
        assert gl.check_anywhere(NAME) == want
    else:
        from gemm_lessons import api
        assert api._check_in_child(NAME) == want


def test_runs_on_hopper_only_as_the_step_after_warp_specialization():
    from gemm_lessons import registry
    entry = registry.get(NAME)
    assert entry.runs_on((9, 0)) and not entry.runs_on((8, 9)) and not entry.runs_on((10, 0))
    assert gl.runs_here(NAME) == HOPPER
    lesson6 = [e.name for e in registry.entries() if e.lesson == 6]
    assert lesson6.index(NAME) == lesson6.index("k06_producer_consumer") + 1


# ----------------------------------------------------------- a broken ring: said, not hung
def _deadlock(bug):
    a, b = harness.make_operands(130, 72, 520, torch.float16, seed=1)   # 9 k-tiles, 3 stages
    out = torch.full((130, 72), float("nan"), dtype=torch.float16)
    t0 = time.monotonic()
    with pytest.raises(MbarrierDeadlock) as info:
        kp.run(a, b, None, out, bug=bug, blocks=1)
    assert time.monotonic() - t0 < 30
    return str(info.value)


@sim_only
def test_a_wrong_parity_on_empty_is_a_deadlock_naming_the_barrier():
    msg = _deadlock("parity")
    assert "1 thread(s) wait with parity 0 on mbarrier empty[0] (stage 0): its phase 0 " \
           "(parity 0) never completes, 256 of 256 arrivals pending" in msg
    assert "256 thread(s) wait with parity 0 on mbarrier full[0] (stage 0)" in msg


@sim_only
def test_a_missing_release_is_a_deadlock_naming_the_barrier():
    msg = _deadlock("no_release")
    # three stages filled and consumed, then the producer waits for stage 0 to be released
    assert "1 thread(s) wait with parity 0 on mbarrier empty[0] (stage 0): its phase 0 " \
           "(parity 0) never completes, 256 of 256 arrivals pending" in msg
    assert "256 thread(s) wait with parity 1 on mbarrier full[0] (stage 0): its phase 1" in msg


# ------------------------------------------------------------------------- the PTX, ptxas
def test_ptx_is_tma_mbarriers_and_wgmma_with_no_local_memory():
    text = compiled.ptx(NAME, (9, 0))
    assert ".target sm_90a" in text
    n = kp.GPU_CONFIG.BN
    assert text.count(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16") == 4
    assert text.count("cp.async.bulk.tensor.2d.shared::cluster.global.tile"
                      ".mbarrier::complete_tx::bytes") == 1 + n // 64
    for op in ("mbarrier.init.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
               "mbarrier.arrive.shared::cta.b64", "mbarrier.try_wait.parity.shared::cta.b64",
               "fence.mbarrier_init.release.cluster", "wgmma.wait_group.sync.aligned 1",
               "wgmma.wait_group.sync.aligned 0", "bar.sync", "%nctaid.x"):
        assert op in text, op
    start, producer, consumer = k06pc.registers(kp.GPU_CONFIG)
    assert f"setmaxnreg.dec.sync.aligned.u32 {producer};" in text
    assert f"setmaxnreg.inc.sync.aligned.u32 {consumer};" in text
    assert "ld.local" not in text and "st.local" not in text   # accumulators in registers
    rep = compiled.ptxas_report(text, (9, 0), warnings=True)
    if rep is not None:
        assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0
        assert rep["stack_bytes"] == 0 and rep["registers"] == start
        assert rep["warnings"] == []        # no wgmma serialized, no setmaxnreg ignored
        # the barriers (static) and the ring and scratch (dynamic) within Hopper's 227 KiB
        assert rep["smem_bytes"] <= 227 * 1024 - kp.SMEM_LIMIT
        assert rep["smem_bytes"] + kp.smem_bytes(kp.GPU_CONFIG) <= 227 * 1024


def test_the_ring_and_the_scratch_fit_in_shared_memory():
    cfg = kp.GPU_CONFIG
    ring = cfg.STAGES * (cfg.BM + cfg.BN) * 64 * 2
    assert kp.smem_bytes(cfg) == ring + cfg.BM * (cfg.BN // 2 + 4) * 4 <= 227 * 1024
    assert kp.make_kernel(cfg).smem_bytes == kp.smem_bytes(cfg)
    # what PersistentConfig's docstring says: three stages of BN 256, or four of BN 192
    assert (cfg.BM, cfg.BN, cfg.STAGES) == (128, 256, 3)
    assert kp.smem_bytes(kp.PersistentConfig(BM=128, BN=192, STAGES=4)) <= 227 * 1024
    with pytest.raises(ValueError, match="within 231424 bytes of shared memory"):
        kp.PersistentConfig(BM=128, BN=256, STAGES=4)
    # the whole tile's accumulators beside the ring would not fit
    assert ring + cfg.BM * (cfg.BN + 4) * 4 > 227 * 1024
    with pytest.raises(ValueError, match="bug must be one of"):
        kp.make_kernel(kp.SIM_CONFIG, bug="late")


def test_the_lesson_shows_the_lines_this_step_adds(capsys):
    gl.show_diff("k06_producer_consumer", NAME)
    diff = capsys.readouterr().out
    added = [ln[1:].strip() for ln in diff.splitlines()
             if ln.startswith("+") and not ln.startswith("+++")]
    removed = [ln[1:].strip() for ln in diff.splitlines()
               if ln.startswith("-") and not ln.startswith("---")]
    for line in ("for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):", "it += 1",
                 "mbarrier_arrive(empty, (it - 1) % STAGES)   # the tile's last stage too",
                 "for half in range(2):"):
        assert line in added, line
    assert "named_barrier_sync(1, 128 * CONSUMERS)" in removed
    # the step is the loop over tiles, the running count and the epilogue in halves; every
    # other added line is one of k06_producer_consumer's, indented into the loop over tiles
    new = [ln for ln in added if ln and ln not in removed]
    assert len(new) < 50, new
