"""Lesson 07: the Triton GEMM is right on every shape, its tile order is a bijection, the
grouped order touches fewer strips of A and B per wave, and the checks catch the mistakes
the lesson warns about (a missing K mask, a forgotten ragged last group, TF32 for fp32)."""
import inspect
import itertools

import gemm_lessons as gl  # first: it switches on Triton's interpreter when there is no GPU
import pytest
import torch
import triton
import triton.language as tl

from conftest import load_module
from gemm_lessons import harness
from gemm_lessons.kernels import k07_triton_swizzle as k07

FP16 = (torch.float16,)


@pytest.mark.parametrize("name", ["k07_triton_swizzle", "k07_triton_rowmajor"])
def test_check_passes_in_every_dtype(name):
    rep = gl.check(name)
    assert rep.ok
    assert str(rep) == f"{name}: correct on 9 shapes (bfloat16, float16, float32)"


# ------------------------------------------------------------------ the tile order
GRIDS = [(m, n) for m in range(1, 12) for n in range(1, 10)] + [(64, 32), (33, 17), (1, 100)]
GROUPS = [1, 2, 3, 4, 5, 8, 16]


def _tiles(order_fn, num_pid_m, num_pid_n, group):
    return [order_fn(p, num_pid_m, num_pid_n, group) for p in range(num_pid_m * num_pid_n)]


def test_grouped_order_is_a_bijection_including_the_ragged_last_group():
    ragged = 0
    for (pm, pn), g in itertools.product(GRIDS, GROUPS):
        tiles = _tiles(k07.grouped_order, pm, pn, g)
        assert sorted(tiles) == [(m, n) for m in range(pm) for n in range(pn)], (pm, pn, g)
        ragged += pm % g != 0
    assert ragged > 100   # many of those grids end in a partial group


def test_group_of_one_is_row_major_and_a_tall_group_is_column_major():
    for pm, pn in GRIDS:
        order = k07.program_order(pm, pn, 1)
        assert torch.equal(order, torch.arange(pm * pn).reshape(pm, pn))
        order = k07.program_order(pm, pn, pm)
        assert torch.equal(order, torch.arange(pm * pn).reshape(pn, pm).t())


def test_grouped_order_walks_each_group_column_by_column():
    # 5 x 3 tiles, groups of 2 rows: rows 0-1, then 2-3, then the ragged group of row 4
    assert k07.program_order(5, 3, 2).tolist() == [[0, 2, 4], [1, 3, 5], [6, 8, 10],
                                                   [7, 9, 11], [12, 13, 14]]


