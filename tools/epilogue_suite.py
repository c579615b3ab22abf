"""Time the fused bias + GELU over the shape suite (``gemm_lessons.shapes.SHAPES_LLM``)
against torch eager (``gelu(addmm(bias, a, b))``, two kernels), ``torch.compile`` of the
same function (default mode) and cuBLAS's ``mm`` alone, every contender's batches
interleaved in one run, after checking each against torch eager. Needs a GPU.

GPU time, as ``tools/shape_suite.py``: every contender replayed from a CUDA graph, so the
host's cost per call is left out of all of them (``--eager`` includes it). Each shape is
measured ``--repeat`` times in a row (3 by default), each time with new graphs; the CSV gets
each contender's median, and the printout the spread of the ratios to eager.

    python tools/epilogue_suite.py --csv gemm_lessons/results/h200_epilogue_shapes.csv
    python tools/epilogue_suite.py --kernel k09_fused_splitk --shape 16x4096x4096
    python tools/epilogue_suite.py --kernel k09_fused_ws k09_fused_tma_splitk \
        --csv gemm_lessons/results/h200_epilogue_ws.csv

Rows written (``gemm_lessons.results`` format, one set per shape): for each kernel timed,
``<kernel>_vs_eager``, ``<kernel>_vs_compile`` and ``<kernel>_vs_mm`` (ms: the fused
kernel; baseline_ms: the other), and, when the first kernel timed is the default's first
(``k09_fused_tma_splitk``), ``eager_vs_mm`` and ``compile_vs_mm``: so a run of other kernels
alone adds its rows and leaves the baselines' own.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

import gemm_lessons as gl
from gemm_lessons import results
from gemm_lessons.__main__ import _versions
from gemm_lessons.common import geomean
from gemm_lessons.labs import k09 as lab
from gemm_lessons.shapes import SHAPES_LLM, shape_arg, shape_name

KERNELS = ("k09_fused_tma_splitk", "k09_fused_splitk", "k09_fused_tma", "k09_fused_epilogue",
           "k09_fused_ws")
DEFAULT = KERNELS[:3]       # timed together; the first one's rows carry the baselines' own
SHORT = {"torch eager": "eager", "torch.compile": "compile", "cuBLAS mm alone": "mm"}


def rows_of(res, kernel, baselines=True):
    """The CSV rows of one shape's measurement (``baselines``: with eager's and compile's own
    rows against ``mm``; only a run whose first kernel is the default's first writes those,
    so that a run of other kernels alone does not replace them)."""
    pairs = [(f"{kernel}_vs_{SHORT[base]}", kernel, base) for base in SHORT]
    if baselines:
        pairs += [("eager_vs_mm", "torch eager", "cuBLAS mm alone"),
                  ("compile_vs_mm", "torch.compile", "cuBLAS mm alone")]
    return [results.row(name, 9, "float16", res.M, res.N, res.K, res.ms[a], res.ms[b],
                        device=gl.engine().device_name, versions=_versions())
            for name, a, b in pairs]


def median_bench(M, N, K, kernels, repeat, graph=True):
    """``lab.bench_epilogue`` ``repeat`` times in a row (new graphs each time): a result
    whose times are each contender's median over the repeats, and every repeat's times."""
    runs = [lab.bench_epilogue(M, N, K, torch.float16, "gelu", kernels=kernels, graph=graph)
            for _ in range(repeat)]
    res = runs[-1]
    res.ms = {k: statistics.median(r.ms[k] for r in runs) for k in res.ms}
    return res, [r.ms for r in runs]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", nargs="+", default=list(DEFAULT), choices=KERNELS,
                   help="the fused kernels to time, in one run (default: %(default)s)")
    p.add_argument("--shape", nargs="*", type=shape_arg, default=list(SHAPES_LLM))
    p.add_argument("--repeat", type=int, default=3,
                   help="measure each shape this many times; the CSV gets the medians")
    p.add_argument("--csv", help="write the rows (replacing those of the shapes measured)")
    p.add_argument("--eager", action="store_true",
                   help="time calls as Python makes them (the host's cost per call included)")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if gl.backend() != "cuda":
        print("the epilogue suite times kernels: it needs a GPU", file=sys.stderr)
        return 2
    kernels = list(dict.fromkeys(args.kernel))
    new = []
    ratios = {(k, base): [] for k in kernels for base in ("eager", "compile")}
    for i, (M, N, K) in enumerate(args.shape):
        torch._dynamo.reset()      # each shape compiled for itself, not under a shape guard
        res, each = median_bench(M, N, K, tuple(kernels), args.repeat, graph=not args.eager)
        ms = res.ms
        print(f"[{i + 1}/{len(args.shape)}] {shape_name(M, N, K)}: eager "
              f"{ms['torch eager'] * 1e3:.1f} us, compile {ms['torch.compile'] * 1e3:.1f} us, "
              f"mm alone {ms['cuBLAS mm alone'] * 1e3:.1f} us (medians of {args.repeat})",
              flush=True)
        if res.note:
            print(f"    ({res.note})", flush=True)
        present = [k for k in kernels if k in ms]      # a kernel this GPU cannot run is left out
        for k in present:
            for base, key in (("torch eager", "eager"), ("torch.compile", "compile")):
                ratios[(k, key)].append(ms[base] / ms[k])
            spread = [m["torch eager"] / m[k] for m in each]
            print(f"    {k:<22} {ms[k] * 1e3:8.1f} us [{res.configs.get(k, '')}]  "
                  f"{ratios[(k, 'eager')][-1]:.2f}x eager (repeats {min(spread):.2f}-"
                  f"{max(spread):.2f})  {ratios[(k, 'compile')][-1]:.2f}x compile", flush=True)
            new += rows_of(res, k, baselines=k == present[0] and kernels[0] == DEFAULT[0])
        if args.csv:                   # after every shape: a cut-short run keeps what it measured
            results.merge_csv(args.csv, new)
    print()
    for (k, key), rs in ratios.items():
        if not rs:
            continue
        geo = geomean(rs)
        print(f"{k} vs torch {key}: geomean {geo:.2f}x  min {min(rs):.2f}x  "
              f"max {max(rs):.2f}x over {len(rs)} shapes")
    if args.csv:
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
