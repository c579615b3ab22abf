"""Cluster instructions (gemm_lessons.ptx_cluster): on a cluster of one block, the rank is 0,
the cluster barrier is the block's, an arrival on block 0's barrier completes one's own
phase, and a multicast to mask 1 lands the box exactly as ``tma_load_2d`` does; on the
simulator, anything that needs a second block of a cluster is refused with
``ClusterNotSimulated`` (never a silent pass); the simulator's cluster barrier waits for
every thread that has not exited, names a wait without its arrive as a deadlock, and
refuses a second arrive before the wait; the PTX of every instruction compiles for
sm_90a, and ptxas takes it."""
import gemm_lessons as gl  # noqa: F401, I001  (first: it picks the engine)
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from numba import cuda, int32, int64
from numba.types import float16

from gemm_lessons import compiled, engines, ptx_cluster as pc, ptx_hopper, ptx_tma
from gemm_lessons.ptx_mbarrier import (fence_mbarrier_init, mbarrier_arrive_expect_tx,
                                       mbarrier_init, mbarrier_wait)

SIM = not engines.on_gpu()
HOPPER = SIM or engines.engine().capability >= (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="clusters need compute capability 9.0")
sim_only = pytest.mark.skipif(not SIM, reason="what the simulator refuses runs on a GPU")

ROWS = 64
SMEM = ROWS * 64
ALIGN = None if SIM else 1024


def make_kernel(mask=1, cta=0):
    """Thread 0 announces a box's bytes and multicasts it to ``mask``; every thread waits
    for the phase, arrives on block ``cta``'s second barrier, meets at the cluster barrier,
    waits for that barrier's phase, and the tile and the rank go out."""
    @cuda.jit
    def kernel(tmap, row, col, out, rank):
        tile = cuda.shared.array(SMEM, float16, alignment=ALIGN)
        bar = cuda.shared.array(2, int64)
        t = cuda.threadIdx.x
        if t == 0:
            mbarrier_init(bar, 0, 1)
            mbarrier_init(bar, 1, cuda.blockDim.x)
            fence_mbarrier_init()
        pc.barrier_cluster_arrive()         # the barriers are initialized in every block
        pc.barrier_cluster_wait()
        if t == 0:
            mbarrier_arrive_expect_tx(bar, 0, ROWS * 128)
            pc.tma_load_2d_multicast(tile, 0, tmap, col, row, bar, 0, mask)
        mbarrier_wait(bar, 0, 0)
        pc.mbarrier_arrive_cluster(bar, 1, cta)
        mbarrier_wait(bar, 1, 0)
        for i in range(t, SMEM, cuda.blockDim.x):
            out[i] = tile[i]
        if t == 0:
            rank[0] = int32(pc.cluster_ctarank())
        pc.barrier_cluster_arrive()         # no block leaves while another may signal it
        pc.barrier_cluster_wait()
    return kernel


def _run(kernel, a, row, col, cluster=1):
    tmap = ptx_tma.tensor_map_2d(a, ROWS)
    out = torch.full((SMEM,), float("nan"), dtype=a.dtype, device=a.device)
    rank = torch.full((1,), -1, dtype=torch.int32, device=a.device)
    pc.launch_cluster(kernel, cluster, cluster, 64, engines.numba_stream(), 0,
                      engines.as_numba(tmap.array), row, col, engines.as_numba(out),
                      engines.as_numba(rank))
    return out.cpu().numpy(), int(rank[0])


def _operand(rows=200, cols=160, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g).to(torch.float16).to(engines.device())


