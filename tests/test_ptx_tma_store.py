"""TMA stores (gemm_lessons.ptx_tma.tma_store_2d and the bulk groups): a box of shared memory
in the 128-byte swizzle lands in the operand at its coordinates, the parts outside the
operand left out; the accumulators ``wgmma_store_d_swizzled`` writes are the layout the
store reads; on the simulator, shared memory written before ``bulk_wait_group_read`` lets it
be is caught and named, ``wait_group.read N`` leaves the newest N groups in flight, and a
block that ends with a store never waited for is caught."""
import gemm_lessons as gl  # noqa: F401,I001  (first: it picks the engine)

import numpy as np
import pytest
import torch
from numba import cuda, float32
from numba.types import float16

from gemm_lessons import engines, ptx_hopper, ptx_tma
from gemm_lessons._ptx_plumbing import PTXUsageError
from gemm_lessons.ptx_tma import (BulkStoreRace, bulk_commit_group, bulk_wait_group,
                                  bulk_wait_group_read, fence_proxy_async, tma_store_2d)

SIM = not engines.on_gpu()
HOPPER = SIM or engines.engine().capability >= (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="TMA needs compute capability 9.0")
sim_only = pytest.mark.skipif(not SIM, reason="the simulator's checks (a race, a refused box)")

BOX = 64 * 64                      # one 64 x 64 fp16 box
TWO_BOXES, FOUR_BOXES = 2 * BOX, 4 * BOX    # shared array sizes (numba wants constants)
ALIGN = None if SIM else 1024
swizzle = ptx_hopper.swizzle128


