"""Lesson 06: the cp.async climb (k06_double_buffer -> k06_multistage -> k06_cp_async).

The tests prove the lesson's points for each rung: correct on the shape suite in fp16 and
bf16 and with K long enough to roll the stages; the simulator runs the loop the GPU runs
(same configuration apart from tile sizes, and the GPU configuration itself is correct on
the simulator); the PTX holds cp.async.cg, commit_group and the wait counts the lesson
names, and no local memory; a bad configuration gets a ValueError naming its rule;
alpha/beta follow BLAS; aligned row-major operands reach the kernel without a copy. On the
simulator every check runs with copies landing at random moments between issue and wait.
"""
import gemm_lessons as gl  # first: it picks the engine
import pytest
import torch

from gemm_lessons import compiled, engines, harness, ptx
from gemm_lessons.kernels import k06_cp_async, k06_double_buffer, k06_multistage
from gemm_lessons.kernels.tc_common import PipelineConfig, rows16

SIM = not engines.on_gpu()


@pytest.fixture(autouse=True, scope="module")
def copies_land_at_random_moments():
    # on the simulator every copy lands at a random moment between its issue and its wait
    # (seeded), so a kernel that overwrote a buffer still in flight or still being read
    # would fail these checks (on a GPU the hardware decides; this changes nothing there)
    with ptx.cp_async_landing("random", seed=6):
        yield
DEV = engines.device()
MODULES = {"k06_double_buffer": k06_double_buffer, "k06_multistage": k06_multistage,
           "k06_cp_async": k06_cp_async}
CASES = [c for c in harness.shape_suite() if c.name in ("ragged", "K=1", "sliced")]
LONG_K = harness.Case("long K", 24, 20, 300 if SIM else 1304, hint="the stages roll")


def _run(module, cfg):
    return lambda a, b, out: module.run(a, b, None, out, config=cfg)  # noqa: E731


@pytest.mark.parametrize("name", list(MODULES))
def test_correct_on_the_suite_in_fp16_and_bf16(name):
    report = gl.check(name)
    assert report.ok and str(report) == f"{name}: correct on 9 shapes (bfloat16, float16)"


@pytest.mark.parametrize("name", list(MODULES))
def test_long_k_rolls_the_stages_correctly(name):
    # K = 300: five 64-deep tiles through 2 or 4 buffers (every stage reused)
    module = MODULES[name]
    assert harness.check(_run(module, None), name, (torch.float16,), [LONG_K] + CASES).ok


@pytest.mark.parametrize("name,change", [("k06_multistage", dict(STAGES=3)),
                                         ("k06_multistage", dict(STAGES=2)),
                                         ("k06_cp_async", dict(STAGES=2)),
                                         ("k06_cp_async", dict(STAGES=3, BK=32)),
                                         ("k06_cp_async", dict(BK=128, STAGES=2))])
def test_other_depths_and_tile_depths_are_correct(name, change):
    module = MODULES[name]
    cfg = module.kernel_for(change).config
    assert harness.check(_run(module, cfg), f"{name} {change}", (torch.float16,),
                         [LONG_K] + CASES[:1]).ok


@pytest.mark.skipif(SIM, reason="the shared-memory limit is the GPU's")
def test_a_pipeline_larger_than_shared_memory_is_refused_with_a_clear_message():
    module = MODULES["k06_cp_async"]
    run = _run(module, module.kernel_for(dict(BK=128)).config)     # 4 x 100 KiB
    a, b = harness.make_operands(256, 256, 256, torch.float16)
    with pytest.raises(ValueError, match="bytes of shared memory"):
        run(a, b, torch.empty(256, 256, dtype=torch.float16, device=a.device))


# ------------------------------------------------ the simulator runs the loop the GPU runs
SIZES = {"BM", "BN", "WM", "WN"}        # what the simulator may shrink


@pytest.mark.parametrize("name", list(MODULES))
def test_the_simulator_configuration_differs_only_in_tile_sizes(name):
    gpu, sim = MODULES[name].GPU_CONFIG, MODULES[name].SIM_CONFIG
    assert type(gpu) is type(sim)
    differ = {f for f in vars(gpu) if getattr(gpu, f) != getattr(sim, f)}
    assert differ <= SIZES, f"{name}: the simulator changes {differ - SIZES}"
    # hence the same k-slices per tile, wait count, copy parts and unrolled slice pairs


@pytest.mark.skipif(not SIM, reason="the GPU runs its own configuration in every test")
@pytest.mark.parametrize("name", list(MODULES))
def test_the_gpu_configuration_itself_is_correct_on_the_simulator(name):
    # 8 warps of 64 x 64, BK = 64: the very loop the GPU runs, on one small ragged shape
    module = MODULES[name]
    case = harness.Case("ragged, two tiles", 70, 40, 100)
    assert harness.check(_run(module, module.GPU_CONFIG), name, (torch.float16,), [case]).ok


