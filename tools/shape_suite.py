"""Time the finished kernels on the shape suite (``gemm_lessons.shapes.SHAPES_LLM``), each
against cuBLAS of the same precision with their batches interleaved, after checking each
kernel on each shape against the float64 reference. Needs a GPU.

The figures are GPU time: each side's batch of calls is captured once in a CUDA graph and
replayed (``gl.bench(graph=True)``), so the host's cost per call, which on the smallest
shapes exceeds the GPU's work for every kernel and for torch.mm alike, is left out of both
(lesson 07 measures it on its own; ``--eager`` includes it).

    python tools/shape_suite.py --csv gemm_lessons/results/h200_shapes.csv
    python tools/shape_suite.py --kernel k07_triton_swizzle --shape 16x4096x4096 2048x11008x4096
"""
from __future__ import annotations

import argparse
import sys

import torch

import gemm_lessons as gl
from gemm_lessons import harness, results
from gemm_lessons.__main__ import _versions
from gemm_lessons.common import geomean
from gemm_lessons.shapes import SHAPES_LLM, shape_arg, shape_name

DEFAULT_KERNELS = ["k06_wgmma", "k07_triton_swizzle", "k08_triton_autotune", "k08_triton_tma",
                   "k09_fused_epilogue", "k08_triton_splitk"]


def check_on(kernel, M, N, K, dtype):
    """The kernel's product on seeded operands of this shape, against float64: (ok, rel)."""
    a, b = harness.make_operands(M, N, K, dtype, seed=1)
    out = gl.matmul(a, b, kernel=kernel)
    torch.cuda.synchronize()
    ok, rel, _ = harness.compare(out, harness.reference(a, b), a, b, dtype)
    return ok, rel


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", nargs="*", default=DEFAULT_KERNELS)
    p.add_argument("--shape", nargs="*", type=shape_arg, default=list(SHAPES_LLM))
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--csv", help="write the results (gemm_lessons.results format)")
    p.add_argument("--eager", action="store_true",
                   help="time calls as Python makes them (the host's cost per call included); "
                        "default: GPU time alone, both sides replayed from CUDA graphs")
    args = p.parse_args(argv)
    if not gl.backend() == "cuda":
        print("the shape suite times kernels: it needs a GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    rows, bad = [], []
    kernels = [k for k in args.kernel if gl.runs_here(k)]
    total = len(kernels) * len(args.shape)
    for i, (M, N, K) in enumerate((s for s in args.shape for _ in kernels)):
        kernel = kernels[i % len(kernels)]
        ok, rel = check_on(kernel, M, N, K, dtype)
        if not ok:
            bad.append(f"{kernel} {shape_name(M, N, K)}: WRONG (rel. error {rel:.2e})")
            print(bad[-1], flush=True)
            continue
        r = gl.bench(kernel, M, N, K, dtype=dtype, graph=not args.eager)
        rows.append(r)
        print(f"[{i + 1}/{total}] {kernel:22s} {shape_name(M, N, K):>18s} "
              f"{r.tflops:7.1f} TFLOP/s  cuBLAS {r.baseline_tflops:7.1f}  ratio {r.ratio:.2f}",
              flush=True)
    print()
    for k in kernels:
        ratios = [r.ratio for r in rows if r.kernel == k]
        if ratios:
            geo = geomean(ratios)
            print(f"{k:22s} geomean {geo:.2f}  min {min(ratios):.2f}  max {max(ratios):.2f} "
                  f"over {len(ratios)} shapes")
    if args.csv and rows:
        lessons = {e.name: e.lesson for e in gl.kernels()}
        results.write_csv(args.csv, rows, [lessons[r.kernel] for r in rows],
                          device=gl.engine().device_name, versions=_versions())
        print(f"wrote {args.csv}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