def make_store(boxes=1, wait=0, overwrite=-1, final=True):
    """64 threads put ``boxes`` 64 x 64 boxes of ``src`` (side by side) into shared memory
    in the 128-byte swizzle; thread 0 stores box j at (row, col + 64 j), one bulk group per
    box, then ``bulk_wait_group_read(wait)`` (-1: no wait), then writes the first element of
    box ``overwrite`` (-1: nothing), then, if ``final``, ``bulk_wait_group_read(0)``."""
    first, n = wait >= 0, max(wait, 0)

    @cuda.jit
    def store(tmap, row, col, src):
        tile = cuda.shared.array(TWO_BOXES, float16, alignment=ALIGN)
        t = cuda.threadIdx.x
        for j in range(boxes):
            for c in range(64):
                tile[j * BOX + swizzle(t * 128 + 2 * c) // 2] = src[t, 64 * j + c]
        fence_proxy_async()
        cuda.syncthreads()
        if t == 0:
            for j in range(boxes):
                tma_store_2d(tmap, col + 64 * j, row, tile, j * BOX)
                bulk_commit_group()
            if first:
                bulk_wait_group_read(n)
            if overwrite >= 0:
                tile[overwrite * BOX] = -1.0
            if final:
                bulk_wait_group_read(0)
    return store


def _src(cols=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(64, cols, generator=g).to(torch.float16).to(engines.device())


def _run(kernel, src, row, col, shape=(200, 160)):
    out = torch.full(shape, float("nan"), dtype=torch.float16, device=src.device)
    tmap = ptx_tma.tensor_map_2d(out, 64)
    kernel[1, 64](engines.as_numba(tmap.array), row, col, engines.as_numba(src))
    return out.cpu()


def _expected(src, row, col, shape=(200, 160)):
    want = torch.full(shape, float("nan"), dtype=torch.float16)
    s = src.cpu()
    r0, r1 = max(row, 0), min(row + s.shape[0], shape[0])
    c0, c1 = max(col, 0), min(col + s.shape[1], shape[1])
    want[r0:r1, c0:c1] = s[r0 - row:r1 - row, c0 - col:c1 - col]
    return want


@needs_hopper
@pytest.mark.parametrize("row, col", [(0, 0), (40, 72), (170, 120)])
def test_the_box_lands_at_its_coordinates_and_nothing_outside_the_operand(row, col):
    src = _src()
    out = _run(make_store(), src, row, col)
    torch.testing.assert_close(out, _expected(src, row, col), equal_nan=True, rtol=0, atol=0)


@sim_only
def test_a_store_box_starting_before_the_tensor_is_refused():
    # a load box may start at a negative coordinate (TMA fills zeros); a store box may not:
    # on an H200 this store (row -10, col -32) stops the kernel with an illegal instruction
    with pytest.raises(PTXUsageError, match="must start inside the tensor"):
        _run(make_store(), _src(), -10, -32)


@sim_only
def test_shared_memory_written_before_the_read_wait_is_a_race_named():
    with pytest.raises(BulkStoreRace, match=r"the TMA store of the 64 x 64 box at \(row 8, "
                       r"col 16\) issued by thread 0 from shared byte 0: \d of its 8192 shared "
                       r"bytes were written after the store was issued"):
        _run(make_store(wait=-1, overwrite=0), _src(), 8, 16)      # written, then the wait


@sim_only
def test_wait_read_n_leaves_the_newest_n_groups_in_flight():
    src = _src(128)
    # after wait_group.read 1 the older group has read its box: writing it is fine ...
    out = _run(make_store(boxes=2, wait=1, overwrite=0), src, 0, 0)
    torch.testing.assert_close(out, _expected(src, 0, 0), equal_nan=True, rtol=0, atol=0)
    # ... the newer one may still be reading its box
    with pytest.raises(BulkStoreRace, match="from shared byte 8192"):
        _run(make_store(boxes=2, wait=1, overwrite=1), src, 0, 0)


@sim_only
def test_a_block_that_ends_with_a_store_never_waited_for_is_caught():
    with pytest.raises(BulkStoreRace, match=r"the block ended with 1 TMA store\(s\) never "
                                            r"waited for"):
        _run(make_store(wait=-1, final=False), _src(), 0, 0)


@sim_only
def test_the_store_refuses_what_the_gpu_refuses():
    out = torch.zeros(64, 64, dtype=torch.float16)
    tmap = ptx_tma.tensor_map_2d(out, 64).array.numpy()
    tile = np.zeros(2 * BOX, np.float16)
    with pytest.raises(Exception, match="16-byte boundary"):
        tma_store_2d(tmap, 4, 0, tile, 0)                  # col 4: 8 bytes into a row
    with pytest.raises(Exception, match="128-byte aligned"):
        tma_store_2d(tmap, 0, 0, tile, 8)
    with pytest.raises(IndexError, match="runs past the end"):
        tma_store_2d(tmap, 0, 0, tile, BOX + 128)
    with pytest.raises(Exception, match="from 0 to 63"):
        bulk_wait_group(64)


def make_acc_store(N):
    """A warpgroup's accumulators set to acc[i] = 1000 r + c (their place in the 64 x N
    tile), stored times alpha by wgmma_store_d_swizzled, then by TMA, box by box."""
    NACC, BOXES = N // 2, N // 64

    @cuda.jit
    def acc_store(tmap, alpha):
        tile = cuda.shared.array(FOUR_BOXES, float16, alignment=ALIGN)
        acc = cuda.local.array(NACC, float32)
        t = cuda.threadIdx.x
        for i in range(NACC):
            w, lane = t // 32, t % 32
            j, h, e = i // 4, (i // 2) % 2, i % 2
            acc[i] = 1000.0 * (16 * w + lane // 4 + 8 * h) + 8 * j + 2 * (lane % 4) + e
        ptx_hopper.wgmma_store_d_swizzled(tile, 0, acc, N, alpha)
        fence_proxy_async()
        cuda.syncthreads()
        if t == 0:
            for j in range(BOXES):
                tma_store_2d(tmap, 64 * j, 0, tile, j * BOX)
            bulk_commit_group()
            bulk_wait_group(0)
    return acc_store


@needs_hopper
def test_the_accumulators_stored_swizzled_are_what_the_tma_store_reads():
    N = 128
    out = torch.full((64, N), float("nan"), dtype=torch.float16, device=engines.device())
    tmap = ptx_tma.tensor_map_2d(out, 64)
    make_acc_store(N)[1, 128](engines.as_numba(tmap.array), np.float32(0.5))
    r, c = torch.meshgrid(torch.arange(64), torch.arange(N), indexing="ij")
    want = (0.5 * (1000.0 * r + c)).to(torch.float16)
    torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)
