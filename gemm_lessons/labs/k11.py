"""Lesson 11's demonstrations: a product of a lesson-11 FP8 kernel on any machine."""
from __future__ import annotations

import torch

from .. import api, engines
from ..common import run_on_simulator

__all__ = ["scaled_product"]


def scaled_product(kernel, qa, qb, sa, sb, out_dtype=torch.float32):
    """``gl.scaled_matmul(qa, qb, sa, sb, kernel=kernel)`` as a CPU tensor: on this engine
    where it runs the kernel; on a GPU without FP8 tensor cores (compute capability below
    8.9; below 9.0 for the TMA kernel), on the simulator in a child process, so that a
    lesson computes the same products everywhere."""
    if api.runs_here(kernel):
        dev = engines.device()
        return api.scaled_matmul(qa.to(dev), qb.to(dev), sa.to(dev), sb.to(dev), kernel=kernel,
                                 out_dtype=out_dtype).cpu()
    return run_on_simulator("gemm_lessons.labs.k11:scaled_product", kernel, qa.cpu(), qb.cpu(),
                            sa.cpu(), sb.cpu(), out_dtype)
