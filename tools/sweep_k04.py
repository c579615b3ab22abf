"""Lessons 02-04 on a GPU: check, then time, every SIMT fp32 kernel and a set of lesson-04
configurations against cuBLAS SGEMM (TF32 off), in one process.

    python tools/sweep_k04.py                 # everything (a few minutes on an H200)
    python tools/sweep_k04.py --quick         # registered kernels only
    python tools/sweep_k04.py --only t8x16    # configurations whose name contains "t8x16"
    python tools/sweep_k04.py --quick --kernels k04_prefetch \
        --csv gemm_lessons/results/h200_ladder.csv   # record these kernels' rows (others kept)
    python tools/sweep_k04.py --ncu           # one launch of each lesson-03/04 kernel, for ncu:

    ncu --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,\\
    l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,\\
    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,smsp__inst_executed_op_shared_ld.sum \\
        python tools/sweep_k04.py --ncu

What it does:
1. checks every registered lesson-02..04 kernel on the shape suite (GPU sizes);
2. for every configuration below (a lesson-04 step with other tile sizes): builds it,
   checks it on three awkward shapes, reads registers/spills/shared memory from the compiled kernel and the blocks
   per SM they allow;
3. times everything at 4096 and 8192 (fp32) with CUDA events, cuBLAS (TF32 off) timed
   before and after each size's kernels in the same process (the ratio uses their mean);
4. prints the table last: TFLOP/s and the ratio to cuBLAS (> 1: faster than cuBLAS);
5. with ``--csv``, writes the registered kernels' rows into that results CSV (the rows of
   other kernels and sizes stay), as ``python -m gemm_lessons ladder`` records them.
"""
from __future__ import annotations

import argparse
import platform
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402

from gemm_lessons import harness  # noqa: E402
from gemm_lessons.kernels import k04_register_tiling as k04  # noqa: E402

STEP = {k.name: k for k in k04.KERNELS}     # name -> registry entry (launch, source factory)

T0 = time.time()
SIZES = (4096, 8192)
LESSON_KERNELS = ["k02_smem_tiling", "k03_bank_conflicts", "k03_padded"] + list(STEP)
SLOW = {"k02_smem_tiling", "k03_bank_conflicts", "k03_padded", "k04_1d_tiling"}

# (step, tile sizes): the registered ones are k04_tiles.GPU_CONFIGS; these try other shapes
# of the block, warp and thread tiles with the last two steps' loops.
CONFIGS = [
    ("k04_double_buffer", dict(BM=128, BN=128, BK=8, WM=64, WN=64, TM=16, TN=8)),
    ("k04_register_tiling", dict(BM=128, BN=128, BK=8, WM=64, WN=64, TM=16, TN=8)),
    ("k04_register_tiling", dict(BM=256, BN=128, BK=8, WM=64, WN=64, TM=16, TN=8)),
    ("k04_register_tiling", dict(BM=128, BN=256, BK=8, WM=64, WN=64, TM=16, TN=8)),
    ("k04_register_tiling", dict(BM=128, BN=128, BK=8, WM=64, WN=64, TM=8, TN=16)),
    ("k04_register_tiling", dict(BM=128, BN=256, BK=8, WM=64, WN=64, TM=8, TN=16)),
    ("k04_register_tiling", dict(BM=128, BN=128, BK=16, WM=64, WN=32, TM=8, TN=8)),
]


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def name_of(step, cfg):
    return (f"{step} {cfg['BM']}x{cfg['BN']}x{cfg['BK']} w{cfg['WM']}x{cfg['WN']} "
            f"t{cfg['TM']}x{cfg['TN']}")


