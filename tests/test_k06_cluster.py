"""Lesson 06, step 10: step 8's kernel in clusters of blocks along N, A's box multicast.

On the simulator the kernel runs in clusters of one block (its blocks run one after another
there): right on the shape suite and on ragged shapes where a block walks several tiles;
a cluster of two is refused there with ``ClusterNotSimulated``, never run wrongly. The PTX
of the GPU configuration (clusters of two) has the multicast load, the cluster barriers at
the start and before the exit, and the releases through ``mapa``; ptxas neither spills nor
needs more registers than step 8. On a Hopper GPU, the clusters of two are checked on a
shape whose second block of a cluster tile lies wholly past N.

The barrier audit on the simulator names each broken variant: a dropped wait for the last
store (a race on the scratch), a wrong parity on the ring (a deadlock on ``empty[0]``) and a
missing arrive at the cluster barrier (a deadlock on the cluster barrier, every thread
waiting, none arrived), while the kernel built without a bug is right on the same product.
"""
import gemm_lessons as gl  # noqa: I001  (first: it picks the engine)
import re

import pytest
import torch

from gemm_lessons import compiled, engines, harness
from gemm_lessons.kernels import k06_cluster as kc
from gemm_lessons.ptx_cluster import ClusterNotSimulated
from gemm_lessons.ptx_mbarrier import MbarrierDeadlock
from gemm_lessons.ptx_tma import BulkStoreRace

NAME = "k06_cluster"
SIM = not engines.on_gpu()
HOPPER = SIM or engines.engine().capability >= (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="clusters need compute capability 9.0")
sim_only = pytest.mark.skipif(not SIM, reason="the simulator's refusal")
gpu_only = pytest.mark.skipif(SIM or not HOPPER, reason="clusters of two run on a GPU")


@needs_hopper
def test_correct_on_the_suite_in_fp16_and_bf16():
    report = gl.check(NAME)
    assert report.ok and str(report) == f"{NAME}: correct on 9 shapes (bfloat16, float16)"


@needs_hopper
def test_ragged_tiles_on_fewer_clusters_with_alpha():
    # simulator: 3 x 3 tiles of 128 x 64 on 2 blocks; GPU: 3 x 4 cluster tiles of
    # 128 x 512 on 2 clusters, the last column's second blocks wholly past N (1624)
    M, N, K, blocks = (300, 136, 200, 2) if SIM else (300, 1624, 392, 4)
    a, b = harness.make_operands(M, N, K, torch.float16, seed=3)
    out = torch.full((M, N), float("nan"), dtype=torch.float16, device=a.device)
    kc.run(a, b, None, out, alpha=0.5, blocks=blocks)
    ok, rel, _ = harness.compare(out, 0.5 * harness.reference(a, b).double(), a, b,
                                 torch.float16)
    assert ok, f"relative error {rel:.1e}"


@gpu_only
def test_clusters_of_two_when_the_second_block_is_past_n():
    M, N, K = 256, 600, 512          # cluster tiles of 512 columns: block 768.. past N
    a, b = harness.make_operands(M, N, K, torch.float16, seed=5)
    out = torch.full((M, N), float("nan"), dtype=torch.float16, device=a.device)
    kc.run(a, b, None, out, blocks=4)
    assert harness.compare(out, harness.reference(a, b).double(), a, b, torch.float16)[0]


@sim_only
def test_a_cluster_of_two_is_refused_on_the_simulator():
    a, b = harness.make_operands(70, 72, 64, torch.float16, seed=1)
    out = torch.full((70, 72), float("nan"), dtype=torch.float16)
    with pytest.raises(ClusterNotSimulated, match="emulates clusters of one block only"):
        kc.run(a, b, None, out, config=dict(CLUSTER=2))
    assert torch.isnan(out).all()                    # nothing ran


@sim_only
@pytest.mark.parametrize("bug, error, says", [
    (None, None, None),
    ("no_store_wait", BulkStoreRace, "written after the store was issued"),
    ("parity", MbarrierDeadlock,
     "1 thread(s) wait with parity 0 on mbarrier empty[0] (stage 0)"),
    ("no_cluster_arrive", MbarrierDeadlock,
     "384 thread(s) wait with parity 0 on the cluster barrier (barrier.cluster): its phase 0 "
     "(parity 0) never completes, 384 of 384 arrivals pending")])
