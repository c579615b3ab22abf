"""The shapes people run: a GEMM suite beyond the two squares the lessons tune for.

``SHAPES_LLM`` crosses the row counts of a transformer's linear layers (M = tokens in flight:
16 for decoding, up to 8192 for a long prefill) with the (N, K) of its projections
(4096 x 4096 attention, 14336 x 4096 up-projection, 4096 x 14336 down-projection,
1024 x 8192 a narrow one), plus one K-heavy product. Each entry is (M, N, K).
"""
from __future__ import annotations

import argparse

__all__ = ["SHAPES_LLM", "NK_LLM", "M_LLM", "shape_name", "shape_arg"]

M_LLM = (16, 128, 512, 2048, 8192)
NK_LLM = ((4096, 4096), (14336, 4096), (4096, 14336), (1024, 8192))
SHAPES_LLM = tuple((m, n, k) for (n, k) in NK_LLM for m in M_LLM) + ((1024, 1024, 16384),)


def shape_name(M: int, N: int, K: int) -> str:
    """``'2048x11008x4096'``: how the results CSV and the prose name a shape."""
    return f"{M}x{N}x{K}"


def shape_arg(text: str) -> tuple[int, int, int]:
    """A shape as the tools take it on the command line: ``'64'`` (a cube, M = N = K) or
    ``'16x4096x4096'`` (M x N x K), positive sizes; anything else an
    ``argparse.ArgumentTypeError`` that says what is wanted."""
    try:
        dims = [int(x) for x in text.lower().split("x")]
    except ValueError:
        dims = []
    if len(dims) not in (1, 3) or min(dims) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: want a size (64) or MxNxK (16x4096x4096) with positive sizes")
    return tuple(dims * 3 if len(dims) == 1 else dims)
