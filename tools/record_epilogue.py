"""Record lesson 09's headline measurements into gemm_lessons/results/h200_epilogue.csv, every
contender's batches interleaved with the others' (needs a Hopper GPU for k09_fused_tma).

    python tools/record_epilogue.py [--head-only]

Rewrites the rows it measures (the fused bias + GELU of k09_fused_tma, k09_fused_epilogue and
k09_fused_splitk at 8192 x 16384 x 4096 against torch eager, torch.compile and cuBLAS's mm
alone; split-K on 256 x 256 x 65536, left out with ``--head-only``) and keeps the others.
Each row: a time (ms) and the time it is compared with (baseline_ms).
"""
from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata
from pathlib import Path

import gemm_lessons as gl
import torch

from gemm_lessons import results
from gemm_lessons.labs import k09 as lab

CSV = Path(__file__).resolve().parents[1] / "gemm_lessons" / "results" / "h200_epilogue.csv"
HEAD = (8192, 16384, 4096)
SPLIT = (256, 256, 65536)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-only", action="store_true", help="leave the split-K rows as they are")
    args = p.parse_args(argv)
    if gl.backend() != "cuda":
        print("record_epilogue times kernels: it needs a GPU", file=sys.stderr)
        return 2
    res = lab.bench_epilogue(*HEAD, torch.float16, "gelu",
                             kernels=lab.KERNEL_NAMES + ("k09_fused_splitk",))
    ms = res.ms
    print({k: round(v, 4) for k, v in ms.items()})
    pairs = {"fused_tma_vs_eager": ("k09_fused_tma", "torch eager"),
             "fused_tma_vs_compile": ("k09_fused_tma", "torch.compile"),
             "fused_tma_vs_mm": ("k09_fused_tma", "cuBLAS mm alone"),
             "fused_pointer_vs_eager": ("k09_fused_epilogue", "torch eager"),
             "fused_pointer_vs_fused_tma": ("k09_fused_epilogue", "k09_fused_tma"),
             "fused_splitk_vs_eager": ("k09_fused_splitk", "torch eager"),
             "fused_splitk_vs_compile": ("k09_fused_splitk", "torch.compile"),
             "fused_splitk_vs_mm": ("k09_fused_splitk", "cuBLAS mm alone"),
             "eager_vs_mm": ("torch eager", "cuBLAS mm alone"),
             "compile_vs_mm": ("torch.compile", "cuBLAS mm alone")}
    new = {(name, HEAD): (ms[a], ms[b]) for name, (a, b) in pairs.items()}
    if not args.head_only:
        split = lab.bench_split_k(*SPLIT, splits=(1, 4, 8, 16, "auto", 64))
        print({k: round(v, 4) for k, v in split.items()})
        auto = next(k for k in split if k.startswith("split_k=auto"))
        new[("split_auto_vs_none", SPLIT)] = (split[auto], split["split_k=1"])
        new[("split_auto_vs_cublas", SPLIT)] = (split[auto], split["cuBLAS"])
        for label, t in split.items():
            if label.startswith("split_k=") and label != auto:
                new[(f"split_S{label.split('=')[1]}_vs_cublas", SPLIT)] = (t, split["cuBLAS"])
        n_auto = auto.split("(")[1].rstrip(")")
        new[(f"split_S{n_auto}_vs_cublas", SPLIT)] = (split[auto], split["cuBLAS"])
    versions = (f"python {platform.python_version()}; torch {torch.__version__}; "
                f"triton {metadata.version('triton')}; tools/record_epilogue.py (interleaved)")
    kept = results.merge_csv(CSV, [
        results.row(name, 9, "float16", M, N, K, t, base, device=gl.engine().device_name,
                    versions=versions) for (name, (M, N, K)), (t, base) in new.items()])
    print(f"wrote {CSV.name}: {len(new)} rows measured, {kept} kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
