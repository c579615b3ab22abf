"""Time every candidate config of ``k08_triton_splitk`` on every shape of the suite, each
interleaved with torch.mm (cuBLAS), to see which configs ever win and whether the pruner
keeps them. Needs a GPU.

    python tools/sweep_shapes.py --csv sweep_shapes.csv
    python tools/sweep_shapes.py --shape 16x4096x4096 --only-extra

Budget: about 28 configs x 21 shapes; each config compiles once (all suite shapes specialise
alike), each pair costs a check and about 2 x (2 + batches) short batches of
``--min-batch-ms``; ``--budget-s`` (default 330) stops the timing and summarises what was
done, so a run fits in 6 minutes.

For each shape (``SHAPES_LLM`` plus any ``--shape MxNxK``): seeded operands; every config of
the dtype's list (no pruning) is first checked once against the float64 product (output
NaN-poisoned), then timed with its batches interleaved with torch.mm's
(``harness.time_cuda_many``, short batches: the sweep must stay within minutes), from CUDA
graphs where the harness offers them (``--eager``: not), so that a config is judged by its
GPU time and not by the host's cost per launch, which is the same for every config. Writes one
CSV row per (shape, config) as it goes, then a summary: per shape the best config and its
ratio to torch.mm, the best config the pruner keeps, and which configs are ever best or
within 3% of the best (the list the configs could be cut to).
"""
from __future__ import annotations

import argparse
import csv
import sys
import time

import torch

import gemm_lessons as gl
from gemm_lessons import harness
from gemm_lessons.common import geomean, sm_count
from gemm_lessons.kernels import k08_triton_splitk as sk
from gemm_lessons.shapes import SHAPES_LLM, shape_arg, shape_name

FIELDS = ["M", "N", "K", "config", "split_k", "ms", "baseline_ms", "ratio", "pruner_keeps",
          "status"]
NEAR = 0.03     # "within 3% of the best"


