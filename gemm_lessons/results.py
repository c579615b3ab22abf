"""Ladder results recorded on a GPU, shipped with the package so that every learner (and
lesson 10 on a laptop) can read the numbers measured by ``python -m gemm_lessons ladder``.

    python -m gemm_lessons ladder --csv gemm_lessons/results/h200_ladder.csv --out gemm_lessons/results/h200_ladder.png
"""
from __future__ import annotations

import csv
from pathlib import Path

import torch

from .harness import BenchResult

HERE = Path(__file__).resolve().parent / "results"
FIELDS = ["kernel", "lesson", "dtype", "M", "N", "K", "ms", "baseline_ms", "device", "versions"]


def write_csv(path, results, lessons, *, device, versions):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        ver = "; ".join(f"{k} {v}" for k, v in versions.items())
        for r, lesson in zip(results, lessons):
            w.writerow({"kernel": r.kernel, "lesson": lesson,
                        "dtype": str(r.dtype).replace("torch.", ""), "M": r.M, "N": r.N,
                        "K": r.K, "ms": f"{r.ms:.6f}", "baseline_ms": f"{r.baseline_ms:.6f}",
                        "device": device, "versions": ver})


def read_csv(path=None):
    """[(lesson, BenchResult)], device, versions from a recorded ladder."""
    path = Path(path) if path else HERE / "h200_ladder.csv"
    rows, device, versions = [], "", ""
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            r = BenchResult(row["kernel"], getattr(torch, row["dtype"]), int(row["M"]),
                            int(row["N"]), int(row["K"]), ms=float(row["ms"]),
                            baseline_ms=float(row["baseline_ms"]))
            rows.append((int(row["lesson"]), r))
            device, versions = row["device"], row["versions"]
    return rows, device, versions
