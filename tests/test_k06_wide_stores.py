"""Lesson 06, step 7: the persistent kernel whose epilogue writes 8 outputs per 16-byte store.

The tests prove the step's points: the kernel is right on the shape suite and on ragged
shapes on a grid smaller than the tile count; the 16-byte stores are what runs where the
output allows them (counted on the simulator: every chunk inside the output once, chunks past
N none) and the one-element loop where it does not (an output whose rows or start are not
16-byte aligned, beta != 0), with the same result; alpha/beta follow BLAS; the PTX has one ``st.global.v4.u32`` and no local memory,
and ptxas neither spills nor needs more registers than ``k06_persistent``; the store itself
refuses a misaligned address as the GPU does.
"""
import gemm_lessons as gl  # noqa: I001  (first: it picks the engine)
import re

import pytest
import torch

from gemm_lessons import compiled, engines, harness, ptx_simt
from gemm_lessons.common import cdiv
from gemm_lessons.kernels import k06_persistent as kp
from gemm_lessons.kernels import k06_wide_stores as kw

NAME = "k06_wide_stores"
SIM = not engines.on_gpu()
HOPPER = SIM or engines.engine().capability >= (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="TMA and wgmma need compute capability 9.0")
sim_only = pytest.mark.skipif(not SIM, reason="the stores are counted on the simulator")

# ragged against every tile, N a multiple of 8 (TMA) but not of the tile, on fewer blocks
# than tiles: tiles whose right part lies past N
CASE, BLOCKS = ((harness.Case("6 tiles on 4 blocks", 130, 136, 200), 4) if SIM else
                (harness.Case("12 tiles on 5 blocks", 300, 1000, 392), 5))


@pytest.fixture
def count_wide(monkeypatch):
    """The number of 16-byte stores the kernel makes (simulator: the module's function)."""
    calls = []

    def counted(arr, r, c, v):
        calls.append((r, c))
        ptx_simt.st_global_v8(arr, r, c, v)
    monkeypatch.setattr(kw, "st_global_v8", counted)
    return calls


def _product(M, N, K, out=None, blocks=BLOCKS, c=None, alpha=1.0, beta=0.0, seed=0):
    a, b = harness.make_operands(M, N, K, torch.float16, seed=seed)
    if out is None:
        out = torch.full((M, N), float("nan"), dtype=torch.float16, device=a.device)
    kw.run(a, b, c, out, alpha, beta, blocks=blocks)
    ref = alpha * harness.reference(a, b).double()
    if c is not None and beta != 0:
        ref += beta * c.double()
    return out, ref, a, b


@needs_hopper
def test_correct_on_the_suite_in_fp16_and_bf16():
    report = gl.check(NAME)
    assert report.ok and str(report) == f"{NAME}: correct on 9 shapes (bfloat16, float16)"


@needs_hopper
def test_ragged_on_fewer_blocks_than_tiles_in_fp16_and_bf16():
    cfg = kw.kernel_for().config
    assert kp.grid_size(CASE.M, CASE.N, cfg, BLOCKS) < cdiv(CASE.M, cfg.BM) * cdiv(CASE.N, cfg.BN)
    run = lambda a, b, out: kw.run(a, b, None, out, blocks=BLOCKS)  # noqa: E731
    assert harness.check(run, NAME, (torch.float16, torch.bfloat16), [CASE]).ok


@sim_only
def test_wide_stores_run_where_the_output_allows_and_chunks_past_n_write_nothing(count_wide):
    M, N, K = CASE.M, CASE.N, CASE.K
    out, ref, a, b = _product(M, N, K)
    assert harness.compare(out, ref, a, b, torch.float16)[0]
    # every 8-column chunk inside the output went out in one store, once; none past N
    assert N % 8 == 0 and N % kw.kernel_for().config.BN
    assert sorted(count_wide) == [(r, c) for r in range(M) for c in range(0, N, 8)]


@sim_only
@pytest.mark.parametrize("why", ["rows not 16-byte aligned", "start not 16-byte aligned",
                                 "beta != 0"])
def test_outputs_the_wide_store_cannot_take_are_written_one_element_at_a_time(count_wide, why):
    M, N, K = 70, 72, 64
    if why == "beta != 0":
        c = torch.randn(M, N, dtype=torch.float16)
        out, ref, a, b = _product(M, N, K, c=c, alpha=0.5, beta=2.0, blocks=1)
    elif why == "rows not 16-byte aligned":   # rows 76 elements apart: 152 bytes
        wide_rows = torch.full((M, N + 4), float("nan"), dtype=torch.float16)
        out, ref, a, b = _product(M, N, K, out=wide_rows[:, :N], blocks=1)
        assert torch.isnan(wide_rows[:, N:]).all()          # nothing beyond the view
    else:                                      # contiguous, but starting 2 bytes in
        flat = torch.full((M * N + 1,), float("nan"), dtype=torch.float16)
        out, ref, a, b = _product(M, N, K, out=flat[1:].view(M, N), blocks=1)
        assert out.data_ptr() % 16 and torch.isnan(flat[0])
    assert harness.compare(out, ref, a, b, torch.float16)[0]
    assert count_wide == []


@needs_hopper
def test_gemm_alpha_beta_follow_blas():
    M, N, K = (70, 72, 88) if SIM else (600, 520, 336)
    rel, beta0_ignores_c, alpha0_ignores_a = harness.check_alpha_beta(NAME, torch.float16,
                                                                      M, N, K, seed=6)
    assert rel < 1e-2 and beta0_ignores_c and alpha0_ignores_a


def test_ptx_has_one_16_byte_store_no_local_memory_and_no_more_registers():
    text = compiled.ptx(NAME, (9, 0))
    assert len(re.findall(r"st\.global\.v4\.u32", text)) == 1
    assert "ld.local" not in text and "st.local" not in text
    mine, theirs = (compiled.ptxas_report(t, (9, 0), warnings=True)
                    for t in (text, compiled.ptx("k06_persistent", (9, 0))))
    if mine is None:
        pytest.skip("ptxas is not installed here")
    assert mine["spill_stores"] == 0 and mine["warnings"] == []
    assert mine["registers"] <= theirs["registers"]


@sim_only
def test_the_store_refuses_a_misaligned_address_as_the_gpu_does():
    import numpy as np
    arr = np.zeros((4, 24), np.float16)
    v = tuple(np.arange(8, dtype=np.float16))
    ptx_simt.st_global_v8(arr, 1, 8, v)
    assert arr[1, 8:16].tolist() == list(range(8))
    with pytest.raises(IndexError, match="misaligned address"):
        ptx_simt.st_global_v8(arr, 1, 4, v)                 # column not a multiple of 8
    with pytest.raises(IndexError, match="misaligned address"):
        ptx_simt.st_global_v8(np.zeros((4, 20), np.float16), 1, 0, v)   # 40-byte rows
    with pytest.raises(TypeError, match="2-byte elements"):
        ptx_simt.st_global_v8(np.zeros((4, 24), np.float32), 0, 0, v)


def test_the_lesson_shows_the_lines_this_step_changes(capsys):
    gl.show_diff("k06_persistent", NAME)
    shown = capsys.readouterr().out
    assert "st_global_v8" in shown and "CHUNK_ITERS" in shown
