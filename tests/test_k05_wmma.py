"""Lesson 05: tensor cores through WMMA, from numba, on every engine.

The tests prove the lesson's points, not only the answers: the PTX holds wmma.load/mma and
the fragments stay in registers (no .local), the intrinsics refuse what their PTX
instruction cannot take (wrong dtype, a layout that is not a constant), the simulated
fragments obey the layout they are loaded with, and a kernel that tells the tensor core the
wrong layout for B fails the check.
"""
import gemm_lessons as gl  # first: it picks the engine
import numpy as np
import numba.types as nt
import pytest
import torch
from numba import cuda, float32

from gemm_lessons import compiled, engines, harness, ptx
from gemm_lessons.kernels import k05_wmma as k05

SIM = not engines.on_gpu()
NAME = "k05_wmma"


def test_correct_on_the_suite_in_fp16_and_bf16():
    report = gl.check(NAME)
    assert report.ok and str(report) == "k05_wmma: correct on 9 shapes (bfloat16, float16)"


def test_telling_the_tensor_core_the_wrong_layout_fails_the_check():
    # sB is stored row-major; declaring it "col" hands the tensor core B transposed
    run = lambda a, b, out: k05.wmma(a, b, out, b_layout="col")  # noqa: E731
    cases = [c for c in harness.shape_suite() if c.name in ("square", "ragged")]
    report = harness.check(run, "k05 with the wrong layout", (torch.float16,), cases,
                           raise_on_fail=False)
    assert not report.ok


def test_ptx_is_wmma_from_shared_memory_with_fragments_in_registers():
    text = compiled.ptx(NAME, (9, 0))
    assert "wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32" in text
    assert "wmma.load.a.sync.aligned.row.m16n16k16.shared.f16" in text
    assert "wmma.load.b.sync.aligned.row.m16n16k16.shared.f16" in text
    assert "wmma.store.d.sync.aligned.row.m16n16k16.f32" in text
    # every loop over fragments has a constant trip count, so they are unrolled into
    # registers: no local memory at all
    assert ".local" not in text and "ld.local" not in text
    rep = compiled.ptxas_report(text, (9, 0))
    if rep is not None:
        assert rep["spill_stores"] == 0 and rep["stack_bytes"] == 0
        assert rep["smem_bytes"] <= 48 * 1024
        # the launch bounds ask for two blocks of 256 threads per SM: <= 128 registers
        assert rep["registers"] <= 128


