"""The shapes people run: a GEMM suite beyond the two squares the lessons tune for.

``SHAPES_LLM`` crosses the row counts of a transformer's linear layers (M = tokens in flight:
16 for decoding, up to 8192 for a long prefill) with the (N, K) of its projections
(4096 x 4096 attention, 14336 x 4096 up-projection, 4096 x 14336 down-projection,
1024 x 8192 a narrow one), plus one K-heavy product. Each entry is (M, N, K).
"""
from __future__ import annotations

__all__ = ["SHAPES_LLM", "NK_LLM", "M_LLM", "shape_name"]

M_LLM = (16, 128, 512, 2048, 8192)
NK_LLM = ((4096, 4096), (14336, 4096), (4096, 14336), (1024, 8192))
SHAPES_LLM = tuple((m, n, k) for (n, k) in NK_LLM for m in M_LLM) + ((1024, 1024, 16384),)


def shape_name(M: int, N: int, K: int) -> str:
    """``'2048x11008x4096'``: how the results CSV and the prose name a shape."""
    return f"{M}x{N}x{K}"
