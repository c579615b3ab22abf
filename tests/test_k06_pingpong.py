"""Lesson 06, step 9: two consumer warpgroups on two tiles, taking turns on the tensor cores.

The tests prove the step's points: the kernel is right on the shape suite, and on ragged
shapes where one block walks four tiles, two per consumer, through a ring that wraps; the
turns alternate (the simulator's record of the ``turn`` barriers: consumer 0 hands over to
consumer 1 and back, once per tile); a wrong parity on a turn is a deadlock that names the
barrier, and a dropped store wait is caught, as in ``k06_tma_store``; the PTX has the turn
barriers, no local memory, and ptxas neither spills nor needs more registers than
``k06_tma_store``.
"""
import gemm_lessons as gl  # noqa: I001  (first: it picks the engine)
import re

import pytest
import torch

from gemm_lessons import compiled, engines, harness, ptx_mbarrier
from gemm_lessons.common import cdiv
from gemm_lessons.kernels import k06_persistent as kp
from gemm_lessons.kernels import k06_pingpong as kq
from gemm_lessons.ptx_mbarrier import MbarrierDeadlock
from gemm_lessons.ptx_tma import BulkStoreRace

NAME = "k06_pingpong"
SIM = not engines.on_gpu()
HOPPER = SIM or engines.engine().capability >= (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="TMA and wgmma need compute capability 9.0")
sim_only = pytest.mark.skipif(not SIM, reason="barriers are recorded by the simulator")

# ragged in M and N, on fewer blocks than tiles: on the simulator one block walks 4 tiles of
# 64 x 64, each of 4 k-tiles, through a ring of 4 stages (it wraps 4 times)
CASE, BLOCKS = ((harness.Case("4 tiles on 1 block", 70, 72, 200), 1) if SIM else
                (harness.Case("40 tiles on 7 blocks", 300, 2000, 392), 7))


def _operands(M, N, K, dtype=torch.float16, seed=0):
    a, b = harness.make_operands(M, N, K, dtype, seed=seed)
    return a, b, torch.full((M, N), float("nan"), dtype=dtype, device=a.device)


@needs_hopper
def test_correct_on_the_suite_in_fp16_and_bf16():
    report = gl.check(NAME)
    assert report.ok and str(report) == f"{NAME}: correct on 9 shapes (bfloat16, float16)"


@needs_hopper
def test_ragged_tiles_two_or_more_per_consumer_with_alpha():
    cfg = kq.kernel_for().config
    M, N, K = CASE.M, CASE.N, CASE.K
    assert cdiv(M, cfg.BM) * cdiv(N, cfg.BN) >= 4 * kp.grid_size(M, N, cfg, BLOCKS)
    a, b, out = _operands(M, N, K, seed=3)
    kq.run(a, b, None, out, alpha=0.5, blocks=BLOCKS)
    ok, rel, _ = harness.compare(out, 0.5 * harness.reference(a, b).double(), a, b,
                                 torch.float16)
    assert ok, f"relative error {rel:.1e}"


@sim_only
def test_the_consumers_take_turns_once_per_tile():
    a, b, out = _operands(70, 72, 64)                  # 4 tiles on 1 block
    with ptx_mbarrier.record() as events:
        kq.run(a, b, None, out, blocks=1)
        events = list(events)
    assert harness.compare(out, harness.reference(a, b), a, b, torch.float16)[0]
    arrivals = [(e["barrier"], e["thread"] // 128) for e in events
                if e["op"] == "arrive" and e["barrier"].startswith("turn")]
    # consumer 0 (threads 128-255) hands over on turn[1], consumer 1 on turn[0]: every
    # thread of a consumer, and the runs alternate
    runs = [arrivals[0]] + [x for x, y in zip(arrivals[1:], arrivals) if x != y]
    assert runs == [("turn[1]", 1), ("turn[0]", 2), ("turn[1]", 1), ("turn[0]", 2)]
    assert len(arrivals) == 4 * 128


@sim_only
def test_each_epilogue_lies_under_the_other_consumers_k_loop():
    from gemm_lessons import ring_timeline
    spans = ring_timeline.consumer_spans(ring_timeline.record_pingpong(tiles=4, k_tiles=2))
    loops = sorted((k0, k1, tile) for s in spans.values() for tile, k0, k1, _ in s)
    assert [tile for _, _, tile in loops] == [0, 1, 2, 3]          # the K loops take turns
    assert all(a[1] <= b[0] for a, b in zip(loops, loops[1:]))     # and never overlap
    for c, other in zip(spans, reversed(list(spans))):
        for tile, _, k1, e1 in spans[c]:
            if tile + 1 < 4:                                        # the next tile's K loop
                nxt = next(x for x in spans[other] if x[0] == tile + 1)
                assert nxt[1] <= k1 + 1 and e1 <= nxt[2]


@sim_only
def test_a_wrong_turn_parity_is_a_deadlock_naming_the_turns():
    a, b, out = _operands(70, 72, 64)
    with pytest.raises(MbarrierDeadlock) as info:
        kq.run(a, b, None, out, bug="turn_parity", blocks=1)
    msg = str(info.value)
    assert "128 thread(s) wait with parity 0 on mbarrier turn[0]" in msg
    assert "128 thread(s) wait with parity 0 on mbarrier turn[1]" in msg


@sim_only
def test_a_dropped_store_wait_is_caught():
    a, b, out = _operands(70, 72, 64)
    with pytest.raises(BulkStoreRace, match="written after the store was issued"):
        kq.run(a, b, None, out, bug="no_store_wait", blocks=1)


def test_ptx_has_the_turns_no_local_memory_and_needs_no_more_registers():
    texts = compiled.ptx_many([NAME, "k06_tma_store"], (9, 0))       # one compiler start
    text = texts[NAME]
    assert len(re.findall(r"mbarrier\.init\.shared::cta\.b64", text)) >= 3
    assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in text
    assert "st.global" not in text
    assert "ld.local" not in text and "st.local" not in text
    mine, theirs = (compiled.ptxas_report(t, (9, 0), warnings=True)
                    for t in (text, texts["k06_tma_store"]))
    if mine is None:
        pytest.skip("ptxas is not installed here")
    assert mine["spill_stores"] == 0 and mine["warnings"] == []
    assert mine["registers"] <= theirs["registers"]


def test_the_step_after_the_tma_store():
    from gemm_lessons import registry
    lesson6 = [e.name for e in registry.entries() if e.lesson == 6]
    assert lesson6.index(NAME) == lesson6.index("k06_tma_store") + 1
    assert registry.get(NAME).runs_on((9, 0)) and not registry.get(NAME).runs_on((10, 0))
