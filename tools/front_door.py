"""The front door: the package's public calls timed exactly as a user makes them, against
the torch call each replaces, interleaved in one run (needs a GPU).

    python tools/front_door.py --csv gemm_lessons/results/h200_front_door.csv
    python tools/front_door.py --part host                 # host time per call at 64^3 only
    python tools/front_door.py --part plain --random 0     # the suite's shapes, plain GEMM

Three parts, each writing rows as it goes (a run cut short keeps what it measured):

* ``host``: for every kernel that runs here, the host time per call at 64^3 (the wall clock
  of calls queued without waiting for the GPU): ``gl.matmul`` (direct), the call of a
  ``gl.prepare`` object (extra column ``prepare_ms``), and against them ``torch.mm``; for
  kernels with an epilogue also ``gl.gemm(x, W.t(), bias=b, activation="gelu")`` against
  ``F.gelu(F.linear(x, W, b))``.
* ``plain``: ``gl.matmul(a, b, kernel)`` for the Triton GEMMs and ``kernel="auto"``, direct,
  against ``torch.mm``; for ``auto`` also through ``gl.prepare`` and replayed from a CUDA
  graph (both sides captured).
* ``fused``: ``gl.gemm(x, W.t(), bias=b, activation="gelu", kernel=...)`` for the fused
  kernels and ``auto``, direct, against eager ``F.gelu(F.linear(x, W, b))`` and
  ``torch.compile`` of it (``dynamic=True``: one compilation serves every shape); for
  ``auto`` also replayed from a CUDA graph.

Shapes: ``SHAPES_LLM`` and ``--random`` seeded shapes (M from 1 to 8192, N and K from 64
to 28672, log-uniform; every third with sizes that are not multiples of 8; B row-major
for even ones and ``W.t()`` of an (N, K) weight for odd ones). Every kernel is checked on a
shape (NaN-poisoned output, float64 reference) before it is timed there.

CSV rows (``gemm_lessons.results.FIELDS`` plus ``layout``, ``prepare_ms``, ``status``):
``kernel`` is ``<kernel>:<direct|prepare|graph|host>:<mm|eager|compile>``, ``ms`` the
kernel's time per call, ``baseline_ms`` the torch call's in the same run; host rows hold
host times per call. Direct and prepare times are back-to-back calls (the larger of host
and GPU time per call: what a program that calls it in a loop gets); graph times are the
GPU's alone.
"""
from __future__ import annotations

import argparse
import csv
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gemm_lessons import harness, registry  # noqa: E402
from gemm_lessons.__main__ import _versions  # noqa: E402
from gemm_lessons.results import FIELDS, versions_text  # noqa: E402
from gemm_lessons.shapes import SHAPES_LLM, shape_arg  # noqa: E402

EXTRA = ["layout", "prepare_ms", "status", "run"]
PLAIN = ["k08_triton_splitk", "k08_triton_tma", "k09_fused_tma", "k08_triton_autotune",
         "k07_triton_swizzle", "auto"]
FUSED = ["k09_fused_tma_splitk", "k09_fused_ws", "k09_fused_tma", "k09_fused_splitk", "auto"]
DTYPE = torch.float16


