"""TMA tile loads (gemm_lessons.ptx_tma): a box lands in shared memory in the 128-byte
swizzle wgmma reads (``ptx_hopper.swizzled_offset``), zero outside the operand, and its
bytes complete the mbarrier's phase; reading before the wait sees poison; a byte count
that the copies do not match fails fast; the PTX compiles for sm_90a with ptxas."""
import gemm_lessons as gl  # noqa: I001  (first: it picks the engine)
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from numba import cuda, float32, int64
from numba.types import float16

from gemm_lessons import compiled, engines, ptx, ptx_hopper, ptx_mbarrier as mb, ptx_tma
from gemm_lessons.ptx_mbarrier import (fence_mbarrier_init, mbarrier_arrive_expect_tx,
                                       mbarrier_init, mbarrier_wait)

SIM = not engines.on_gpu()
HOPPER = SIM or engines.engine().capability >= (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="TMA needs compute capability 9.0")
sim_only = pytest.mark.skipif(not SIM, reason="a wrong byte count hangs a GPU: simulator only")

ROWS = 64                       # box rows; a box is 64 fp16 wide (128 bytes)
SMEM = ROWS * 64
ALIGN = None if SIM else 1024


def make_load(expect_bytes=ROWS * 128, read_early=False):
    """One thread loads the box at (row, col) into a swizzled shared tile and announces
    ``expect_bytes``; every thread waits for the phase, then the tile goes out as it lies.
    ``read_early``: thread 1 reads the tile before waiting (into out[0])."""
    @cuda.jit
    def load(tmap, row, col, out, early):
        tile = cuda.shared.array(SMEM, float16, alignment=ALIGN)
        bar = cuda.shared.array(1, int64)
        t = cuda.threadIdx.x
        if t == 0:
            mbarrier_init(bar, 0, 1)
            fence_mbarrier_init()
        cuda.syncthreads()
        if t == 0:
            mbarrier_arrive_expect_tx(bar, 0, expect_bytes)
            ptx_tma.tma_load_2d(tile, 0, tmap, col, row, bar, 0)
        cuda.syncthreads()                  # the copy is issued (and may still be in flight)
        if read_early and t == 1:
            early[0] = float32(tile[0])
        mbarrier_wait(bar, 0, 0)
        for i in range(t, SMEM, cuda.blockDim.x):
            out[i] = tile[i]
    return load


def _run(kernel, a, row, col):
    tmap = ptx_tma.tensor_map_2d(a, ROWS)
    out = torch.full((SMEM,), float("nan"), dtype=a.dtype, device=a.device)
    early = torch.zeros(1, dtype=torch.float32, device=a.device)
    kernel[1, 64](engines.as_numba(tmap.array), row, col, engines.as_numba(out),
                  engines.as_numba(early))
    return out.cpu().numpy(), float(early[0])