def resources(kernel):
    """(registers, spill bytes, shared bytes, blocks per SM) of a compiled numba kernel."""
    kern = next(iter(kernel.overloads.values()))
    regs = kern.regs_per_thread
    smem = kern.shared_mem_per_block
    local = getattr(kern, "local_mem_per_thread", 0)
    threads = kernel.threads
    per_warp = (regs * 32 + 255) // 256 * 256
    by_regs = 65536 // (per_warp * (threads // 32))
    by_smem = 233472 // (smem + 1024)
    return regs, local, smem, min(by_regs, by_smem, 2048 // threads, 32)


def sass_mix(kernel):
    """Instruction mix of the kernel's loops (needs nvdisasm on the PATH)."""
    try:
        sass = next(iter(kernel.overloads.values())).inspect_sass()
    except Exception as exc:  # noqa: BLE001
        return f"(no SASS: {type(exc).__name__})"
    ops = Counter()
    for line in sass.splitlines():
        m = re.search(r"\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(2)] += 1
    keys = ("FFMA", "LDS", "LDG", "STS", "BAR", "LDL", "STL")
    return f"{sum(ops.values())} instructions; " + ", ".join(f"{k} {ops.get(k, 0)}" for k in keys)


def quick_check(run, name):
    cases = [harness.Case("ragged", 1003, 1001, 997, hint="edges, K not a multiple of 4"),
             harness.Case("A transposed", 520, 384, 264, a="transposed", hint="copy path"),
             harness.Case("aligned", 1024, 768, 512, hint="basic indexing")]
    rep = harness.check(run, name, (torch.float32,), cases, raise_on_fail=False)
    return rep.ok, str(rep)


def time_one(run, a, b, out, slow):
    if slow:   # seconds per call at 8192: fewer, shorter batches
        return harness.time_cuda(lambda: run(a, b, out), min_batch_ms=1.0, batches=3, warmup=1)
    return harness.time_cuda(lambda: run(a, b, out))


NCU_KERNELS = ["k03_bank_conflicts", "k03_padded", "k04_2d_tiling", "k04_vectorized",
               "k04_warp_tiling", "k04_thread_tile", "k04_prefetch", "k04_double_buffer",
               "k04_register_tiling"]


def ncu_mode():
    """One launch of each kernel whose shared-memory traffic the lessons discuss."""
    n = 1024
    a, b = harness.make_operands(n, n, n)
    out = torch.empty(n, n, device="cuda")
    for name in NCU_KERNELS:
        gl.matmul(a, b, name, out=out)       # compile (and a first launch)
        torch.cuda.synchronize()
        log(f"launched {name} at {n}")
    print("kernel names in ncu: column_walk (k03, PAD=0 first, then PAD=1), tiling_2d, "
          "vectorized, warp_tiling, thread_tile, prefetch, double_buffer, register_tiling; each "
          "appears "
          "twice (compile launch + timed launch)")
    for name in NCU_KERNELS:
        gl.matmul(a, b, name, out=out)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="registered kernels only")
    ap.add_argument("--only", default=None, help="k04 configs whose name contains this")
    ap.add_argument("--ncu", action="store_true", help="launch each kernel once, for ncu")
    ap.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    ap.add_argument("--kernels", nargs="*", default=None,
                    help="registered kernels to check and time (default: lessons 02-04's)")
    ap.add_argument("--csv", default=None,
                    help="write the registered kernels' rows into this results CSV")
    args = ap.parse_args()
    unknown = sorted(set(args.kernels or ()) - set(LESSON_KERNELS))
    if unknown:
        sys.exit(f"not a lesson 02-04 kernel: {', '.join(unknown)}")
    if gl.engine().kind != "cuda":
        sys.exit("this sweep needs a CUDA GPU (it times kernels against cuBLAS)")
    import numba
    nc = getattr(sys.modules.get("numba.cuda"), "__version__", "?")
    log(f"{gl.engine()}; torch {torch.__version__}, numba {numba.__version__}, "
        f"numba-cuda {nc}, CUDA {torch.version.cuda}")
    if args.ncu:
        return ncu_mode()

    # 1. registered kernels on the shape suite
    names = [] if args.only else list(args.kernels or LESSON_KERNELS)
    for name in list(names):
        t = time.time()
        try:
            log(f"{gl.check(name)}  ({time.time() - t:.0f} s with compilation)")
        except Exception as exc:  # noqa: BLE001 - report and go on
            log(f"{name}: CHECK FAILED: {type(exc).__name__}: {str(exc)[:1500]}")
            names.remove(name)

    # 2. k04 configurations: build, check, resources
    configs = [] if args.quick else [(s, c) for s, c in CONFIGS
                                     if args.only is None or args.only in name_of(s, c)]
    runs = []
    for step, cfg in configs:
        name = name_of(step, cfg)
        run = (lambda f, c: lambda a, b, out: f(a, b, out, **c))(STEP[step].launch, cfg)
        t = time.time()
        try:
            ok, msg = quick_check(run, name)
        except Exception as exc:  # noqa: BLE001
            log(f"{name}: FAILED to build or run: {type(exc).__name__}: {str(exc)[:800]}")
            continue
        kernel = STEP[step].source(**cfg)
        regs, local, smem, blocks = resources(kernel)
        log(f"{name}: {msg} ({time.time() - t:.0f} s); {kernel.threads} threads, {regs} "
            f"registers, {local} B local (spills), {smem} B shared, {blocks} block(s)/SM; "
            f"{sass_mix(kernel)}")
        if ok:
            runs.append((name, run, False))

    # 3. timings
    runs = [(n, (lambda n: lambda a, b, out: gl.matmul(a, b, n, out=out))(n), n in SLOW)
            for n in names] + runs
    rows, recorded = [], []
    for size in args.sizes:
        a, b = harness.make_operands(size, size, size)
        out = torch.empty(size, size, device="cuda")
        ref = torch.empty_like(out)
        cublas = lambda: harness.cublas_matmul(a, b, ref)  # noqa: E731
        before = harness.time_cuda(cublas)
        times = []
        for name, run, slow in runs:
            try:
                times.append((name, time_one(run, a, b, out, slow)))
            except Exception as exc:  # noqa: BLE001
                log(f"{name} at {size}: timing FAILED: {type(exc).__name__}: {str(exc)[:300]}")
        after = harness.time_cuda(cublas)
        base = (before + after) / 2
        log(f"cuBLAS {size}: {harness.tflops(size, size, size, before):.1f} TFLOP/s before, "
            f"{harness.tflops(size, size, size, after):.1f} after")
        for name, ms in times:
            rows.append((name, size, ms, harness.tflops(size, size, size, ms),
                         harness.tflops(size, size, size, base), base / ms))
            recorded.append((name, size, ms, base))
        del a, b, out, ref
        torch.cuda.empty_cache()

    # 4. the table
    print()
    print(f"| kernel / config | size | ms | TFLOP/s | cuBLAS TFLOP/s | ratio |")
    print("|---|---|---|---|---|---|")
    for name, size, ms, tf, btf, ratio in rows:
        print(f"| {name} | {size} | {ms:.3f} | {tf:.1f} | {btf:.1f} | {ratio:.2f} |")
    best = {}
    for name, size, ms, tf, btf, ratio in rows:
        if name.startswith("k04_register_tiling"):
            if size not in best or ratio > best[size][1]:
                best[size] = (name, ratio)
    for size, (name, ratio) in sorted(best.items()):
        print(f"best at {size}: {name} ({ratio:.2f}x cuBLAS)")
    if args.csv:
        write_rows(args.csv, [r for r in recorded if r[0] in names])
    log("done")


def write_rows(path, recorded):
    """Merge (kernel, size, ms, cuBLAS ms) rows of registered kernels into a results CSV."""
    from importlib import metadata
    from gemm_lessons import registry, results
    versions = {"python": platform.python_version()}
    for pkg in ("torch", "triton", "numba", "numba-cuda", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    new = [results.row(name, registry.get(name).lesson, torch.float32, n, n, n, ms, base,
                       device=gl.engine().device_name, versions=versions)
           for name, n, ms, base in recorded]
    kept = results.merge_csv(path, new)
    log(f"wrote {len(new)} rows to {path} ({kept} other rows kept)")


if __name__ == "__main__":
    main()