def test_ptx_stages_tiles_in_16_byte_copies_and_waits_for_them():
    import re
    text = compiled.ptx(NAME, (9, 0))
    copies = re.findall(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16, %r\d+;", text)
    assert len(copies) >= 2                          # the A chunks and the B chunks
    assert "cp.async.wait_group 0;" in text          # no copy left in flight: no pipeline
    # no element-wise staging: no 2-byte global loads, no 2-byte shared stores
    assert not re.search(r"ld\.global(\.nc)?\.[us]16", text)
    assert not re.search(r"st\.shared\.[ub]16", text)


def test_aligned_rows_passes_aligned_operands_through_and_pads_the_rest():
    wide = torch.randn(5, 24).half()
    ok = wide[:, :16]                                # row stride 24, width 16, aligned
    assert k05.aligned_rows(ok) is ok
    for bad in (wide[:, :13], wide[:, 1:17], torch.randn(16, 8).half().T):
        out = k05.aligned_rows(bad)
        assert out.shape[1] % 8 == 0 and out.stride(1) == 1 and out.data_ptr() % 16 == 0
        assert torch.equal(out[:, :bad.shape[1]], bad)
        assert not out[:, bad.shape[1]:].any()       # the padding is zeros


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_chunk_masks_on_operands_passed_as_they_are(dtype):
    # A and B rows are whole 16-byte chunks (no copy by the launcher), but M, N and K are
    # multiples of no tile: the kernel's per-chunk tests alone keep the edges right
    gen = torch.Generator().manual_seed(5)
    M, N, K = 40, 24, 40
    wa = torch.randn(M, 48, generator=gen).to(dtype)
    wb = torch.randn(K, 32, generator=gen).to(dtype)
    a, b = wa[:, :K].to(gl.device()), wb[:, :N].to(gl.device())
    assert k05.aligned_rows(a) is a and k05.aligned_rows(b) is b
    out = torch.full((M, N), float("nan"), dtype=dtype, device=gl.device())
    k05.wmma(a, b, out)
    ref = a.double().cpu() @ b.double().cpu()
    err = ((out.double().cpu() - ref).norm() / ref.norm()).item()
    assert err < 1e-2 and not out.isnan().any()


# ----------------------------------------------------------------- the intrinsics, compiled
COMPILE_BF16 = r"""
import gemm_lessons
from gemm_lessons import ptx
from numba import cuda, float32, int16
FA, FC, AL = ptx.FRAG_AB, ptx.FRAG_C, ptx.SMEM_ALIGN
def k(A, B, C):
    sA = cuda.shared.array((16, 24), int16, alignment=AL)
    sB = cuda.shared.array((16, 24), int16, alignment=AL)
    sA[cuda.threadIdx.x % 16, 0] = A[0]
    sB[cuda.threadIdx.x % 16, 0] = B[0]
    cuda.syncthreads()
    ra = cuda.local.array(FA, int16)
    rb = cuda.local.array(FA, int16)
    acc = cuda.local.array(FC, float32)
    for i in range(FC):
        acc[i] = 0.0
    ptx.wmma_load_a(ra, sA, (0, 0), 24, "col")
    ptx.wmma_load_b(rb, sB, (0, 0), 24, "col")
    ptx.wmma_mma(acc, ra, rb, "col", "col")
    ptx.wmma_store_d(C, (0, 0), 16, acc, "col")
text, _ = cuda.compile_ptx(k, "void(int16[::1], int16[::1], float32[:, ::1])", cc=(8, 0))
print(text)
"""


def test_bf16_and_col_layouts_compile_to_their_ptx(py):
    res = py(COMPILE_BF16, env_extra={"GEMM_LESSONS_ENGINE": "compile"})
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    assert "wmma.load.a.sync.aligned.col.m16n16k16.shared.bf16" in out
    assert "wmma.load.b.sync.aligned.col.m16n16k16.shared.bf16" in out
    assert "wmma.mma.sync.aligned.col.col.m16n16k16.f32.bf16.bf16.f32" in out
    assert "wmma.store.d.sync.aligned.col.m16n16k16.f32" in out


MISUSE = r"""
import sys
import gemm_lessons
from gemm_lessons import ptx
from numba import cuda, float32, float64
from numba.types import float16
FA, FC, AL = ptx.FRAG_AB, ptx.FRAG_C, ptx.SMEM_ALIGN
def wrong_dtype(C):
    s = cuda.shared.array((16, 16), float32, alignment=AL)
    f = cuda.local.array(FA, float16)
    ptx.wmma_load_a(f, s, (0, 0), 16, "row")
def layout_not_constant(C, lay):
    s = cuda.shared.array((16, 16), float16, alignment=AL)
    f = cuda.local.array(FA, float16)
    # a layout chosen at run time (numba 0.68.0 typed `"row" if lay else "col"` as the
    # literal "row" and compiled it; indexing a tuple gives a run-time string everywhere)
    ptx.wmma_load_a(f, s, (0, 0), 16, ("row", "col")[lay])
def wait_not_constant(C, n):
    ptx.cp_async_wait_group(n)
for fn, sig in ((wrong_dtype, "void(float32[::1])"),
                (layout_not_constant, "void(float32[::1], int64)"),
                (wait_not_constant, "void(float32[::1], int64)")):
    try:
        cuda.compile_ptx(fn, sig, cc=(8, 0))
        print(fn.__name__, "COMPILED")
    except Exception as exc:
        print(fn.__name__, "|", str(exc).replace("\n", " "))   # whole: the reason may lead
"""


def test_misuse_is_refused_at_compile_time_with_a_clear_message(py):
    res = py(MISUSE, env_extra={"GEMM_LESSONS_ENGINE": "compile"})
    assert res.returncode == 0, res.stderr[-2000:]
    lines = dict(l.split(" | ", 1) if " | " in l else (l, "") for l in res.stdout.splitlines())
    assert {"wrong_dtype", "layout_not_constant", "wait_not_constant"} <= set(lines), res.stdout
    assert "float16 (fp16) or int16" in lines["wrong_dtype"]
    assert "compile-time constant" in lines["layout_not_constant"] or \
        "'row' or 'col'" in lines["layout_not_constant"]
    assert "cp_async_wait_group: N must be a compile-time constant" in \
        lines["wait_not_constant"]


# --------------------------------------------------------- the emulation (simulator only)
def _one_warp_product(a, b, a_layout, b_layout, dtype=np.float16):
    """A (16x16) @ B (16x16) with one warp, the operands stored in shared memory in the
    given layouts (row: as is; col: transposed in memory)."""
    FA, FC = ptx.FRAG_AB, ptx.FRAG_C
    ntype = {np.float16: nt.float16, np.int16: nt.int16}[dtype]

    @cuda.jit
    def k(A, B, C):
        sA = cuda.shared.array((16, 16), ntype)
        sB = cuda.shared.array((16, 16), ntype)
        t = cuda.threadIdx.x
        for e in range(t, 256, 32):
            sA[e // 16, e % 16] = A[e // 16, e % 16]
            sB[e // 16, e % 16] = B[e // 16, e % 16]
        cuda.syncthreads()
        ra = cuda.local.array(FA, ntype)
        rb = cuda.local.array(FA, ntype)
        acc = cuda.local.array(FC, float32)
        for i in range(FC):
            acc[i] = 0.0
        ptx.wmma_load_a(ra, sA, (0, 0), 16, a_layout)
        ptx.wmma_load_b(rb, sB, (0, 0), 16, b_layout)
        ptx.wmma_mma(acc, ra, rb, a_layout, b_layout)
        ptx.wmma_store_d(C, (0, 0), 16, acc, "row")

    memA = a if a_layout == "row" else a.T.copy()
    memB = b if b_layout == "row" else b.T.copy()
    C = np.zeros((16, 16), np.float32)
    k[1, 32](memA, memB, C)
    return C


@pytest.mark.skipif(not SIM, reason="the emulation runs in the simulator")
@pytest.mark.parametrize("a_layout", ["row", "col"])
@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_emulated_fragments_follow_the_layout_they_are_loaded_with(a_layout, b_layout):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 16)).astype(np.float16)
    c = _one_warp_product(a, b, a_layout, b_layout)
    np.testing.assert_allclose(c, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.skipif(not SIM, reason="the emulation runs in the simulator")
def test_emulated_bf16_decodes_the_raw_bits():
    t = torch.randn(16, 16, generator=torch.Generator().manual_seed(1)).bfloat16()
    u = torch.randn(16, 16, generator=torch.Generator().manual_seed(2)).bfloat16()
    c = _one_warp_product(t.view(torch.int16).numpy(), u.view(torch.int16).numpy(),
                          "row", "row", dtype=np.int16)
    np.testing.assert_allclose(c, (t.float() @ u.float()).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not SIM, reason="the emulation runs in the simulator")
def test_emulation_refuses_what_the_gpu_would_not_take():
    f = np.zeros(ptx.FRAG_AB, np.float16)
    s32 = np.zeros((16, 16), np.float32)
    with pytest.raises(ptx.PTXUsageError, match="float16"):
        ptx.wmma_load_a(f, s32, (0, 0), 16, "row")
    s = np.zeros((32, 24), np.float16)
    with pytest.raises(ptx.PTXUsageError, match="'row' or 'col'"):
        ptx.wmma_load_a(f, s, (0, 0), 24, "rows")
    with pytest.raises(ptx.PTXUsageError, match="32-byte aligned"):
        ptx.wmma_load_a(f, s, (0, 8), 24, "row")      # 16 bytes into a row
    with pytest.raises(IndexError, match="past the end"):
        ptx.wmma_load_a(f, s, (24, 0), 24, "row")     # rows 24..39 of a 32-row array


def test_bf16_conversions_round_to_nearest_even():
    # the same function on every engine: f32_to_bf16 is what the epilogue stores
    if not SIM:
        pytest.skip("compared on the simulator (on a GPU it is cvt.rn.bf16.f32)")
    xs = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    want = xs.bfloat16().view(torch.int16).numpy()
    got = np.array([ptx.f32_to_bf16(np.float32(x)) for x in xs.numpy()], dtype=np.int16)
    assert (got == want).all()
    back = np.array([ptx.bf16_to_f32(v) for v in want], dtype=np.float32)
    assert (back == xs.bfloat16().float().numpy()).all()


# ------------------------------------------------ the steps that build k05_wmma, in order
STEPS = ["k05_wmma_warp", "k05_wmma_block", "k05_wmma"]


def test_the_lesson_builds_the_kernel_in_three_steps():
    assert [k.name for k in gl.kernels() if k.lesson == 5] == STEPS


@pytest.mark.parametrize("name", STEPS[:2])
def test_each_step_is_correct_on_small_awkward_shapes(name):
    from gemm_lessons import registry
    cases = [harness.Case("ragged", 37, 21, 45, hint="edges in M, N and K"),
             harness.Case("A transposed", 24, 40, 32, a="transposed", hint="strides")]
    rep = harness.check(registry.get(name).launch, name, (torch.float16, torch.bfloat16),
                        cases, raise_on_fail=False)
    assert rep.ok, str(rep)


def test_steps_before_the_last_copy_through_registers_and_run_unbounded():
    """Steps 1 and 2: tensor cores, fragments in registers, no cp.async. Step 3 adds the
    16-byte copies and the launch bounds that cap a thread at 128 registers."""
    texts = compiled.ptx_many(STEPS, (9, 0))
    for name in STEPS:
        assert "wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32" in texts[name], name
        assert ".local" not in texts[name], name
        assert ("cp.async" in texts[name]) == (name == "k05_wmma"), name
    reports = {n: compiled.ptxas_report(t, (9, 0)) for n, t in texts.items()}
    if reports["k05_wmma"] is not None:
        assert reports["k05_wmma"]["registers"] <= 128 < reports["k05_wmma_block"]["registers"]


# The lesson reads each step's diff a part at a time (labs.k05.show_diff_part): the parts
# together are the whole diff, and none is longer than a screen.
DIFF_PARTS = {("k05_wmma_warp", "k05_wmma_block"): ["for k0 in range", "# -- epilogue"],
              ("k05_wmma_block", "k05_wmma"): ["for k0 in range"]}


@pytest.mark.parametrize("old, new", sorted(DIFF_PARTS))
def test_diff_parts_make_the_whole_diff_a_screen_each(old, new):
    import contextlib
    import io
    from gemm_lessons.labs import k05 as lab

    def printed(fn, *args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            fn(*args)
        return out.getvalue().splitlines()
    changed = lambda lines: [l for l in lines if l[:1] in "+-" and l[:3] not in ("+++", "---")]
    marks = [None] + DIFF_PARTS[old, new] + [None]
    parts = [printed(lab.show_diff_part, old, new, a, b) for a, b in zip(marks, marks[1:])]
    assert sorted(l for p in parts for l in changed(p)) == \
        sorted(changed(printed(gl.show_diff, old, new)))
    assert max(len(p) for p in parts) <= 65, [len(p) for p in parts]
    assert len(printed(gl.show_source, "k05_wmma_warp")) <= 65