def _expected(a, row, col):
    """The box as the 128-byte swizzle stores it, zeros outside ``a``."""
    a = a.cpu().numpy()
    want = np.zeros(SMEM, np.float16)
    for r in range(ROWS):
        for c in range(64):
            i, j = row + r, col + c
            if 0 <= i < a.shape[0] and 0 <= j < a.shape[1]:
                want[ptx_hopper.swizzled_offset(r * 128 + 2 * c) // 2] = a[i, j]
    return want


def _operand(rows, cols, stride=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, stride or cols, generator=g).to(torch.float16)
    return base[:, :cols].to(engines.device())


@needs_hopper
@pytest.mark.parametrize("row, col", [(0, 0), (64, 64), (40, 72)])
def test_the_box_lands_in_the_swizzled_layout_wgmma_reads(row, col):
    a = _operand(200, 160, stride=168)            # a padded row: 336 bytes, 16-aligned
    out, _ = _run(make_load(), a, row, col)
    np.testing.assert_array_equal(out, _expected(a, row, col))


@needs_hopper
@pytest.mark.parametrize("row, col", [(-10, 0), (170, 120), (-5, -32)])
def test_outside_the_operand_the_box_is_zero_filled(row, col):
    a = _operand(200, 160)
    out, _ = _run(make_load(), a, row, col)
    want = _expected(a, row, col)
    np.testing.assert_array_equal(out, want)
    assert (want == 0).sum() >= 64 * 5              # the test covers zero-filled parts


@sim_only
def test_a_box_column_off_a_16_byte_boundary_is_refused():
    # on an H200, col = -30 (fp16: -60 bytes) stopped the kernel with an illegal instruction
    a = _operand(64, 64)
    with pytest.raises(Exception, match="16-byte"):
        _run(make_load(), a, 0, -30)


@sim_only
def test_a_read_before_the_wait_sees_poison():
    a = _operand(64, 64)
    out, early = _run(make_load(read_early=True), a, 0, 0)
    assert np.isnan(early)                           # the copy had not landed
    np.testing.assert_array_equal(out, _expected(a, 0, 0))


@sim_only
@pytest.mark.parametrize("seed", [0, 1])
def test_random_landing_still_completes_the_phase(seed):
    a = _operand(100, 100, stride=104, seed=seed)
    with ptx.cp_async_landing("random", seed=seed):
        out, _ = _run(make_load(), a, 30, 48)
    np.testing.assert_array_equal(out, _expected(a, 30, 48))


@sim_only
def test_fewer_bytes_announced_than_the_box_delivers_is_a_tx_error():
    a = _operand(64, 64)
    with pytest.raises(mb.MbarrierTxError, match=r"bar\[0\] \(stage 0\), phase 0 .* 4096 "
                                                 r"bytes more than"):
        _run(make_load(expect_bytes=ROWS * 64), a, 0, 0)
    _no_thread_left()


def _no_thread_left():
    # the failed block's threads were stopped, not left waiting
    import threading
    from numba.cuda.simulator.kernel import BlockThread
    assert not [t for t in threading.enumerate() if isinstance(t, BlockThread) and t.is_alive()]


@sim_only
def test_more_bytes_announced_than_the_box_delivers_is_a_deadlock():
    a = _operand(64, 64)
    t0 = time.monotonic()
    with pytest.raises(mb.MbarrierDeadlock, match=r"64 thread\(s\) wait with parity 0 on "
                       r"mbarrier bar\[0\] \(stage 0\): its phase 0 \(parity 0\) never "
                       r"completes, 0 of 1 arrivals pending, 128 transaction bytes"):
        _run(make_load(expect_bytes=ROWS * 128 + 128), a, 0, 0)
    assert time.monotonic() - t0 < 20
    _no_thread_left()


# a device function on the GPU, plain Python on the simulator
_acc_row_col = (ptx_hopper.acc_row_col if ptx_hopper.SIMULATED
                else cuda.jit(device=True, inline="always")(ptx_hopper.acc_row_col))


@cuda.jit
def _tma_wgmma(tA, tB, D):
    # A (64 x 64) and B (64 x 64) by TMA, then D = A @ B by four wgmma k-steps
    smem = cuda.shared.array(2 * 64 * 64, float16, alignment=ALIGN)
    bar = cuda.shared.array(1, int64)
    t = cuda.threadIdx.x
    if t == 0:
        mbarrier_init(bar, 0, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if t == 0:
        mbarrier_arrive_expect_tx(bar, 0, 2 * 64 * 128)
        ptx_tma.tma_load_2d(smem, 0, tA, 0, 0, bar, 0)
        ptx_tma.tma_load_2d(smem, 64 * 64, tB, 0, 0, bar, 0)
    mbarrier_wait(bar, 0, 0)
    acc = cuda.local.array(32, float32)
    for i in range(32):
        acc[i] = 0.0
    ptx_hopper.wgmma_fence()
    for k in range(4):
        ptx_hopper.wgmma_mma(acc, smem, 16 * k, smem, 64 * 64 + 16 * k * 64, 64, 8192)
    ptx_hopper.wgmma_commit_group()
    ptx_hopper.wgmma_wait_group(0, acc, 32)
    for i in range(32):
        r, c = _acc_row_col(t, i)
        D[r, c] = acc[i]


@needs_hopper
def test_wgmma_multiplies_the_tiles_tma_landed():
    a, b = _operand(64, 64, seed=1), _operand(50, 40, seed=2)     # B smaller: zero-filled
    d = torch.full((64, 64), float("nan"), device=a.device)
    tA, tB = ptx_tma.tensor_map_2d(a, 64), ptx_tma.tensor_map_2d(b, 64)
    _tma_wgmma[1, 128](engines.as_numba(tA.array), engines.as_numba(tB.array),
                       engines.as_numba(d))
    want = a[:, :50].double() @ b.double()
    torch.testing.assert_close(d[:, :40].double(), want, rtol=1e-3, atol=1e-3)
    assert (d[:, 40:] == 0).all()


def test_what_tma_cannot_address_is_said_and_refused():
    a = torch.zeros(8, 12, dtype=torch.float16)
    assert ptx_tma.tma_addressable(a) == (False, "its row stride (24 bytes) is not a "
                                                 "positive multiple of 16 bytes")
    assert not ptx_tma.tma_addressable(torch.zeros(16, 16, dtype=torch.float16).t())[0]
    assert not ptx_tma.tma_addressable(torch.zeros(16, 16))[0]
    assert ptx_tma.tma_addressable(torch.zeros(8, 16, dtype=torch.bfloat16)) == (True, "")
    with pytest.raises(ValueError, match="row stride"):
        ptx_tma.tensor_map_2d(a, 8)
    with pytest.raises(ValueError, match="box_cols must span"):
        ptx_tma.tensor_map_2d(torch.zeros(8, 16, dtype=torch.float16), 8, box_cols=32)
    with pytest.raises(ValueError, match="box_rows must be from 1 to 256"):
        ptx_tma.tensor_map_2d(torch.zeros(8, 16, dtype=torch.float16), 300)


_COMPILE = """
import json, sys
import gemm_lessons
from numba import cuda
sys.path.insert(0, {tests!r})
import test_ptx_tma as t
sig = "void(int64[::1], int64, int64, float16[::1], float32[::1])"
print(json.dumps(cuda.compile_ptx(t.make_load().py_func, sig, cc=(9, 0, "a"))[0]))
"""


def test_the_ptx_is_one_bulk_tensor_copy_and_ptxas_takes_it_for_sm_90a():
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "TRITON_INTERPRET")}
    env["GEMM_LESSONS_ENGINE"] = "compile"
    code = _COMPILE.format(tests=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = json.loads(proc.stdout.strip().splitlines()[-1])
    assert text.count("cp.async.bulk.tensor.2d.shared::cluster.global.tile"
                      ".mbarrier::complete_tx::bytes") == 1
    assert "mbarrier.arrive.expect_tx.shared::cta.b64" in text
    rep = compiled.ptxas_report(text, (9, 0))
    if rep is not None:
        assert rep["spill_stores"] == 0
