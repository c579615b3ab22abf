"""What each part of lesson 09's epilogue costs inside the GEMM: ``k09_fused_splitk`` on one
fixed configuration (no tuning, so only the epilogue changes) with no epilogue, the bias, the
bias and relu, the bias and gelu through libdevice's ``erff`` (``gelu_libdevice``), and the
bias and the branch-free gelu (``gelu``); beside them cuBLAS's ``mm`` alone, ``addmm`` (cuBLAS
with the bias in its epilogue) and torch eager's ``gelu(addmm(...))``. Every contender is
checked against float64 first, then replayed from CUDA graphs, batches interleaved in one
run. Needs a GPU.

    python tools/epilogue_cost.py --csv gemm_lessons/results/h200_epilogue_cost.csv

Rows (``gemm_lessons.results`` format): kernel ``epilogue:<what>``, ``addmm`` or ``eager``;
ms its time, baseline_ms cuBLAS's ``mm`` in the same run.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import gemm_lessons as gl
from gemm_lessons import harness, results
from gemm_lessons.__main__ import _versions
from gemm_lessons.kernels import k08_triton_splitk as k08s
from gemm_lessons.kernels import k09_fused_splitk as fsk
from gemm_lessons.labs import k09 as lab
from gemm_lessons.shapes import shape_arg, shape_name

SHAPES = [(8192, 16384, 4096), (8192, 4096, 4096), (2048, 14336, 4096), (2048, 4096, 4096)]
CONFIG = k08s.make_config(128, 256, 64, 8, 3)      # lesson 08's large-shape winner
EPILOGUES = {"none": (False, None), "bias": (True, None), "bias+relu": (True, "relu"),
             "bias+gelu_libdevice": (True, "gelu_libdevice"), "bias+gelu": (True, "gelu")}
ACT64 = {None: lambda y: y, "relu": F.relu, "gelu": F.gelu, "gelu_libdevice": F.gelu}


def measure(M, N, K, seed=0):
    """{contender: ms per call}, each checked against float64 first."""
    a, b, bias = lab.epilogue_operands(M, N, K, torch.float16, seed=seed)   # as bench_epilogue
    dev = a.device
    prod = a.double() @ b.double()
    runs, outs = {}, {}
    mm_out = torch.empty(M, N, dtype=torch.half, device=dev)
    runs["mm"] = lambda: torch.mm(a, b, out=mm_out)
    runs["addmm"] = lambda: torch.addmm(bias, a, b)
    runs["eager"] = lambda: F.gelu(torch.addmm(bias, a, b))
    for what, (has_bias, act) in EPILOGUES.items():
        out = outs[what] = torch.full((M, N), float("nan"), dtype=torch.half, device=dev)
        runs[f"epilogue:{what}"] = (
            lambda out=out, hb=has_bias, act=act:
            fsk.fused_gemm(a, b, None, out, 1.0, 0.0, bias if hb else None, act, config=CONFIG))
    for what, (has_bias, act) in EPILOGUES.items():
        runs[f"epilogue:{what}"]()
        ref = ACT64[act](prod + bias.double() if has_bias else prod)
        err = ((outs[what].double() - ref).abs().max() / ref.abs().max()).item()
        if not err < 2e-3:
            raise AssertionError(f"epilogue {what} at {shape_name(M, N, K)}: max error {err:.2e}")
    err = ((runs["eager"]().double() - F.gelu(prod + bias.double())).abs().max()).item()
    assert err < 1e-2, f"eager disagrees with float64 by {err}"
    return harness.time_cuda_many(runs, graph=True, batches=9)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs="*", type=shape_arg, default=SHAPES)
    p.add_argument("--csv", help="write the rows here (the file is replaced)")
    args = p.parse_args(argv)
    if gl.backend() != "cuda":
        print("epilogue_cost times kernels: it needs a GPU", file=sys.stderr)
        return 2
    rows = []
    print(f"k09_fused_splitk, config {k08s.label(CONFIG)}; microseconds per call; "
          f"extra: over the kernel with no epilogue")
    for i, (M, N, K) in enumerate(args.shape):
        ms = measure(M, N, K)
        base = ms["epilogue:none"]
        print(f"[{i + 1}/{len(args.shape)}] {shape_name(M, N, K)}: mm {ms['mm'] * 1e3:.1f}  "
              f"addmm {ms['addmm'] * 1e3:.1f}  eager {ms['eager'] * 1e3:.1f}", flush=True)
        for what in EPILOGUES:
            t = ms[f"epilogue:{what}"]
            print(f"    {what:<22s} {t * 1e3:8.1f}   extra {(t - base) * 1e3:7.1f}   "
                  f"{ms['eager'] / t:.3f}x eager")
        for name, t in ms.items():
            if name != "mm":
                rows.append(results.row(name, 9, "float16", M, N, K, t, ms["mm"],
                                        device=gl.engine().device_name, versions=_versions()))
    if args.csv:
        results.merge_csv(args.csv, rows, keep=False)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
