"""Lesson 08's measurement: every autotuning config of ``k08_triton_autotune`` timed on its
own, against cuBLAS in the same run, each checked first.

    from gemm_lessons.labs import k08 as lab
    rows = lab.time_configs(sizes=(1024, 4096, 8192))     # on a GPU; [] elsewhere
"""
from __future__ import annotations

import torch

from .. import engines, harness
from ..kernels import k07_triton_swizzle as k07
from ..kernels import k08_triton_autotune as k08

__all__ = ["time_configs"]


def time_configs(sizes=(1024, 4096, 8192), dtype=torch.float16, configs=None):
    """Every config timed on its own, at each size (M = N = K), against cuBLAS in the same
    run, each checked first. Returns ``(config label, size, TFLOP/s, cuBLAS TFLOP/s)`` rows;
    none without a GPU."""
    if not engines.on_gpu():
        return []
    if configs is None:
        configs = k08.FP32_CONFIGS if dtype == torch.float32 else k08.CONFIGS
    rows = []
    for size in sizes:
        a, b = harness.make_operands(size, size, size, dtype)
        ref = harness.reference(a, b)
        out = torch.empty(size, size, dtype=dtype, device=a.device)
        base = harness.time_cuda(lambda: harness.cublas_matmul(a, b, out))
        for cfg in configs:
            def run():
                k07.matmul(a, b, out, config=k08.tile_config(cfg),
                           group_size_m=cfg.kwargs["GROUP_SIZE_M"])
            out.fill_(float("nan"))
            run()
            if not harness.compare(out, ref, a, b, dtype)[0]:
                raise harness.CheckError(f"config {k08.label(cfg)} is wrong at {size}")
            ms = harness.time_cuda(run)
            rows.append((k08.label(cfg), size, harness.tflops(size, size, size, ms),
                         harness.tflops(size, size, size, base)))
        del ref
    return rows
