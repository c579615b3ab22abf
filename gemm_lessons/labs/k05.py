"""Lesson 05's lab: the lesson reads its kernels' diffs a part at a time with
:func:`show_diff_part` (and a part of a source with :func:`show_part`), the same functions as
lessons 04 and 06.

    from gemm_lessons.labs import k05 as lab
    lab.show_diff_part("k05_wmma_warp", "k05_wmma_block", None, "for k0 in range")
"""
from __future__ import annotations

from .k06 import show_diff_part, show_part

__all__ = ["show_part", "show_diff_part"]
