"""Time the fused bias + GELU over the shape suite (``gemm_lessons.shapes.SHAPES_LLM``)
against torch eager (``gelu(addmm(bias, a, b))``, two kernels), ``torch.compile`` of the
same function (default mode) and cuBLAS's ``mm`` alone, every contender's batches
interleaved in one run, after checking each against torch eager. Needs a GPU.

GPU time, as ``tools/shape_suite.py``: every contender replayed from a CUDA graph, so the
host's cost per call is left out of all of them (``--eager`` includes it).

    python tools/epilogue_suite.py --csv gemm_lessons/results/h200_epilogue_shapes.csv
    python tools/epilogue_suite.py --kernel k09_fused_splitk --shape 16x4096x4096

Rows written (``gemm_lessons.results`` format, one set per shape): ``<kernel>_vs_eager``,
``<kernel>_vs_compile`` and ``<kernel>_vs_mm`` (ms: the fused kernel; baseline_ms: the
other), and, in the default kernel's run only, ``eager_vs_mm`` and ``compile_vs_mm``.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

import gemm_lessons as gl
from gemm_lessons import results
from gemm_lessons.__main__ import _versions
from gemm_lessons.labs import k09 as lab
from gemm_lessons.shapes import SHAPES_LLM, shape_arg, shape_name

DEFAULT = "k09_fused_splitk"      # its run writes the baselines' rows (eager_vs_mm, compile_vs_mm)
SHORT = {"torch eager": "eager", "torch.compile": "compile", "cuBLAS mm alone": "mm"}


def rows_of(res, kernel, baselines=True):
    """The CSV rows of one shape's measurement (``baselines``: with eager's and compile's own
    rows against ``mm``; only the default kernel's run writes those, so that a second run,
    of another kernel, does not replace them)."""
    pairs = [(f"{kernel}_vs_{SHORT[base]}", kernel, base) for base in SHORT]
    if baselines:
        pairs += [("eager_vs_mm", "torch eager", "cuBLAS mm alone"),
                  ("compile_vs_mm", "torch.compile", "cuBLAS mm alone")]
    return [results.row(name, 9, "float16", res.M, res.N, res.K, res.ms[a], res.ms[b],
                        device=gl.engine().device_name, versions=_versions())
            for name, a, b in pairs]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", default=DEFAULT,
                   choices=["k09_fused_splitk", "k09_fused_tma_splitk", "k09_fused_tma",
                            "k09_fused_epilogue"])
    p.add_argument("--shape", nargs="*", type=shape_arg, default=list(SHAPES_LLM))
    p.add_argument("--csv", help="write the rows (replacing those of the shapes measured)")
    p.add_argument("--eager", action="store_true",
                   help="time calls as Python makes them (the host's cost per call included)")
    args = p.parse_args(argv)
    if gl.backend() != "cuda":
        print("the epilogue suite times kernels: it needs a GPU", file=sys.stderr)
        return 2
    new, ratios = [], {"eager": [], "compile": []}
    for i, (M, N, K) in enumerate(args.shape):
        torch._dynamo.reset()      # each shape compiled for itself, not under a shape guard
        res = lab.bench_epilogue(M, N, K, torch.float16, "gelu", kernels=(args.kernel,),
                                 graph=not args.eager)
        ms = res.ms
        for base, key in (("torch eager", "eager"), ("torch.compile", "compile")):
            ratios[key].append(ms[base] / ms[args.kernel])
        print(f"[{i + 1}/{len(args.shape)}] {shape_name(M, N, K):>18s} "
              f"{args.kernel} {ms[args.kernel] * 1e3:8.1f} us "
              f"[{res.configs.get(args.kernel, '')}]  eager {ms['torch eager'] * 1e3:8.1f} us "
              f"({ratios['eager'][-1]:.2f}x)  compile {ms['torch.compile'] * 1e3:8.1f} us "
              f"({ratios['compile'][-1]:.2f}x)  mm alone {ms['cuBLAS mm alone'] * 1e3:8.1f} us",
              flush=True)
        new += rows_of(res, args.kernel, baselines=args.kernel == DEFAULT)
        if args.csv:                   # after every shape: a cut-short run keeps what it measured
            results.merge_csv(args.csv, new)
    print()
    for key, rs in ratios.items():
        geo = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"{args.kernel} vs torch {key}: geomean {geo:.2f}x  min {min(rs):.2f}x  "
              f"max {max(rs):.2f}x over {len(rs)} shapes")
    if args.csv:
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
