"""Lesson 06, the order of the tiles: time the persistent kernels of steps 8 and 9 with the
grid walking its tiles row by row and in groups of GROUP_M tile rows, against cuBLAS fp16.

    python tools/sweep_k06_order.py --out gemm_lessons/results/h200_k06_order.csv
    python tools/sweep_k06_order.py --dry-run --out /tmp/order.csv   # CPU: the simulator

What it does, in one process, printing its progress:

1. for each size (4096, then 8192; fp16, M = N = K), each kernel (``k06_tma_store`` and
   ``k06_pingpong``; ``--kernels`` may add ``k06_cluster``, step 10,
   and ``k06_cluster_fenced``, step 10 with its releases at cluster scope) and each ``GROUP_M``
   (``--groups``, default 1 8 16; 1 is the row-major order), builds the kernel with that
   order (``config=dict(GROUP_M=g)``, the kernel's GPU configuration otherwise) and checks
   its product, into an output filled with NaN, against float64 (``harness.compare``); a
   wrong product is reported and not timed;
2. times every checked variant and cuBLAS (``torch.mm`` of the same operands), batches
   interleaved in one ``harness.time_cuda_many`` call: once as calls (the host's cost
   included) and once replayed from CUDA graphs (GPU time alone). A call here is the
   module's ``run(config=...)``: the launcher's Python (its checks, the configuration,
   numba's dispatch on the arguments' types) on every call, where ``gl.matmul`` replays a
   launch plan (``gemm_lessons.fastpath``). Where the product takes a few tenths of a
   millisecond (4096) the direct column carries that host time, so compare kernels on the
   graph column and time the user's call with ``python -m gemm_lessons ladder``;
3. writes the rows so far to ``--out`` after each size (``gemm_lessons.results`` format):
   ``kernel`` is ``k06_tma_store:g8`` for GROUP_M = 8 called directly and
   ``k06_tma_store:g8:graph`` for its graph replays, ``baseline_ms`` cuBLAS's time in the
   same call.

Under four minutes on an H200, most of it compiling six kernels. With ``--dry-run`` (no
GPU): the simulator's configurations on a 192 x 128 x 64 product on one block (4 tiles of
step 8, 6 of step 9), one call each timed by a wall clock (its figures mean nothing: the
code paths run).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402

from gemm_lessons import harness, results  # noqa: E402
from gemm_lessons.__main__ import _versions  # noqa: E402
from gemm_lessons.kernels import k06_cluster, k06_pingpong, k06_tma_store  # noqa: E402

T0 = time.time()
#: row name -> (the kernel's module, the configuration it always takes);
#: k06_cluster_fenced is step 10 with its releases at cluster scope (RELEASE='cluster': a
#: MEMBAR.ALL.GPU before each)
KERNELS = {"k06_tma_store": (k06_tma_store, {}), "k06_pingpong": (k06_pingpong, {}),
           "k06_cluster": (k06_cluster, {}),
           "k06_cluster_fenced": (k06_cluster, {"RELEASE": "cluster"})}
DEFAULT_KERNELS = ["k06_tma_store", "k06_pingpong"]
DTYPE = torch.float16


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).parent).stdout.strip() or "?"
    except OSError:
        return "?"


def timer(dry):
    """The harness's interleaved timer on a GPU; with --dry-run a wall clock over one call
    each."""
    if not dry:
        return harness.time_cuda_many

    def cpu_many(fns, graph=False, **_):
        out = {}
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            out[k] = (time.perf_counter() - t) * 1e3
        return out
    return cpu_many


def variants(groups, blocks, kernels=DEFAULT_KERNELS):
    """{row name: (module, config overrides, blocks)} for every kernel and order."""
    return {f"{name}:g{g}": (KERNELS[name][0], dict(KERNELS[name][1], GROUP_M=g), blocks)
            for name in kernels for g in groups}


def checked_calls(M, N, K, groups, blocks, dev, kernels=DEFAULT_KERNELS):
    """{row name: call} of every variant whose product is right on this shape (checked
    first, into an output filled with NaN, against float64), and cuBLAS as ``cublas``."""
    a, b = harness.make_operands(M, N, K, DTYPE, seed=0, device=dev)
    ref = harness.reference(a, b)
    calls = {}
    for name, (module, cfg, nblocks) in variants(groups, blocks, kernels).items():
        out = torch.full((M, N), float("nan"), dtype=DTYPE, device=dev)

        def call(module=module, cfg=cfg, out=out, nblocks=nblocks):
            module.run(a, b, None, out, config=cfg, blocks=nblocks)
        try:
            call()
            ok, rel, _ = harness.compare(out, ref, a, b, DTYPE)
        except Exception as e:  # noqa: BLE001 - reported, not timed
            log(f"  {name} {M}x{N}x{K}: FAILED to run: {type(e).__name__}: {str(e)[:200]}")
            continue
        log(f"  {name} {M}x{N}x{K}: {'correct' if ok else 'WRONG'} "
            f"(relative error {rel:.1e} against float64)")
        if ok:
            calls[name] = call
    if dev.type == "cuda":
        ref_out = torch.empty(M, N, dtype=DTYPE, device=dev)
        calls["cublas"] = lambda: harness.cublas_matmul(a, b, ref_out)
    return calls


def time_shape(M, N, K, groups, blocks, dev, timeit, dry, versions, device,
               kernels=DEFAULT_KERNELS):
    """Check, then time, every variant on an M x N x K product; returns the rows."""
    rows = []
    calls = checked_calls(M, N, K, groups, blocks, dev, kernels)
    for graph in ((False,) if dry else (False, True)):
        ms = timeit(calls, graph=graph)
        tag = ":graph" if graph else ""
        how = "CUDA-graph replays" if graph else "direct calls"
        base = ms.get("cublas", float("nan"))          # none in a dry run
        for name, t in ms.items():
            if name != "cublas":
                rows.append(results.row(f"{name}{tag}", 6, DTYPE, M, N, K, t, base,
                                        device=device,
                                        versions=f"{versions}; baseline torch.mm ({how})"))
        flops = 2.0 * M * N * K
        log(f"{M}x{N}x{K}, {how}, TFLOP/s: " + "  ".join(
            f"{k} {flops / (t * 1e-3) / 1e12:.0f}" for k, t in ms.items()))
        if not dry:
            log(f"{M}x{N}x{K}, {how}, ratio to cuBLAS: " + "  ".join(
                f"{k} {base / t:.3f}" for k, t in ms.items() if k != "cublas"))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the CSV to write (gemm_lessons.results format)")
    p.add_argument("--groups", type=int, nargs="+", default=[1, 8, 16],
                   help="GROUP_M values to time (1: row-major)")
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--kernels", nargs="+", default=DEFAULT_KERNELS, choices=sorted(KERNELS),
                   help="the kernels to time (k06_cluster: step 10, clusters of two; "
                        "k06_cluster_fenced: step 10 with cluster-scope releases)")
    p.add_argument("--dry-run", action="store_true",
                   help="on the CPU: the simulator on one small product, wall-clock times")
    args = p.parse_args(argv)
    dry = args.dry_run
    on_gpu = gl.backend() == "cuda"
    if not on_gpu and not dry:
        print("sweep_k06_order times kernels on a Hopper GPU; here there is none: use "
              "--dry-run to run its code paths on the simulator", file=sys.stderr)
        return 2
    if on_gpu and not gl.runs_here("k06_tma_store"):
        print(f"{gl.engine()}: the kernels need compute capability 9.0", file=sys.stderr)
        return 2
    dev = gl.device()
    device = gl.engine().device_name if on_gpu else "cpu (dry run: the simulator)"
    versions = (f"{results.versions_text(_versions())}; tools/sweep_k06_order.py "
                f"(commit {commit()})")
    # a dry run: one product of several tiles per block (the simulator's tiles are
    # narrower), so that the order matters to which block computes which tile
    shapes, blocks = ([(192, 128, 64)], 1) if dry else ([(n, n, n) for n in args.sizes], None)
    timeit = timer(dry)
    rows = []
    log(f"{device}; shapes {shapes}; GROUP_M {args.groups}; {', '.join(args.kernels)}")
    for M, N, K in shapes:
        try:
            rows += time_shape(M, N, K, args.groups, blocks, dev, timeit, dry, versions, device,
                               args.kernels)
        except Exception:  # noqa: BLE001 - report and go on
            log(f"FAILED at {M}x{N}x{K}:\n{traceback.format_exc(limit=4)}")
        results.merge_csv(args.out, rows, keep=False)      # what is done, kept at each step
    log(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
