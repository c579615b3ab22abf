"""Host cost per call of the course's kernels against torch.mm, in one run (needs a GPU).

    python tools/launch_cost.py                                  # every kernel here, 64^3
    python tools/launch_cost.py --size 64 4096 --csv gemm_lessons/results/h200_launch_cost.csv
    python tools/launch_cost.py --kernel k07_triton_swizzle k06_wgmma --profile
    python tools/launch_cost.py --size 16x4096x4096 --kernel k07_triton_swizzle   # M x N x K

For each kernel and size, each way of calling it is timed:

* ``matmul``   - ``gl.matmul(a, b, kernel)``: checks, a new output, the launcher;
* ``launcher`` - the registered launcher alone (``entry.launch(a, b, c)``, no checks);
* ``prepared`` - ``p()`` with ``p = gl.prepare(kernel, a, b)``;
* ``graph``    - ``p()`` with ``p = gl.prepare(kernel, a, b, graph=True)`` (a CUDA graph);

and, in the same run, ``torch.mm(a, b)`` and a CUDA graph of it. Three times per call:

* host: the wall clock of ``--calls`` calls queued without waiting for the GPU, per call
  (the median of ``--repeats`` such loops): what the CPU spends to get a call queued;
* GPU: CUDA events around one call issued while the GPU is kept busy, so that the host's
  part hides behind the queue: what the GPU spends (median of 20);
* batched: the benchmark's time per call (``harness.time_cuda``: back-to-back calls), the
  larger of the two when one hides the other.

When the host time exceeds the GPU time, calls one after the other leave the GPU idle
between kernels: the product is bounded by Python, not by the GPU.

``--csv`` writes one row per (way of calling, kernel, size) in the columns of the ladder's
CSV, so that ``gemm_lessons.results.figure`` quotes them: ``kernel`` is ``NAME`` for
``gl.matmul``, ``NAME:launcher``, ``NAME:prepared``, ``NAME:graph`` for the others,
``NAME:gpu`` for the GPU time of one launch, ``torch.mm``, ``torch.mm:graph``,
``torch.mm:gpu``; ``ms`` is its host time per call (the GPU time in ``:gpu`` rows) and
``baseline_ms`` the same for ``torch.mm`` in this run, so ``ratio`` is torch.mm's time over
this one and ``times_baseline`` this one over torch.mm's. Extra columns: ``gpu_ms``,
``batched_ms``, ``mode`` (what a prepared call does: ``replay``, ``launcher`` or ``graph``).
``--profile`` prints where the host time of a ``gl.matmul`` call goes (cProfile).
"""
from __future__ import annotations

import argparse
import cProfile
import csv
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402

from gemm_lessons import harness, registry  # noqa: E402
from gemm_lessons.__main__ import _versions  # noqa: E402
from gemm_lessons.common import dtype_name  # noqa: E402
from gemm_lessons.results import FIELDS, versions_text  # noqa: E402
from gemm_lessons.shapes import shape_arg  # noqa: E402

PATHS = ("matmul", "launcher", "prepared", "graph")
EXTRA = ["gpu_ms", "batched_ms", "mode"]


def gpu_ms(fn, reps=20):
    """Median GPU time of one ``fn()``: events recorded around it while a sleep kernel keeps
    the GPU busy, so the host's work to issue the call is over before the GPU reaches it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return statistics.median(out)


def host_ms(fn, calls=100, repeats=7):
    """Median over ``repeats`` loops of the wall-clock time per call of ``calls`` calls
    queued without waiting (the GPU starts idle; the queue holds far more than ``calls``)."""
    per_call = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t) * 1e3 / calls)
        torch.cuda.synchronize()
    return statistics.median(per_call)




def default_dtype(entry):
    return torch.float16 if torch.float16 in entry.dtypes else entry.dtypes[0]


def torch_graph(a, b):
    """``torch.mm(a, b)`` captured in a CUDA graph: the floor for one replay."""
    out = torch.mm(a, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.mm(a, b, out=out)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.mm(a, b, out=out)
    return g.replay


def callers(entry, a, b):
    """{way of calling: (function, mode)} for one kernel on a and b; a way that cannot be
    built here (a launch that a CUDA graph cannot capture) is left out with a note."""
    c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    found = {"matmul": (lambda: gl.matmul(a, b, entry.name), ""),
             "launcher": (lambda: entry.launch(a, b, c), "")}
    for path, graph in (("prepared", False), ("graph", True)):
        try:
            p = gl.prepare(entry.name, a, b, graph=graph)
            found[path] = (p, p.mode)
        except Exception as exc:    # reported, and the other ways are still measured
            print(f"  {entry.name}: no {path} call ({type(exc).__name__}: {exc})")
    ref = harness.reference(a, b)
    for path, (fn, _) in found.items():       # every way computes the product
        got = fn()
        got = c if got is None else got
        torch.cuda.synchronize()
        ok, rel, _ = harness.compare(got, ref, a, b, a.dtype)
        if not ok:
            sys.exit(f"{entry.name} via {path} is wrong (relative error {rel:.1e})")
    return found


def measure(fn, calls, repeats):
    """(host, GPU, batched) milliseconds per call of ``fn``. A slow kernel (a large size)
    gets fewer queued calls, about 100 ms of GPU work per loop: its host time is what is
    asked, not its GPU time again."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    gpu = gpu_ms(fn, reps=20 if gpu_ms(fn, reps=1) < 50 else 5)
    calls = max(5, min(calls, int(100 / max(gpu, 1e-3))))
    return host_ms(fn, calls, repeats), gpu, harness.time_cuda(fn)


