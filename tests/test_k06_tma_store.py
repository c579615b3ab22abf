"""Lesson 06, step 8: the persistent kernel whose tiles TMA stores from shared memory.

The tests prove the step's points: the kernel is right on the shape suite, and on ragged
shapes where a block walks several tiles whose boxes reach past M and N (TMA leaves those
parts out: no masks), with alpha applied before the rounding; the outputs TMA cannot
address and beta != 0 go to ``k06_wide_stores``, with the same result; a dropped
``bulk_wait_group_read`` before the scratch is written again is caught on the simulator and
named; the PTX stores only through TMA (no ``st.global``, no local memory) and ptxas neither
spills nor needs more registers than ``k06_wide_stores``.
"""
import gemm_lessons as gl  # noqa: I001  (first: it picks the engine)
import re

import pytest
import torch

from gemm_lessons import compiled, engines, harness
from gemm_lessons.common import cdiv
from gemm_lessons.kernels import k06_persistent as kp
from gemm_lessons.kernels import k06_tma_store as kt
from gemm_lessons.kernels import k06_wide_stores as kw
from gemm_lessons.ptx_tma import BulkStoreRace

NAME = "k06_tma_store"
SIM = not engines.on_gpu()
HOPPER = SIM or engines.engine().capability >= (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="TMA and wgmma need compute capability 9.0")
sim_only = pytest.mark.skipif(not SIM, reason="the race is caught by the simulator")

# ragged in M and N (N a multiple of 8, as TMA needs, not of the tile), on fewer blocks than
# tiles: a block stores a tile, then computes and stores the next into the same scratch
CASE, BLOCKS = ((harness.Case("2 tiles on 1 block", 70, 72, 64), 1) if SIM else
                (harness.Case("12 tiles on 5 blocks", 300, 1000, 392), 5))


@pytest.fixture
def to_wide_stores(monkeypatch):
    """The calls ``run`` hands to ``k06_wide_stores`` (which still computes them)."""
    calls = []
    real = kw.run

    def counted(*args, **kwargs):
        calls.append(args)
        real(*args, **kwargs)
    monkeypatch.setattr(kw, "run", counted)
    return calls


@needs_hopper
def test_correct_on_the_suite_in_fp16_and_bf16():
    report = gl.check(NAME)
    assert report.ok and str(report) == f"{NAME}: correct on 9 shapes (bfloat16, float16)"


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ragged_tiles_on_fewer_blocks_with_alpha(dtype, to_wide_stores):
    cfg = kt.kernel_for().config
    M, N, K = CASE.M, CASE.N, CASE.K
    assert kp.grid_size(M, N, cfg, BLOCKS) < cdiv(M, cfg.BM) * cdiv(N, cfg.BN)
    assert M % cfg.BM and N % cfg.BN                   # boxes reach past M and past N
    a, b = harness.make_operands(M, N, K, dtype, seed=3)
    out = torch.full((M, N), float("nan"), dtype=dtype, device=a.device)
    kt.run(a, b, None, out, alpha=0.5, blocks=BLOCKS)
    ok, rel, _ = harness.compare(out, 0.5 * harness.reference(a, b).double(), a, b, dtype)
    assert ok, f"relative error {rel:.1e}"
    assert to_wide_stores == []                        # every tile went out by TMA


@sim_only
def test_alpha_zero_reads_neither_a_nor_b():
    M, N, K = 70, 72, 64
    a = torch.full((M, K), float("nan"), dtype=torch.float16)
    b = torch.full((K, N), float("nan"), dtype=torch.float16)
    out = torch.full((M, N), float("nan"), dtype=torch.float16)
    kt.run(a, b, None, out, alpha=0.0, blocks=1)
    assert (out == 0).all()


@sim_only
@pytest.mark.parametrize("why", ["rows not 16-byte aligned", "start not 16-byte aligned",
                                 "beta != 0"])
def test_what_tma_cannot_store_goes_to_wide_stores(to_wide_stores, why):
    M, N, K = 70, 72, 64
    a, b = harness.make_operands(M, N, K, torch.float16, seed=4)
    c, alpha, beta = None, 1.0, 0.0
    if why == "beta != 0":
        c, alpha, beta = torch.randn(M, N).half(), 0.5, 2.0
        out = torch.full((M, N), float("nan"), dtype=torch.float16)
    elif why == "rows not 16-byte aligned":          # rows 76 elements apart: 152 bytes
        out = torch.full((M, N + 4), float("nan"), dtype=torch.float16)[:, :N]
    else:                                             # contiguous, but starting 2 bytes in
        out = torch.full((M * N + 1,), float("nan"), dtype=torch.float16)[1:].view(M, N)
    assert not kt.will_store_with_tma(out, beta)[0]
    kt.run(a, b, c, out, alpha, beta, blocks=1)
    ref = alpha * harness.reference(a, b).double()
    if c is not None:
        ref += beta * c.double()
    assert harness.compare(out, ref, a, b, torch.float16)[0]
    assert len(to_wide_stores) == 1


@needs_hopper
def test_gemm_alpha_beta_follow_blas():
    M, N, K = (70, 72, 64) if SIM else (600, 520, 336)
    rel, beta0_ignores_c, alpha0_ignores_a = harness.check_alpha_beta(NAME, torch.float16,
                                                                      M, N, K, seed=6)
    assert rel < 1e-2 and beta0_ignores_c and alpha0_ignores_a


@sim_only
def test_a_dropped_store_wait_is_caught_and_named():
    a, b = harness.make_operands(70, 72, 64, torch.float16, seed=1)    # 2 tiles, 1 block
    out = torch.full((70, 72), float("nan"), dtype=torch.float16)
    # the first tile's store (of either consumer: rows 0 or 64) is caught at the last wait
    with pytest.raises(BulkStoreRace, match=r"the TMA store of the 64 x 64 box at \(row "
                       r"(0|64), col 0\) issued by thread (128|256) .* written after the store "
                       r"was issued and before cp\.async\.bulk\.wait_group\.read let them be"):
        kt.run(a, b, None, out, bug="no_store_wait", blocks=1)


def test_ptx_stores_only_through_tma_and_needs_no_more_registers():
    texts = compiled.ptx_many([NAME, "k06_wide_stores"], (9, 0))      # one compiler start
    text = texts[NAME]
    assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in text
    assert "cp.async.bulk.commit_group" in text and "fence.proxy.async.shared::cta" in text
    assert len(re.findall(r"cp\.async\.bulk\.wait_group\.read 0", text)) == 2
    assert len(re.findall(r"cvt\.rn\.f16x2\.f32", text)) == 64      # 256 outputs, 2 a time
    assert "st.global" not in text
    assert "ld.local" not in text and "st.local" not in text
    mine, theirs = (compiled.ptxas_report(t, (9, 0), warnings=True)
                    for t in (text, texts["k06_wide_stores"]))
    if mine is None:
        pytest.skip("ptxas is not installed here")
    assert mine["spill_stores"] == 0 and mine["warnings"] == []
    assert mine["registers"] <= theirs["registers"]


def test_the_lesson_shows_the_lines_this_step_changes(capsys):
    gl.show_diff("k06_wide_stores", NAME)
    shown = capsys.readouterr().out
    assert "tma_store_2d" in shown and "bulk_wait_group_read" in shown
    assert "st_global_v8" in shown                     # on a line taken out
