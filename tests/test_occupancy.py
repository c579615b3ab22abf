"""gemm_lessons.occupancy: blocks per SM from registers, shared memory and threads, by the
rules of the CUDA Occupancy Calculator; and the SASS mix of a compiled kernel."""
import pytest

from gemm_lessons import compiled, occupancy as occ


def test_register_limited_with_the_256_register_allocation_unit():
    # 44 registers x 32 lanes = 1408 per warp, allocated as 1536; 32 warps per block
    # -> 49152 registers per block: one block fits in 65536, two do not
    o = occ.occupancy(44, 8192, 1024, (9, 0))
    assert (o.blocks, o.warps, o.limiter) == (1, 32, "registers")
    assert o.fraction == 0.5
    assert o.caps == {"registers": 1, "shared memory": 25, "threads": 2, "blocks": 32}


def test_shared_memory_limited_counts_the_reserved_kilobyte():
    # 76 KB + 1 KB reserved per block: 2 fit in 228 KB (3 would without the reserve);
    # 75 KB + 1 KB: exactly 3
    o = occ.occupancy(32, 76 * 1024, 128, (9, 0))
    assert (o.blocks, o.limiter) == (2, "shared memory")
    assert occ.occupancy(32, 75 * 1024, 128, (9, 0)).blocks == 3


def test_thread_and_block_limits():
    assert occ.occupancy(32, 0, 1024, (7, 5)).caps["threads"] == 1      # 1024 threads/SM
    o = occ.occupancy(16, 0, 32, (9, 0))                                 # tiny blocks
    assert (o.blocks, o.limiter, o.warps) == (32, "blocks", 32)


def test_what_cannot_launch_is_an_error():
    with pytest.raises(ValueError, match="launch would fail"):
        occ.occupancy(255, 0, 1024, (9, 0))                               # 255 x 1024 > 65536
    with pytest.raises(ValueError, match="shared memory per block"):
        occ.occupancy(32, 228 * 1024, 128, (9, 0))
    with pytest.raises(ValueError, match="compute capability"):
        occ.occupancy(32, 0, 128, (6, 1))


def test_from_the_ptxas_report_of_a_lesson_kernel():
    text = compiled.ptx("k02_smem_tiling", (9, 0))
    rep = compiled.ptxas_report(text, (9, 0))
    if rep is None:
        pytest.skip("ptxas is not installed")
    # the launch bounds promise 1024 threads: ptxas keeps registers <= 64, so a block fits
    o = occ.occupancy(rep["registers"], rep["smem_bytes"], 1024, (9, 0))
    assert rep["registers"] <= 64 and o.blocks >= 1 and o.limiter in ("registers", "threads")


def test_sass_mix_of_the_tensor_core_kernel():
    text = compiled.ptx("k05_wmma", (9, 0))
    sass = occ.sass(text, (9, 0))
    if sass is None:
        pytest.skip("ptxas or cuobjdump is not installed")
    mix = occ.sass_mix(sass)
    assert mix["HMMA.16816.F32"] > 0 and mix["LDSM.16.M88.4"] > 0
    assert mix["LDGSTS.E.BYPASS.128"] > 0                 # 16-byte global -> shared copies
    assert not any(k.startswith("STS") for k in mix)      # nothing stored to shared by hand