def profile(entry, a, b, calls):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        gl.matmul(a, b, entry.name)
    prof.disable()
    torch.cuda.synchronize()
    print(f"--- {entry.name}: where the host time of {calls} gl.matmul calls goes")
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=shape_arg, nargs="+", default=[(64, 64, 64)],
                    help="M = N = K, or MxNxK (several: one table each; default 64)")
    ap.add_argument("--kernel", nargs="*", default=None,
                    help="registered names (default: every kernel this GPU runs)")
    ap.add_argument("--dtype", default=None,
                    help="float16, bfloat16 or float32 (default: float16 where the kernel "
                         "takes it, else its first dtype)")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--csv", default=None, help="write the rows here")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    if gl.engine().kind != "cuda":
        sys.exit("launch costs need a CUDA GPU (here: " + str(gl.engine()) + ")")
    names = args.kernel or [e.name for e in registry.entries() if gl.runs_here(e.name)]
    entries = [registry.get(n) for n in names]
    device, versions = gl.engine().device_name, _versions()
    ver = versions_text(versions)
    rows = []
    for shape in args.size:
        base = {}      # dtype -> torch.mm's (host, gpu, batched) and its graph's, this size
        table = []
        for entry in entries:
            dt = getattr(torch, args.dtype) if args.dtype else default_dtype(entry)
            if dt not in entry.dtypes:
                print(f"  {entry.name}: does not take {dtype_name(dt)}, skipped")
                continue
            M, N, K = shape
            a, b = harness.make_operands(M, N, K, dt)
            if dt not in base:
                mm = measure(lambda: torch.mm(a, b), args.calls, args.repeats)
                mm_graph = measure(torch_graph(a, b), args.calls, args.repeats)
                base[dt] = mm, mm_graph
                for name, t in (("torch.mm", mm), ("torch.mm:graph", mm_graph)):
                    table.append((name, dtype_name(dt), "", *t, mm[0]))
                    rows.append(row(name, 0, dt, shape, t[0], mm[0], t, "", device, ver))
                rows.append(row("torch.mm:gpu", 0, dt, shape, mm[1], mm[1], mm, "", device, ver))
            mm = base[dt][0]
            found = callers(entry, a, b)
            gpu = None
            for path in PATHS:
                if path not in found:
                    continue
                fn, mode = found[path]
                t = measure(fn, args.calls, args.repeats)
                gpu = t[1] if path == "launcher" else gpu
                name = entry.name if path == "matmul" else f"{entry.name}:{path}"
                table.append((name, dtype_name(dt), mode, *t, mm[0]))
                rows.append(row(name, entry.lesson, dt, shape, t[0], mm[0], t, mode, device, ver))
            rows.append(row(f"{entry.name}:gpu", entry.lesson, dt, shape, gpu, mm[1],
                            (gpu, gpu, None), "", device, ver))
            if args.profile:
                profile(entry, a, b, args.calls)
        print(f"\n{gl.engine()}; M x N x K = {'x'.join(map(str, shape))}; host time: {args.calls} calls queued, "
              f"median of {args.repeats}")
        print(f"{'call':32s} {'dtype':8s} {'mode':8s} {'host us':>8s} {'GPU us':>8s} "
              f"{'batched us':>10s} {'host / torch.mm':>15s}")
        for name, dt, mode, h, g, batched, ref in table:
            print(f"{name:32s} {dt:8s} {mode:8s} {h * 1e3:8.1f} {g * 1e3:8.1f} "
                  f"{batched * 1e3:10.1f} {h / ref:15.2f}")
    print("versions: " + ver)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS + EXTRA)
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {len(rows)} rows to {args.csv}")


def row(name, lesson, dtype, shape, ms, baseline_ms, times, mode, device, versions):
    host, gpu, batched = times
    fmt = lambda x: "" if x is None else f"{x:.6f}"
    return {"kernel": name, "lesson": lesson, "dtype": dtype_name(dtype), "M": shape[0],
            "N": shape[1], "K": shape[2], "ms": fmt(ms), "baseline_ms": fmt(baseline_ms), "device": device,
            "versions": versions, "gpu_ms": fmt(gpu), "batched_ms": fmt(batched),
            "mode": mode}


if __name__ == "__main__":
    main()