def random_shapes(n, seed=0):
    """``n`` seeded (M, N, K, layout): log-uniform sizes, every third not a multiple of 8."""
    rng = random.Random(seed)

    def draw(lo, hi, odd):
        x = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        if odd:
            return x if x % 8 else x + rng.choice((1, 3, 5, 7))
        return max(8, x // 8 * 8) if lo > 1 or x >= 8 else x
    shapes = []
    for i in range(n):
        odd = i % 3 == 0
        M, N, K = draw(1, 8192, odd), draw(64, 28672, odd), draw(64, 28672, odd)
        while M * N * K > 2 ** 38:            # keep each product under about 5 ms
            K = max(64, K // 2)
        shapes.append((M, N, K, "wt" if i % 2 else "row"))
    return shapes


def operands(M, N, K, layout, seed=0, dtype=DTYPE):
    """x (M, K), the weight W (N, K), and b as the call takes it: W.t() or a row-major copy."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    W = (torch.randn(N, K, generator=g, device="cuda", dtype=torch.float32) / K ** 0.5).to(dtype)
    bias = torch.randn(N, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    b = W.t() if layout == "wt" else W.t().contiguous()
    return x, W, b, bias


class Writer:
    def __init__(self, path, run=""):
        self.rows = []
        self.run = run
        self.path = path
        self.device = torch.cuda.get_device_name()
        self.versions = versions_text(_versions())
        if path:
            with open(path, "w", newline="") as f:
                csv.DictWriter(f, fieldnames=FIELDS + EXTRA).writeheader()

    def add(self, kernel, M, N, K, ms, base, **extra):
        entry = kernel.split(":")[0]
        lesson = registry.get(entry).lesson if entry in registry.names() else 0
        row = {"kernel": kernel, "lesson": lesson, "dtype": "float16", "M": M, "N": N,
               "K": K, "ms": "" if ms is None else f"{ms:.6f}",
               "baseline_ms": "" if base is None else f"{base:.6f}",
               "device": self.device, "versions": self.versions, "layout": "",
               "prepare_ms": "", "status": "ok", "run": self.run}
        row.update({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in extra.items()})
        self.rows.append(row)
        if self.path:
            with open(self.path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=FIELDS + EXTRA).writerow(row)
        ratio = "" if not (ms and base) else f"  {base / ms:.2f}x"
        print(f"  {kernel:42s} {M}x{N}x{K} {row['layout']:3s} "
              f"{row['ms']:>10s} ms vs {row['baseline_ms']:>10s}{ratio} {row['status']}",
              flush=True)


def checked(fn, ref, x, b):
    """Whether ``fn()`` (NaN-poisoned output inside) computes ``ref``, and why not."""
    try:
        got = fn()
        torch.cuda.synchronize()
    except Exception as exc:                          # reported in the CSV, and timing skips
        return f"error: {type(exc).__name__}: {str(exc)[:120]}"
    ok, rel, _ = harness.compare(got, ref, x, b, x.dtype)
    return "ok" if ok else f"wrong: relative error {rel:.1e}"


def part_host(w, size=64):
    from launch_cost import host_ms
    M = N = K = size
    ops, base = {}, {}
    # the torch call's host time is measured again beside each kernel's (warmed up first):
    # both see the same state of the host
    for dtype in (torch.float16, torch.float32):     # fp32: the SIMT kernels of 01-04
        x, W, b, bias = operands(M, N, K, "row", dtype=dtype)
        ops[dtype] = (x, W, b, bias)

        def mm(x=x, b=b):
            with harness._fp32_ieee():
                for _ in range(20):
                    torch.mm(x, b)
                return host_ms(lambda: torch.mm(x, b))
        base[dtype] = mm
    x, W, b, bias = ops[torch.float16]
    wt = W.t()

    def base_eager():
        for _ in range(20):
            F.gelu(F.linear(x, W, bias))
        return host_ms(lambda: F.gelu(F.linear(x, W, bias)))
    names = [e.name for e in registry.entries() if gl.runs_here(e.name)
             and e.scaled is None] + ["auto"]          # FP8 kernels: tools/sweep_fp8.py
    for name in names:
        entry = None if name == "auto" else registry.get(name)
        dtype = torch.float16 if entry is None or torch.float16 in entry.dtypes else torch.float32
        xx, _, bb, _ = ops[dtype]
        for _ in range(3):
            gl.matmul(xx, bb, name)
        p = gl.prepare(name, xx, bb)
        direct, prepared = host_ms(lambda: gl.matmul(xx, bb, name)), host_ms(p)
        w.add(f"{name}:host:mm", M, N, K, direct, base[dtype](), prepare_ms=prepared,
              status=p.mode, dtype=str(dtype).replace("torch.", ""))
        if entry is None or (entry.gemm is not None and {"bias", "activation"} <= entry.features):
            call = lambda: gl.gemm(x, wt, bias=bias, activation="gelu", kernel=name)
            for _ in range(3):
                call()
            w.add(f"{name}:host:eager", M, N, K, host_ms(call), base_eager())


def part_plain(w, shapes, batches, min_batch_ms, deadline):
    for M, N, K, layout in shapes:
        if time.perf_counter() > deadline:
            print("budget spent: stopping", flush=True)
            return
        x, W, b, _ = operands(M, N, K, layout)
        ref = harness.reference(x, b)
        fns, status = {}, {}
        for k in PLAIN:
            if k != "auto" and not gl.runs_here(k):
                continue
            out = torch.empty(M, N, dtype=DTYPE, device="cuda")

            def poisoned(k=k, out=out):
                out.fill_(float("nan"))
                return gl.matmul(x, b, k, out=out)
            status[k] = checked(poisoned, ref, x, b)
            if status[k] == "ok":
                fns[k] = (lambda k=k: gl.matmul(x, b, k))
        fns["mm"] = lambda: torch.mm(x, b)
        ms = harness.time_cuda_many(fns, batches=batches, min_batch_ms=min_batch_ms)
        for k in status:
            w.add(f"{k}:direct:mm", M, N, K, ms.get(k), ms["mm"], layout=layout,
                  status=status[k] if k != "auto" else gl.auto_kernel(x, b))
        if status.get("auto") != "ok":
            continue
        p = gl.prepare("auto", x, b)
        out = torch.empty(M, N, dtype=DTYPE, device="cuda")
        pm = harness.time_cuda_many({"p": p, "mm": lambda: torch.mm(x, b, out=out)},
                                    batches=batches, min_batch_ms=min_batch_ms)
        w.add("auto:prepare:mm", M, N, K, pm["p"], pm["mm"], layout=layout, status=p.mode)
        try:
            gm = harness.time_cuda_many({"auto": fns["auto"], "mm": fns["mm"]}, graph=True,
                                        batches=batches, min_batch_ms=min_batch_ms)
            w.add("auto:graph:mm", M, N, K, gm["auto"], gm["mm"], layout=layout,
                  status=gl.auto_kernel(x, b))
        except RuntimeError as exc:
            w.add("auto:graph:mm", M, N, K, None, None, layout=layout,
                  status=f"error: {str(exc)[:120]}")


def part_fused(w, shapes, batches, min_batch_ms, deadline):
    eager = lambda x, W, bias: F.gelu(F.linear(x, W, bias))
    compiled = torch.compile(eager, dynamic=True)
    for M, N, K, layout in shapes:
        if time.perf_counter() > deadline:
            print("budget spent: stopping", flush=True)
            return
        x, W, b, bias = operands(M, N, K, layout)
        ref = F.gelu(x.double() @ b.double() + bias.double())
        fns, status = {}, {}
        for k in FUSED:
            if k != "auto" and not gl.runs_here(k):
                continue
            call = (lambda k=k: gl.gemm(x, b, bias=bias, activation="gelu", kernel=k))
            try:
                got = call()
                torch.cuda.synchronize()
                rel = ((got.double() - ref).norm() / ref.norm()).item()
                status[k] = "ok" if rel < 2e-3 else f"wrong: relative error {rel:.1e}"
            except Exception as exc:              # reported in the CSV, and timing skips
                status[k] = f"error: {type(exc).__name__}: {str(exc)[:120]}"
            if status[k] == "ok":
                fns[k] = call
        fns["eager"] = lambda: eager(x, W, bias)
        fns["compile"] = lambda: compiled(x, W, bias)
        ms = harness.time_cuda_many(fns, batches=batches, min_batch_ms=min_batch_ms)
        for k in status:
            for base in ("eager", "compile"):
                w.add(f"{k}:direct:{base}", M, N, K, ms.get(k), ms[base], layout=layout,
                      status=status[k] if k != "auto" else gl.auto_kernel(x, b, fused=True))
        if "auto" in fns:
            try:
                gm = harness.time_cuda_many({k: fns[k] for k in ("auto", "eager", "compile")},
                                            graph=True, batches=batches,
                                            min_batch_ms=min_batch_ms)
                for base in ("eager", "compile"):
                    w.add(f"auto:graph:{base}", M, N, K, gm["auto"], gm[base], layout=layout,
                          status=gl.auto_kernel(x, b, fused=True))
            except RuntimeError as exc:
                w.add("auto:graph:eager", M, N, K, None, None, layout=layout,
                      status=f"error: {str(exc)[:120]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", help="write the rows here (the results format)")
    ap.add_argument("--part", nargs="+", default=["host", "plain", "fused"],
                    choices=["host", "plain", "fused"])
    ap.add_argument("--random", type=int, default=30, help="random shapes besides the suite")
    ap.add_argument("--no-suite", action="store_true", help="the random shapes only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", nargs="+", metavar="MxNxK", type=shape_arg,
                    help="time these shapes instead of the suite and the random set")
    ap.add_argument("--run", default="", help="a label for this run (the CSV's run column)")
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--min-batch-ms", type=float, default=10.0)
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="seconds for the timed parts, shared evenly: a part stops starting "
                         "new shapes when its share is spent")
    ap.add_argument("--summary", metavar="CSV", help="print the targets' figures from a "
                    "recording (no GPU needed) and exit")
    args = ap.parse_args(argv)
    if args.summary:
        from gemm_lessons.labs import front_door as lab
        lab.summary(args.summary)
        return 0
    if gl.backend() != "cuda":
        raise SystemExit("front_door.py times calls on a GPU; this machine has none "
                         "(need a CUDA GPU)")
    suite = [] if args.no_suite else list(SHAPES_LLM)
    rand = random_shapes(args.random, args.seed)
    if args.shape:          # chosen shapes: each with B row-major and as W.t()
        suite, rand = [], [(M, N, K, lay) for M, N, K in args.shape for lay in ("row", "wt")]
    w = Writer(args.csv, args.run)
    print(f"{gl.engine()}; {len(suite)} suite shapes, {len(rand)} random", flush=True)
    if "host" in args.part:
        part_host(w)
    timed = [p for p in args.part if p != "host"]
    for part in timed:       # the budget is shared evenly by the parts that time shapes
        deadline = time.perf_counter() + args.budget_s / len(timed)
        if part == "plain":       # the suite with B row-major, as torch.mm takes it
            part_plain(w, [(M, N, K, "row") for M, N, K in suite] + rand, args.batches,
                       args.min_batch_ms, deadline)
        else:                     # the suite with nn.Linear's weight, W.t()
            part_fused(w, [(M, N, K, "wt") for M, N, K in suite] + rand, args.batches,
                       args.min_batch_ms, deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