def _expected(a, row, col):
    a = a.cpu().numpy()
    want = np.zeros(SMEM, np.float16)
    for r in range(ROWS):
        for c in range(64):
            if row + r < a.shape[0] and col + c < a.shape[1]:
                want[ptx_hopper.swizzled_offset(r * 128 + 2 * c) // 2] = a[row + r, col + c]
    return want


@needs_hopper
def test_a_cluster_of_one_loads_signals_and_meets():
    a = _operand()
    out, rank = _run(make_kernel(), a, 40, 64)
    np.testing.assert_array_equal(out, _expected(a, 40, 64))
    assert rank == 0


@sim_only
@pytest.mark.parametrize("mask, cta, cluster, what", [
    (3, 0, 1, "a copy into the blocks of mask 0x3"),
    (1, 1, 1, "an arrival on block 1's barrier"),
    (1, 0, 2, "clusters of (2,) blocks")])
def test_the_simulator_refuses_what_needs_a_second_block(mask, cta, cluster, what):
    with pytest.raises(pc.ClusterNotSimulated, match=what.replace("(", r"\(")
                       .replace(")", r"\)")):
        _run(make_kernel(mask, cta), _operand(), 0, 0, cluster)


def meeting_kernel(arrive=True, exits=0):
    """Threads below ``exits`` return at once; the others arrive (unless ``arrive`` is
    False), wait, and write 1 where they passed the cluster barrier."""
    @cuda.jit
    def kernel(out):
        t = cuda.threadIdx.x
        if t < exits:
            return
        if arrive:
            pc.barrier_cluster_arrive()
        pc.barrier_cluster_wait()
        out[t] = 1
    return kernel


@sim_only
@pytest.mark.parametrize("exits", [0, 40])
def test_the_cluster_barrier_waits_for_the_threads_that_have_not_exited(exits):
    out = np.zeros(64, np.int32)
    meeting_kernel(exits=exits)[1, 64](out)
    assert out.tolist() == [0] * exits + [1] * (64 - exits)


@sim_only
def test_a_wait_without_its_arrive_is_a_deadlock_the_simulator_names():
    from gemm_lessons.ptx_mbarrier import MbarrierDeadlock
    out = np.zeros(64, np.int32)
    with pytest.raises(MbarrierDeadlock, match=r"64 thread\(s\) wait with parity 0 on the "
                       r"cluster barrier \(barrier\.cluster\): its phase 0 \(parity 0\) "
                       r"never completes, 64 of 64 arrivals pending"):
        meeting_kernel(arrive=False)[1, 64](out)
    assert not out.any()


@sim_only
def test_a_second_arrive_before_the_wait_is_refused():
    @cuda.jit
    def kernel(out):
        pc.barrier_cluster_arrive()
        pc.barrier_cluster_arrive()
        pc.barrier_cluster_wait()
        out[cuda.threadIdx.x] = 1
    with pytest.raises(Exception, match="has not waited since"):
        kernel[1, 32](np.zeros(32, np.int32))


_COMPILE = """
import json, sys
import gemm_lessons
from numba import cuda
sys.path.insert(0, {tests!r})
import test_ptx_cluster as t
sig = "void(int64[::1], int64, int64, float16[::1], int32[::1])"
print(json.dumps(cuda.compile_ptx(t.make_kernel(3, 1).py_func, sig, cc=(9, 0, "a"))[0]))
"""


def test_the_ptx_has_each_cluster_instruction_and_ptxas_takes_it():
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "TRITON_INTERPRET")}
    env["GEMM_LESSONS_ENGINE"] = "compile"
    code = _COMPILE.format(tests=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = json.loads(proc.stdout.strip().splitlines()[-1])
    for instr in ("%cluster_ctarank", "barrier.cluster.arrive.release.aligned",
                  "barrier.cluster.wait.acquire.aligned", "mapa.shared::cluster.u32",
                  "mbarrier.arrive.release.cta.shared::cluster.b64",
                  ".mbarrier::complete_tx::bytes.multicast::cluster"):
        assert instr in text, instr
    assert text.count("barrier.cluster.arrive") == 2
    rep = compiled.ptxas_report(text, (9, 0))
    if rep is not None:
        assert rep["spill_stores"] == 0
