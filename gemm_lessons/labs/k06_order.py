"""Lesson 06, the order of the tiles: what a persistent grid's walk asks of L2, counted.

A persistent grid of G blocks (one per SM) walks the tiles in waves: block b takes tiles
b, b + G, b + 2 G, ..., so at any moment the G blocks work on G consecutive tile indices,
and ``grouped_block(tile, M, N, BM, BN, GROUP_M)`` (the kernels' own function) says which
tile of the output an index is. The blocks of one wave walk K roughly together, so a k-tile
of A or B that several of them read comes from DRAM once and from L2 after that, if the
wave's working set stays in L2 for that long.

:func:`wave_panels` counts, for one wave, the distinct row panels of A (BM rows) and
column panels of B (BN columns) its tiles read; :func:`order_footprint` sums over every
wave the bytes those panels hold: what L2 has to fetch from DRAM when every panel is read
from DRAM once per wave, against what the SMs read (every tile its own panels).
``GROUP_M = 1`` is the row-major order: a wave takes whole rows of tiles, so it reads few
panels of A and every panel of B.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..common import NOMINAL_SMS, cdiv
from ..kernels.tc_common import grouped_block

__all__ = ["tile_origins", "wave_panels", "OrderFootprint", "order_footprint"]


def tile_origins(M, N, BM, BN, group_m):
    """[(first row, first column)] of every tile, in the order of the tile index, as the
    persistent kernels compute it (``grouped_block``'s Python function)."""
    place = grouped_block.py_func
    return [place(t, M, N, BM, BN, group_m) for t in range(cdiv(M, BM) * cdiv(N, BN))]


def wave_panels(M, N, BM, BN, group_m, blocks=NOMINAL_SMS, wave=0):
    """(panels of A, panels of B) that wave ``wave`` of a grid of ``blocks`` reads: the
    distinct tile rows and tile columns among its tiles."""
    tiles = tile_origins(M, N, BM, BN, group_m)[wave * blocks:(wave + 1) * blocks]
    return len({r for r, _ in tiles}), len({c for _, c in tiles})


@dataclass(frozen=True)
class OrderFootprint:
    """One order's count on an M x N x K product of 16-bit operands: ``first_wave`` the
    (A panels, B panels) of the first wave; ``dram_bytes`` the bytes of the panels each wave
    reads, summed over the waves; ``smem_bytes`` the bytes the tiles' loads bring to shared
    memory (every tile reads its BM x K and K x BN panels)."""
    group_m: int
    waves: int
    first_wave: tuple
    dram_bytes: int
    smem_bytes: int

    @property
    def l2_hit_rate(self):
        """The share of the tiles' reads served by L2 under this count."""
        return 1.0 - self.dram_bytes / self.smem_bytes


def order_footprint(M, N, K, BM, BN, group_m, blocks=NOMINAL_SMS, elem_bytes=2):
    """:class:`OrderFootprint` of the walk ``GROUP_M = group_m`` on ``blocks`` blocks."""
    tiles = tile_origins(M, N, BM, BN, group_m)
    dram = 0
    for w in range(0, len(tiles), blocks):
        wave = tiles[w:w + blocks]
        rows, cols = {r for r, _ in wave}, {c for _, c in wave}
        dram += (len(rows) * BM + len(cols) * BN) * K * elem_bytes
    return OrderFootprint(group_m, cdiv(len(tiles), blocks),
                          wave_panels(M, N, BM, BN, group_m, blocks), dram,
                          len(tiles) * (BM + BN) * K * elem_bytes)