def sweep_shape(M, N, K, dtype, configs, *, batches, min_batch_ms, progress, deadline=None,
                graph=False):
    """Rows for one shape: check, then time, every config (until ``deadline``, a
    ``time.perf_counter()`` value, passes: the rest are left out)."""
    a, b = harness.make_operands(M, N, K, dtype, seed=1)
    ref = harness.reference(a, b)
    base_out = torch.empty(M, N, dtype=dtype, device=a.device)
    kept = sk.prune_for_gpu(configs, dtype, sk.m_bucket(M), N, K, sm_count())
    rows = []
    for cfg in configs:
        if deadline is not None and time.perf_counter() > deadline:
            break
        row = {"M": M, "N": N, "K": K, "config": sk.label(cfg), "split_k": cfg.kwargs["SPLIT_K"],
               "ms": "", "baseline_ms": "", "ratio": "", "pruner_keeps": int(cfg in kept),
               "status": "ok"}
        out = torch.full((M, N), float("nan"), dtype=dtype, device=a.device)
        try:
            sk.matmul(a, b, out, config=cfg)
            torch.cuda.synchronize()
        except Exception as e:   # a config that does not compile or launch on this GPU
            row["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
            rows.append(row)
            progress(row)
            continue
        ok, rel, _ = harness.compare(out, ref, a, b, dtype)
        if not ok:
            row["status"] = f"WRONG (rel. error {rel:.2e})"
            rows.append(row)
            progress(row)
            continue
        fns = {"cfg": lambda: sk.matmul(a, b, out, config=cfg),
               "torch": lambda: torch.mm(a, b, out=base_out)}
        opts = dict(min_batch_ms=min_batch_ms, batches=batches, warmup=1)
        try:
            ms = harness.time_cuda_many(fns, **opts, graph=graph)
        except RuntimeError as e:   # a capture that failed: time this pair eagerly
            ms = harness.time_cuda_many(fns, **opts)
            row["status"] = f"eager ({str(e).splitlines()[0][:60]})"
        row.update(ms=f"{ms['cfg']:.6f}", baseline_ms=f"{ms['torch']:.6f}",
                   ratio=f"{ms['torch'] / ms['cfg']:.4f}")
        rows.append(row)
        progress(row)
    return rows


def summary(rows, near=NEAR):
    """Lines: per shape the best config (and the pruner's best), then the configs that are
    ever best or within ``near`` of the best."""
    lines, close, best_ratios, pruned_ratios = [], {}, [], []
    shapes = list(dict.fromkeys((r["M"], r["N"], r["K"]) for r in rows))
    for s in shapes:
        timed = [r for r in rows if (r["M"], r["N"], r["K"]) == s and r["ms"] != ""]
        if not timed:
            lines.append(f"{shape_name(*s):>18s}  nothing timed")
            continue
        best = min(timed, key=lambda r: float(r["ms"]))
        kept = [r for r in timed if int(r["pruner_keeps"])]
        pbest = min(kept, key=lambda r: float(r["ms"])) if kept else None
        best_ratios.append(float(best["ratio"]))
        if pbest:
            pruned_ratios.append(float(pbest["ratio"]))
        lines.append(f"{shape_name(*s):>18s}  best {best['config']:24s} ratio "
                     f"{float(best['ratio']):.2f}   pruner's best "
                     + (f"{pbest['config']:24s} ratio {float(pbest['ratio']):.2f}"
                        if pbest else "none timed"))
        for r in timed:
            if float(r["ms"]) <= (1 + near) * float(best["ms"]):
                close.setdefault(r["config"], []).append(shape_name(*s))

    lines.append(f"geomean of the best ratios {geomean(best_ratios):.3f} (min "
                 f"{min(best_ratios, default=float('nan')):.2f}); with the pruner's choice "
                 f"{geomean(pruned_ratios):.3f} (min {min(pruned_ratios, default=float('nan')):.2f})")
    lines.append(f"configs ever best or within {near:.0%} of the best ({len(close)}):")
    for cfg, where in sorted(close.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {cfg:24s} {len(where):2d} shapes: {', '.join(where)}")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs="*", type=shape_arg, default=[], help="extra MxNxK shapes")
    p.add_argument("--only-extra", action="store_true", help="skip SHAPES_LLM")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--csv", default="sweep_shapes.csv")
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--min-batch-ms", type=float, default=3.0)
    p.add_argument("--eager", action="store_true",
                   help="time eager calls (host cost included) even where CUDA graphs are "
                        "available; by default the GPU time alone is compared")
    p.add_argument("--budget-s", type=float, default=330.0,
                   help="stop timing after this many seconds and summarise what was timed")
    args = p.parse_args(argv)
    if gl.backend() != "cuda":
        print("sweep_shapes times kernels: it needs a GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    graph = not args.eager
    print("timing: " + ("CUDA graphs (GPU time alone)" if graph else
                        "eager calls (host cost per call included)"), flush=True)
    configs = sk.FP32_CONFIGS if dtype == torch.float32 else sk.CONFIGS
    shapes = ([] if args.only_extra else list(SHAPES_LLM)) + list(args.shape)
    n, t0 = len(shapes) * len(configs), time.perf_counter()
    done = [0]

    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()

        def progress(row):
            done[0] += 1
            w.writerow(row)
            f.flush()
            what = (f"{float(row['ms']):9.4f} ms  ratio {float(row['ratio']):.2f}"
                    if row["ms"] != "" else row["status"])
            print(f"[{done[0]}/{n}] {shape_name(row['M'], row['N'], row['K']):>18s} "
                  f"{row['config']:24s} {what}  ({time.perf_counter() - t0:.0f} s)", flush=True)

        rows = []
        for M, N, K in shapes:
            rows += sweep_shape(M, N, K, dtype, configs, batches=args.batches,
                                min_batch_ms=args.min_batch_ms, progress=progress,
                                deadline=t0 + args.budget_s, graph=graph)
    if len(rows) < n:
        print(f"\nthe budget of {args.budget_s:.0f} s ran out: {n - len(rows)} of {n} "
              "(shape, config) pairs were not timed")
    print(f"\nwrote {args.csv} ({len(rows)} rows) in {time.perf_counter() - t0:.0f} s "
          f"on {torch.cuda.get_device_name()}, {sm_count()} SMs\n")
    print("\n".join(summary(rows)))
    return 1 if any(r["status"].startswith("WRONG") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