def test_the_barrier_audit_names_each_broken_variant(bug, error, says):
    # one block, two 128 x 64 tiles (the second tile's epilogue rewrites the first's scratch)
    a, b = harness.make_operands(64, 72, 64, torch.float16, seed=2)
    out = torch.full((64, 72), float("nan"), dtype=torch.float16)
    if error is None:
        kc.run(a, b, None, out, blocks=1)
        assert harness.compare(out, harness.reference(a, b).double(), a, b, torch.float16)[0]
        return
    with pytest.raises(error) as caught:
        kc.run(a, b, None, out, bug=bug, blocks=1)
    assert says in str(caught.value)


def test_releases_at_cta_scope_compile_without_a_fence_and_cluster_scope_with_one():
    # step 10 frees a stage in every block of the cluster with mbarrier.arrive.release.cta
    # (no data to publish: the wgmma reads are complete); RELEASE='cluster' builds the same
    # kernel with mbarrier.arrive.release.cluster, which ptxas precedes with MEMBAR.ALL.GPU
    texts = compiled.ptx_many([NAME, f"{NAME}@RELEASE=cluster"], (9, 0))
    cta, fenced = texts[NAME], texts[f"{NAME}@RELEASE=cluster"]
    for text, scope in ((cta, "cta"), (fenced, "cluster")):
        arrives = re.findall(r"mbarrier\.arrive\.release\.(\w+)\.shared::cluster", text)
        assert arrives and set(arrives) == {scope}, (scope, set(arrives))
    sass = [compiled.sass(t, (9, 0)) for t in (cta, fenced)]
    if not all(sass):
        pytest.skip("no SASS disassembler here")
    membars = []
    for code in sass:
        lines = code.splitlines()
        arrive_at = [i for i, ln in enumerate(lines) if "SYNCS.ARRIVE.TRANS64.RED" in ln]
        membars.append(sum("MEMBAR.ALL.GPU" in ln for i in arrive_at
                           for ln in lines[max(0, i - 3):i]))
    assert membars[0] == 0 and membars[1] >= 1, membars


def test_a_release_scope_outside_the_two_is_refused():
    with pytest.raises(ValueError, match="RELEASE 'cta' or 'cluster'"):
        kc.GPU_CONFIG.replace(RELEASE="gpu")
    with pytest.raises(ValueError, match="a variant is NAME@FIELD=VALUE"):
        compiled.ptx(f"{NAME}@RELEASE", (9, 0))
    with pytest.raises(ValueError, match="takes no configuration change"):
        compiled.compile_here("k06_tma_store@STAGES=2", (9, 0))


def test_a_bug_outside_the_list_is_refused():
    with pytest.raises(ValueError, match="bug must be one of"):
        kc.make_kernel(kc.SIM_CONFIG, bug="no_arrive")


def test_a_cluster_larger_than_eight_is_refused():
    with pytest.raises(ValueError, match="CLUSTER from 1 to 8"):
        kc.GPU_CONFIG.replace(CLUSTER=16)


def test_ptx_multicasts_a_meets_the_cluster_and_needs_no_more_registers():
    texts = compiled.ptx_many([NAME, "k06_tma_store"], (9, 0))
    text = texts[NAME]
    assert len(re.findall(r"\.multicast::cluster", text)) == 1      # A's box, rank 0
    boxes = kc.GPU_CONFIG.BN // 64                                   # B's, each block its own
    assert text.count("cp.async.bulk.tensor.2d.shared::cluster.global.tile") == 1 + boxes
    assert text.count("barrier.cluster.arrive.release.aligned") == 2
    assert text.count("barrier.cluster.wait.acquire.aligned") == 2
    assert "mapa.shared::cluster.u32" in text and "%cluster_ctarank" in text
    assert "bar.sync 0" not in text.replace("barrier.sync", "")       # no syncthreads left
    assert "ld.local" not in text and "st.local" not in text
    mine, theirs = (compiled.ptxas_report(t, (9, 0), warnings=True)
                    for t in (text, texts["k06_tma_store"]))
    if mine is None:
        pytest.skip("ptxas is not installed here")
    assert mine["spill_stores"] == 0 and mine["warnings"] == []
    assert mine["registers"] <= theirs["registers"]


def test_the_lesson_shows_the_lines_this_step_changes(capsys):
    gl.show_diff("k06_tma_store", NAME)
    shown = capsys.readouterr().out
    assert "tma_load_2d_multicast" in shown and "mbarrier_arrive_cluster" in shown
    assert "syncthreads" in shown                    # on a line taken out
