"""Host cost of launching the numba kernels, against their GPU time (needs a GPU).

    python tools/launch_cost.py                      # k04, k06 and k06_wgmma at 4096
    python tools/launch_cost.py --size 2048 --profile

For each kernel: the GPU time of one launch (CUDA events around it, median of 20), the host
time of one call of its launcher (wall clock over 50 calls queued without waiting), and the
time per call when the calls are timed back to back as the benchmark does. When the host
takes longer than the GPU, the GPU waits for Python between launches and the benchmark
measures the host. ``--profile`` prints where a launcher's host time goes (cProfile).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402

from gemm_lessons import harness, registry  # noqa: E402

KERNELS = ["k04_register_tiling", "k06_cp_async", "k06_wgmma"]


def gpu_ms(fn, reps=20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)    # keep the GPU busy while the host prepares the launch
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return statistics.median(out)


def host_ms(fn, calls=50):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) * 1e3 / calls
    torch.cuda.synchronize()
    return host


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--kernel", nargs="*", default=KERNELS)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if gl.engine().kind != "cuda":
        sys.exit("launch costs need a CUDA GPU")
    n = args.size
    rows = []
    for name in args.kernel:
        e = registry.get(name)
        dt = e.dtypes[0]
        a, b = harness.make_operands(n, n, n, dt)
        c = torch.empty(n, n, dtype=dt, device="cuda")
        fn = (lambda e, a, b, c: lambda: e.launch(a, b, c))(e, a, b, c)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        g, h = gpu_ms(fn), host_ms(fn)
        batch = harness.time_cuda(fn)
        rows.append((name, g, h, batch))
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(50):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            print(f"--- {name}: host time of 50 launches")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(18)
    print(f"\n{gl.engine()}; M = N = K = {n}")
    print(f"{'kernel':22s} {'GPU ms':>8s} {'host ms':>8s} {'batched ms':>10s}")
    for name, g, h, batch in rows:
        print(f"{name:22s} {g:8.3f} {h:8.3f} {batch:10.3f}")


if __name__ == "__main__":
    main()
