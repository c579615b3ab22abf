"""Lesson 08: the autotuned kernel is right on every shape; its configs vary what the lesson
says they vary; the autotuner really times configs (with a CPU timer here); the shared
memory model of num_stages matches what Triton allocates; on Hopper tl.dot becomes wgmma;
and a grid that ignores the chosen config fails the check."""
import gemm_lessons as gl  # first: it switches on Triton's interpreter when there is no GPU
import pytest
import torch
import triton

from gemm_lessons import harness, triton_asm
from gemm_lessons.kernels import k07_triton_swizzle as k07
from gemm_lessons.kernels import k08_triton_autotune as k08

FP16 = (torch.float16,)


def test_check_passes_in_every_dtype():
    rep = gl.check("k08_triton_autotune")
    assert rep.ok
    assert str(rep) == "k08_triton_autotune: correct on 9 shapes (bfloat16, float16, float32)"
    assert k08.chosen_config() != "none yet (call the kernel first)"


def test_configs_vary_every_knob_and_the_key_is_m_n_k():
    assert len(k08.CONFIGS) >= 6
    for knob in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
        assert len({c.kwargs[knob] for c in k08.CONFIGS}) >= 2, knob
    assert len({c.num_stages for c in k08.CONFIGS}) >= 2
    assert len({c.num_warps for c in k08.CONFIGS}) >= 2
    assert len({(tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages)
                for c in k08.CONFIGS}) == len(k08.CONFIGS), "a config is listed twice"
    assert k08.matmul_autotuned.keys == ["M", "N", "K"]
    assert "Design note" in k08.__doc__


def test_every_gpu_config_fits_in_shared_memory():
    for c in k08.CONFIGS:
        assert k08.smem_bytes(c, torch.float16) <= k08.SMEM_LIMIT
    assert k08.smem_bytes(k08.CONFIGS[0], torch.float16) == 3 * (128 + 256) * 64 * 2
    too_big = k08.make_config(256, 256, 128, num_warps=8, num_stages=4)
    assert k08.smem_bytes(too_big, torch.float16) > k08.SMEM_LIMIT


def test_pruning_picks_the_dtypes_configs_and_skips_idle_ones():
    every = k08.CONFIGS + k08.FP32_CONFIGS
    assert k08.prune_for_gpu(every, torch.float16, 4096, 4096, sms=132) == k08.CONFIGS
    assert k08.prune_for_gpu(every, torch.float32, 4096, 4096, sms=132) == k08.FP32_CONFIGS
    # 1024: only configs that keep at least 66 of 132 SMs busy
    assert {k08.programs(c, 1024, 1024) for c in
            k08.prune_for_gpu(every, torch.float16, 1024, 1024, sms=132)} == {128}
    # 512 x 512: every config leaves most SMs idle; only the one with the most is timed
    small = k08.prune_for_gpu(every, torch.float16, 512, 512, sms=132)
    assert [k08.programs(c, 512, 512) for c in small] == [32, 32]   # 128 x 64 and 64 x 128
    if gl.engine().kind != "cuda":
        a16 = torch.empty(2, 2, dtype=torch.float16)
        assert k08.prune(every, {"a_ptr": a16, "M": 2, "N": 2}) == [k08.INTERPRETER_CONFIG]


def test_the_autotuner_times_every_config_with_a_cpu_timer():
    small = [k08.make_config(16, 16, 16, 1, 1, group_size_m=1), k08.make_config(32, 16, 16, 1, 1),
             k08.make_config(16, 32, 16, 1, 1, group_size_m=4)]
    tuned = k08.autotune(configs=small, prune_configs=None,
                         do_bench=None if gl.engine().kind == "cuda" else k08.cpu_timer)
    rep = harness.check(lambda a, b, out: k08.matmul(a, b, out, kernel=tuned), "tuned", FP16,
                        harness.shape_suite()[:2])
    assert rep.ok
    assert len(tuned.configs_timings) == 3                # all three were timed ...
    assert tuned.best_config in small                     # ... and one was chosen
    assert all(t[0] > 0 for t in tuned.configs_timings.values())


def test_a_grid_that_ignores_the_chosen_config_fails():
    # the classic autotune slip: a grid computed from fixed tile sizes, not from META
    tuned = k08.autotune(configs=[k08.make_config(16, 16, 16, 1, 1)], prune_configs=None)

    def run(a, b, out):
        M, K = a.shape
        N = b.shape[1]
        a, b, precision = k07.operands(a, b)
        grid = (triton.cdiv(M, 32) * triton.cdiv(N, 32),)   # assumes 32 x 32 tiles
        tuned[grid](a, b, out, M, N, K, *a.stride(), *b.stride(), *out.stride(),
                    INPUT_PRECISION=precision)

    with pytest.raises(gl.CheckError, match="never written"):
        harness.check(run, "fixed grid", FP16, harness.shape_suite()[:1])


def test_hopper_gets_wgmma_and_num_stages_buffers_of_shared_memory():
    cfg = k08.tile_config(k08.CONFIGS[0])                 # 128 x 256 x 64, 3 stages, 8 warps
    asm = k07.asm(torch.float16, config=cfg, cc=(9, 0))
    assert triton_asm.grep(asm["ptx"], r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16")
    assert triton_asm.grep(asm["ptx"], r"cp\.async\.cg\.shared\.global")
    assert "HGMMA" in asm["sass"] or not asm["sass"]
    assert asm["shared"] == k08.smem_bytes(k08.CONFIGS[0], torch.float16)


def test_ieee_fp32_uses_no_tensor_cores():
    asm = k07.asm(torch.float32, config=k07.TileConfig(64, 64, 32, 4, 3), cc=(9, 0))
    assert "wgmma" not in asm["ptx"] and "mma.sync" not in asm["ptx"]
    assert "fma.rn.f32" in asm["ptx"]


def test_stage_buffers_and_limits_follow_the_architecture():
    fp16, fp32 = torch.float16, torch.float32
    # Hopper's wgmma: a buffer per stage; mma.sync (sm_80-89) and fp32's FMA path: one fewer
    assert [k08.stage_buffers(3, fp16, cc) for cc in ((9, 0), (8, 0), (8, 6))] == [3, 2, 2]
    assert k08.stage_buffers(3, fp32, (9, 0)) == 2
    assert k08.stage_buffers(1, fp16, (8, 0)) == 1
    wide = k08.CONFIGS[1]                            # 128 x 256 x 64, 4 stages
    assert k08.smem_bytes(wide, fp16, (9, 0)) == 4 * (128 + 256) * 64 * 2 == 196608
    assert k08.smem_bytes(wide, fp16, (8, 0)) == 3 * (128 + 256) * 64 * 2 == 147456
    if gl.backend() != "cuda":
        assert [k08.smem_limit(cc) // 1024 for cc in ((9, 0), (8, 0), (8, 6))] == [227, 163, 99]
        # fits an A100 (3 buffers, 144 KB of 163 KB) but not an RTX 3090 (99 KB)
        every = k08.CONFIGS
        on_a100 = k08.prune_for_gpu(every, fp16, 8192, 8192, sms=108, cc=(8, 0))
        on_3090 = k08.prune_for_gpu(every, fp16, 8192, 8192, sms=82, cc=(8, 6))
        assert wide in on_a100 and wide not in on_3090
        assert all(k08.smem_bytes(c, fp16, (8, 6)) <= 99 * 1024 for c in on_3090)
