"""Time kernels at one M x N over several K, interleaved with cuBLAS, and write the rows.

How a kernel's time splits: ``t(K) = fixed + K * per_k``. The fixed part is what every tile
pays once (filling the pipeline, the epilogue, the block's start); the slope is the K loop's
time per unit of K. Two kernels that differ only in the fixed part (lesson 06:
``k06_persistent`` and ``k06_wide_stores``) differ by the same time at every K, a share that
shrinks as K grows; two that differ in the K loop differ by the same ratio everywhere.

    python tools/sweep_k.py --kernel k06_producer_consumer k06_persistent k06_wide_stores \\
        --mn 4096 --k 2048 4096 8192 16384 --graph --csv gemm_lessons/results/h200_sweep_k.csv

Rows (``gemm_lessons.results`` format): ms is the kernel's, baseline_ms cuBLAS's
(``torch.mm``) in the same run, each shape's contenders' batches interleaved, every kernel
checked against float64 first. ``--graph`` replays CUDA graphs (GPU time only).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402

from gemm_lessons import api, harness, results  # noqa: E402
from gemm_lessons.__main__ import _versions  # noqa: E402


def measure(names, M, N, K, dtype=torch.float16, graph=False):
    """{name: ms} for every kernel in ``names`` and "cuBLAS", in one interleaved run."""
    a, b = harness.make_operands(M, N, K, dtype, seed=0)
    ref = harness.reference(a, b)
    runs = {}
    for name in names:
        out = torch.full((M, N), float("nan"), dtype=dtype, device=a.device)
        api.matmul(a, b, name, out=out)
        ok, rel, _ = harness.compare(out, ref, a, b, dtype)
        if not ok:
            raise harness.CheckError(f"{name} at {M}x{N}x{K}: relative error {rel:.1e}")
        runs[name] = lambda name=name, out=out: api.matmul(a, b, name, out=out)
    mm = torch.empty(M, N, dtype=dtype, device=a.device)
    runs["cuBLAS"] = lambda: torch.mm(a, b, out=mm)
    return harness.time_cuda_many(runs, graph=graph)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", nargs="+", required=True)
    p.add_argument("--mn", type=int, default=4096, help="M = N")
    p.add_argument("--k", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    p.add_argument("--graph", action="store_true", help="replay CUDA graphs (GPU time)")
    p.add_argument("--csv", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    known = {e.name: e for e in api.kernels()}
    unknown = [n for n in args.kernel if n not in known]
    if unknown:                                  # before anything compiles
        p.error(f"unknown kernel(s) {', '.join(unknown)}; see python -m gemm_lessons info")
    if not gl.engines.on_gpu():
        print("sweep_k times kernels: it needs a GPU", file=sys.stderr)
        return 2
    rows = []
    for i, K in enumerate(args.k, 1):
        ms = measure(args.kernel, args.mn, args.mn, K, graph=args.graph)
        flop = 2 * args.mn * args.mn * K
        print(f"[{i}/{len(args.k)}] K={K:6d}  " + "  ".join(
            f"{n} {t * 1e3:8.1f} us ({flop / t / 1e9:4.0f} TFLOP/s)" for n, t in ms.items()),
            flush=True)
        for name in args.kernel:
            rows.append((known[name].lesson, harness.BenchResult(
                name, torch.float16, args.mn, args.mn, K, ms[name], ms["cuBLAS"])))
    if args.csv:
        results.write_csv(args.csv, [r for _, r in rows], [lesson for lesson, _ in rows],
                          device=gl.engine().device_name, versions=_versions())
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
