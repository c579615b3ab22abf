"""Lesson 06, the order of the tiles: the count of what a wave of the persistent grid reads
(``gemm_lessons.labs.k06``), and the GPU tool that times the orders
(``tools/sweep_k06_order.py``) on the CPU side.

Every order visits every tile once (it is a permutation: the product does not depend on
it); ``GROUP_M = 1`` is row-major; the panel counts follow from the shape of a wave; the
byte count is the whole of A and B when one wave covers the output, and every tile's own
panels when each wave is one tile (no reuse).
"""
import sys
from pathlib import Path

import pytest

import gemm_lessons as gl
from gemm_lessons.common import cdiv
from gemm_lessons.labs.k06 import order_footprint, tile_origins, wave_panels

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import sweep_k06_order  # noqa: E402


@pytest.mark.parametrize("M, N, BM, BN, group_m", [(8192, 8192, 128, 256, 8),
                                                  (1000, 700, 128, 256, 3),
                                                  (1000, 700, 64, 256, 1),
                                                  (4096, 4096, 64, 256, 16)])
def test_every_order_visits_every_tile_once(M, N, BM, BN, group_m):
    tiles = tile_origins(M, N, BM, BN, group_m)
    want = {(r, c) for r in range(0, M, BM) for c in range(0, N, BN)}
    assert len(tiles) == len(want) and set(tiles) == want


def test_group_1_is_row_major():
    n_n = cdiv(700, 256)
    assert tile_origins(1000, 700, 128, 256, 1) == [(t // n_n * 128, t % n_n * 256)
                                                    for t in range(cdiv(1000, 128) * n_n)]


def test_a_wave_reads_whole_rows_row_major_and_bands_grouped():
    n_m, n_n = 8192 // 128, 8192 // 256
    assert wave_panels(8192, 8192, 128, 256, 1, blocks=132) == (cdiv(132, n_n), n_n)
    # bands of 8 tile rows: 132 tiles fill 16 columns of 8 and 4 rows of the 17th
    assert wave_panels(8192, 8192, 128, 256, 8, blocks=132) == (8, cdiv(132, 8))
    assert n_m >= 8


def test_bytes_from_dram_between_no_reuse_and_one_read():
    M, N, K, BM, BN = 1024, 768, 512, 128, 256
    tiles = cdiv(M, BM) * cdiv(N, BN)
    one_wave = order_footprint(M, N, K, BM, BN, 8, blocks=tiles)
    assert one_wave.waves == 1 and one_wave.dram_bytes == (M + N) * K * 2
    no_reuse = order_footprint(M, N, K, BM, BN, 8, blocks=1)
    assert no_reuse.dram_bytes == no_reuse.smem_bytes == tiles * (BM + BN) * K * 2
    assert no_reuse.l2_hit_rate == 0.0
    for g in (1, 2, 8):
        f = order_footprint(M, N, K, BM, BN, g, blocks=5)
        assert one_wave.dram_bytes < f.dram_bytes < f.smem_bytes


def test_sweep_names_its_rows_by_order_and_refuses_without_a_gpu(capsys, tmp_path):
    names = sweep_k06_order.variants([1, 8], None)
    assert sorted(names) == ["k06_pingpong:g1", "k06_pingpong:g8", "k06_tma_store:g1",
                             "k06_tma_store:g8"]
    assert names["k06_pingpong:g8"][1] == {"GROUP_M": 8}
    if gl.backend() == "cuda":
        return
    assert sweep_k06_order.main(["--out", str(tmp_path / "x.csv")]) == 2
    assert "--dry-run" in capsys.readouterr().err