# --------------------------------------------------------------------- configurations
def test_configuration_errors_name_the_rule():
    with pytest.raises(ValueError, match="BK a multiple of 16"):
        PipelineConfig(BK=24)
    with pytest.raises(ValueError, match="whole warp tiles"):
        PipelineConfig(BM=96, WM=64)
    with pytest.raises(ValueError, match="STAGES >= 2"):
        PipelineConfig(STAGES=1)
    with pytest.raises(ValueError, match="at most 1024 threads"):
        PipelineConfig(BM=256, BN=256, WM=32, WN=32)
    with pytest.raises(ValueError, match="positive integer"):
        PipelineConfig(BN=0)
    with pytest.raises(ValueError, match="STAGES = 2"):
        k06_double_buffer.make_kernel(PipelineConfig(STAGES=3))
    with pytest.raises(ValueError, match="BK = 32, 64, 96 or 128"):
        k06_cp_async.make_kernel(PipelineConfig(BK=16))


def test_kernel_for_is_the_object_run_launches():
    cfg = dict(STAGES=3)
    kernel = k06_multistage.kernel_for(cfg)
    assert kernel is k06_multistage.make_kernel(kernel.config, False)
    assert k06_multistage.kernel_for(cfg, bf16=True) is not kernel


def test_pipeline_shared_memory_is_stages_times_a_tile():
    for module in MODULES.values():
        c = module.GPU_CONFIG
        kernel = module.make_kernel(c)
        per_stage = (c.BM * (c.BK + module.PAD) + c.BK * (c.BN + module.PAD)) * 2
        assert kernel.smem_bytes == c.STAGES * per_stage
        assert 48 * 1024 < kernel.smem_bytes <= 227 * 1024   # needs the opt-in (allow_smem)


# --------------------------------------------------------------------------------- PTX
@pytest.fixture(scope="module")
def ptx_texts():
    return {name: compiled.ptx(name, (9, 0)) for name in MODULES}


@pytest.mark.parametrize("name", list(MODULES))
def test_ptx_is_cp_async_and_a_wait_for_all_but_stages_minus_two_groups(name, ptx_texts):
    text = ptx_texts[name]
    assert "cp.async.cg.shared.global" in text and "cp.async.commit_group" in text
    waits = {line.strip() for line in text.splitlines() if "cp.async.wait_group" in line}
    assert waits == {f"cp.async.wait_group {MODULES[name].GPU_CONFIG.STAGES - 2};",
                     "cp.async.wait_group 0;"}
    assert "wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32" in text
    assert ".local" not in text                         # fragments and the plan in registers
    rep = compiled.ptxas_report(text, (9, 0))
    if rep is not None:
        assert rep["spill_stores"] == 0 and rep["stack_bytes"] == 0
        assert rep["registers"] <= 255


def test_prefetched_fragments_use_two_slots_the_others_one(ptx_texts):
    # 64 x 64 warp tile: 4 + 4 fragments per k-slice; loads counted in the PTX
    def loads(text):
        return text.count("wmma.load.a.sync") + text.count("wmma.load.b.sync")
    assert loads(ptx_texts["k06_cp_async"]) > loads(ptx_texts["k06_multistage"])


# ------------------------------------------------------------------------------ launcher
def test_gemm_alpha_beta_follow_blas():
    M, N, K = (37, 29, 45) if SIM else (600, 520, 330)
    for name in ("k06_double_buffer", "k06_cp_async"):
        rel, beta0_ignores_c, alpha0_ignores_a = harness.check_alpha_beta(
            name, torch.float16, M, N, K)
        assert rel < 2e-3 and beta0_ignores_c and alpha0_ignores_a, name
    a, b = harness.make_operands(M, N, K, torch.float16)
    with pytest.raises(ValueError, match="does not support"):
        gl.gemm(a, b, bias=torch.zeros(N, dtype=a.dtype, device=DEV), kernel="k06_cp_async")


def test_aligned_operands_are_not_copied_others_are():
    a = torch.randn(24, 40).half().to(DEV)               # rows of 80 bytes: aligned
    flat, ld = rows16(a, 24, 40)
    assert flat.data_ptr() == a.data_ptr() and ld == 40
    t = torch.randn(40, 24).half().to(DEV).t()            # transposed: copied
    flat, ld = rows16(t, 24, 40)
    assert flat.data_ptr() != t.data_ptr() and ld == 40
    odd = torch.randn(24, 37).half().to(DEV)              # K = 37 padded to 40 with zeros
    flat, ld = rows16(odd, 24, 40)
    assert ld == 40 and torch.equal(flat.view(24, 40)[:, 37:].float().cpu(),
                                    torch.zeros(24, 3))
