"""Lesson 08's Hopper fast path: the TMA persistent kernel is right on every shape; the
persistent loop covers every tile whatever the number of programs (and a grid smaller than
the loop's step fails the check); aligned operands are used in place and the others are
copied into 16-byte rows; on sm_90 every operand moves by TMA (no per-thread loads or
stores) into wgmma, and the shared-memory budget is what the docstring says."""
import gemm_lessons as gl  # first: it switches on Triton's interpreter when there is no GPU
import inspect

import pytest
import torch

from gemm_lessons import harness, triton_asm
from gemm_lessons.kernels import k07_triton_swizzle as k07
from gemm_lessons.kernels import k08_triton_tma as k08t

FP16 = (torch.float16,)


def _runs_here():
    eng = gl.engine()
    return eng.kind != "cuda" or eng.capability >= (9, 0)


needs_tma = pytest.mark.skipif(not _runs_here(), reason="TMA needs sm_90 (or the interpreter)")


@needs_tma
def test_check_passes_in_every_dtype():
    rep = gl.check("k08_triton_tma")
    assert rep.ok
    assert str(rep) == "k08_triton_tma: correct on 9 shapes (bfloat16, float16)"


@needs_tma
@pytest.mark.parametrize("sms", [1, 2, 5])
def test_the_persistent_loop_covers_every_tile(sms):
    # one program doing every tile, and grids that leave a ragged last round of tiles
    cases = [c for c in harness.shape_suite() if c.name in ("ragged", "sliced")]
    rep = harness.check(lambda a, b, out: k08t.matmul(a, b, out, sms=sms), f"sms={sms}", FP16,
                        cases)
    assert rep.ok


@needs_tma
def test_a_grid_smaller_than_the_loop_step_fails():
    # the persistence slip: the loop steps by NUM_SMS, but fewer programs were launched
    def run(a, b, out):
        M, K = a.shape
        N = b.shape[1]
        cfg = k08t.GPU_CONFIG if gl.engine().kind == "cuda" else k08t.SIM_CONFIG
        a_, b_, o_ = k08t.tma_view(a), k08t.tma_view(b), k08t.tma_view(out, copy=False)
        k08t.tma_persistent_kernel[(1,)](                   # should be min(2, tiles) programs
            *k08t.descriptors(a_, b_, o_, cfg), M, N, K,
            BLOCK_SIZE_M=cfg.BM, BLOCK_SIZE_N=cfg.BN, BLOCK_SIZE_K=cfg.BK, GROUP_SIZE_M=8,
            NUM_SMS=2, INPUT_PRECISION="tf32", num_warps=cfg.num_warps,
            num_stages=cfg.num_stages)
        if o_ is not out:
            out.copy_(o_)

    cases = [c for c in harness.shape_suite() if c.name == "ragged"]
    with pytest.raises(harness.CheckError, match="never written"):
        harness.check(run, "grid_too_small", FP16, cases)


def test_aligned_operands_are_used_in_place_and_others_copied():
    dev = gl.device()
    a = torch.randn(64, 48, device=dev).half()
    assert k08t.tma_ready(a) and k08t.tma_view(a) is a          # the timed case: no copy
    assert k08t.tma_ready(a[:, :45])      # a slice whose rows stay 96 bytes apart: no copy
    for odd in (a.t(),                    # column-major: the last stride is not 1
                a[1:, 1:],                # sliced: the base is 98 bytes past an aligned one
                torch.randn(64, 45, device=dev).half()):   # rows 90 bytes apart
        assert not k08t.tma_ready(odd)
        v = k08t.tma_view(odd)
        assert v.shape == odd.shape and torch.equal(v, odd)
        assert k08t.tma_ready(v) and (v.stride(0) * 2) % 16 == 0
    out = k08t.tma_view(torch.empty(5, 7, device=dev).half(), copy=False)
    assert out.shape == (5, 7) and k08t.tma_ready(out) and torch.isnan(out).all()


def test_on_hopper_every_operand_moves_by_tma_into_wgmma():
    s3, s4 = triton_asm.compile_kernels([
        k08t.asm_job(torch.float16),
        k08t.asm_job(torch.float16, config=k07.TileConfig(128, 256, 64, 8, 4))])
    ptx = s3["ptx"]
    assert triton_asm.grep(ptx, r"wgmma\.mma_async\.sync\.aligned\.(m64n256k16)") == ["m64n256k16"]
    assert triton_asm.grep(ptx, r"cp\.async\.bulk\.tensor\.2d") == ["cp.async.bulk.tensor.2d"]
    for per_thread in (r"cp\.async\.cg", r"ld\.global", r"st\.global"):
        assert not triton_asm.grep(ptx, per_thread), per_thread
    if s3["sass"]:
        assert triton_asm.grep(s3["sass"], r"UTMA(?:LDG|STG)") == ["UTMALDG", "UTMASTG"]
    # 3 stages of A and B tiles plus the staged C tile fit in 227 KB; a 4th stage does not
    tiles, c_tile = 3 * (128 + 256) * 64 * 2, 128 * 256 * 2
    assert tiles + c_tile <= s3["shared"] <= 227 * 1024
    assert s4["shared"] > 227 * 1024


def test_the_tile_order_is_lesson_07s_and_no_block_pointers():
    src = inspect.getsource(k08t)
    assert "grouped_pid(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)" in src
    assert k08t.GROUP_SIZE_M == k07.GROUP_SIZE_M
    assert "make_block_ptr" not in src and "tl.advance" not in src   # gone in triton 3.9


@pytest.mark.skipif(gl.engine().kind == "cuda",
                    reason="on a GPU this machine's Triton interpreter may differ; Hopper never uses it")
def test_the_checkpoint_runs_in_a_child_interpreter_on_gpus_without_tma(monkeypatch):
    # what an A100 prints for lesson 08's checkpoint: the same check, on the interpreter in
    # a child process (as a GPU process would start it)
    from gemm_lessons import common
    monkeypatch.setattr(common, "simulated", lambda: False)
    monkeypatch.setattr(gl.api, "runs_here", lambda name: False)
    assert gl.check_anywhere("k08_triton_tma") == \
        "k08_triton_tma: correct on 9 shapes (bfloat16, float16)"