def _forgot_ragged_group(pid, num_pid_m, num_pid_n, group_size_m):
    # the classic slip: every group assumed full
    num_pid_in_group = group_size_m * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * group_size_m
    return (first_pid_m + (pid % num_pid_in_group) % group_size_m,
            (pid % num_pid_in_group) // group_size_m)


def test_the_bijection_test_catches_a_forgotten_ragged_group():
    tiles = _tiles(_forgot_ragged_group, 5, 3, 2)
    assert sorted(tiles) != [(m, n) for m in range(5) for n in range(3)]


@triton.jit
def _order_kernel(out_m, out_n, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    pid = tl.program_id(0)
    pid_m, pid_n = k07.grouped_pid(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)
    tl.store(out_m + pid, pid_m)
    tl.store(out_n + pid, pid_n)


@pytest.mark.parametrize("pm,pn", [(1, 1), (5, 3), (7, 4), (3, 9), (9, 2)])
@pytest.mark.parametrize("g", [1, 2, 4, 8])
def test_the_triton_helper_matches_its_python_twin(pm, pn, g):
    n = pm * pn
    out_m = torch.full((n,), -1, dtype=torch.int32, device=gl.device())
    out_n = torch.full((n,), -1, dtype=torch.int32, device=gl.device())
    _order_kernel[(n,)](out_m, out_n, pm, pn, GROUP_SIZE_M=g)
    got = list(zip(out_m.tolist(), out_n.tolist()))
    assert got == _tiles(k07.grouped_order, pm, pn, g)


# ------------------------------------------------------------------ the L2 model
def test_first_wave_by_hand():
    # 8192 x 8192 with 128 x 256 tiles: 64 x 32 tiles. Row-major: 132 programs cover rows
    # 0..4 (4 full rows of 32 and 4 more) and all 32 columns. Groups of 8 rows: pid_m =
    # pid % 8 and pid_n = pid // 8 -> 8 row strips and 17 column strips.
    assert k07.first_wave(8192, 8192, 128, 256, 1) == (5, 32)
    assert k07.first_wave(8192, 8192, 128, 256, 8) == (8, 17)
    # a grid smaller than a wave: everything is touched in either order
    assert k07.first_wave(512, 512, 128, 128, 1) == k07.first_wave(512, 512, 128, 128, 8) == (4, 4)


@pytest.mark.parametrize("size", [8192, 16384])
def test_grouped_wave_reads_less_from_dram_on_wide_grids(size):
    rows = k07.first_wave(size, size, 128, 256, 1)
    grouped = k07.first_wave(size, size, 128, 256, 8)
    assert sum(grouped) < sum(rows)
    assert k07.wave_traffic(size, size, 128, 256, 8) < 0.7 * k07.wave_traffic(size, size, 128, 256, 1)


def test_grouping_is_no_gain_when_a_row_of_tiles_is_short():
    # 4096 with 128 x 256 tiles: 16 tiles a row, so row-major waves are already 8 x 16
    # patches; groups of 8 rows spill into a second group (the lesson's plot shows it)
    assert k07.first_wave(4096, 4096, 128, 256, 1) == (9, 16)
    assert k07.first_wave(4096, 4096, 128, 256, 8) == (12, 16)
    assert k07.wave_traffic(4096, 4096, 128, 256, 8) > k07.wave_traffic(4096, 4096, 128, 256, 1)


# ------------------------------------------------------------------ checks that can fail
def _variant(tmp_path, name, replacements):
    """lesson 07's kernel (and tile-order helper) with some lines changed, as a new module."""
    src = inspect.getsource(k07.grouped_pid.fn) + "\n\n" + inspect.getsource(k07.matmul_kernel.fn)
    for old, new in replacements:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    path = tmp_path / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + src)
    return load_module(name, path).matmul_kernel


def _padded(t, rows, cols):
    # t inside a larger random buffer: reads past its edge stay in memory (and are wrong)
    big = torch.randn(t.shape[0] + rows, t.shape[1] + cols).to(t.dtype).to(t.device)
    big[:t.shape[0], :t.shape[1]] = t
    return big[:t.shape[0], :t.shape[1]]


def test_a_missing_k_mask_fails_the_check(tmp_path):
    kernel = _variant(tmp_path, "k07_no_k_mask", [
        ("mask=offs_k[None, :] < k_left, other=0.0", "mask=offs_k[None, :] < BLOCK_SIZE_K"),
        ("mask=offs_k[:, None] < k_left, other=0.0", "mask=offs_k[:, None] < BLOCK_SIZE_K")])
    bk = k07.config_for(torch.float16).BK

    def run(a, b, out):
        k07.matmul(_padded(a, 0, bk), _padded(b, bk, 0), out, kernel=kernel)

    ragged = [c for c in harness.shape_suite() if c.name == "ragged"]
    with pytest.raises(gl.CheckError, match="ragged"):
        harness.check(run, "no K mask", FP16, ragged)
    # the same kernel is right when K is a multiple of BLOCK_SIZE_K: only the mask mattered
    even = [harness.Case("even K", 20, 24, 2 * bk)]
    assert harness.check(run, "no K mask", FP16, even).ok


def test_a_forgotten_ragged_group_leaves_tiles_unwritten(tmp_path):
    kernel = _variant(tmp_path, "k07_full_groups", [
        ("tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)", "GROUP_SIZE_M")])

    def run(a, b, out):
        k07.matmul(a, b, out, kernel=kernel)

    with pytest.raises(gl.CheckError, match="never written"):
        harness.check(run, "full groups", FP16, harness.shape_suite()[:1])
    # with one group per row (row-major) there is no ragged group: it passes
    assert harness.check(lambda a, b, out: k07.matmul(a, b, out, kernel=kernel, group_size_m=1),
                         "full groups", FP16, harness.shape_suite()[:1]).ok


def test_operands_for_each_engine():
    a, b = harness.make_operands(4, 5, 6, torch.bfloat16)
    a2, b2, precision = k07.operands(a, b)
    if gl.engine().kind == "cuda":
        assert a2 is a and precision == "tf32"
    else:   # the interpreter's bf16 tl.dot is wrong: widened exactly to fp32
        assert a2.dtype == torch.float32 and torch.equal(a2.to(torch.bfloat16), a)
        assert precision == "ieee"
    a, b = harness.make_operands(4, 5, 6, torch.float32)
    assert k07.operands(a, b)[2] == "ieee"


@pytest.mark.skipif(gl.engine().kind != "cuda", reason="the interpreter computes fp32 dots "
                    "in fp32 whatever input_precision says: TF32 exists only on the GPU")
def test_tf32_fails_the_fp32_tolerance():
    def run(a, b, out):
        M, K = a.shape
        N = b.shape[1]
        cfg = k07.config_for(torch.float32)
        k07.matmul_kernel[(triton.cdiv(M, cfg.BM) * triton.cdiv(N, cfg.BN),)](
            a, b, out, M, N, K, *a.stride(), *b.stride(), *out.stride(),
            BLOCK_SIZE_M=cfg.BM, BLOCK_SIZE_N=cfg.BN, BLOCK_SIZE_K=cfg.BK, GROUP_SIZE_M=8,
            INPUT_PRECISION="tf32", num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    with pytest.raises(gl.CheckError):
        harness.check(run, "tf32", (torch.float32,), harness.shape_suite()[:1])


def test_offsets_that_overflow_int32_are_refused():
    a = torch.empty_strided((2, 3), (2 ** 31, 1), device="meta")   # no memory needed
    with pytest.raises(ValueError, match="32-bit"):
        k07.check_offsets(a)
    k07.check_offsets(torch.empty(2, 3))
