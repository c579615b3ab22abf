"""Lessons 05-06 on a GPU: check, then time, the WMMA, cp.async and wgmma kernels against
cuBLAS.

    python tools/sweep_k05_k06.py              # checks, every config, table (~3 min)
    python tools/sweep_k05_k06.py --quick      # the registered configs only
    python tools/sweep_k05_k06.py --only "k06ms 128x256x32"   # configs by name (see the names)

Kinds: k05 (k05_wmma), k06db (k06_double_buffer), k06ms (k06_multistage), k06
(k06_cp_async: prefetched fragments), k06w (k06_wgmma).

What it does, in one process:
1. checks k05_wmma and the lesson-06 kernels on the shape suite (fp16 and bf16), and their
   BLAS epilogue through gl.gemm (alpha, beta; beta == 0 with NaN in C, alpha == 0 with NaN
   in A and B);
2. for every configuration below: builds it, checks it on three awkward shapes (ragged with
   K not a multiple of 8, a transposed operand, M = N = K aligned), reads registers and
   shared memory from the compiled kernel and works out the occupancy, then times it at
   4096 and 8192 (fp16) against cuBLAS of the same dtype, in this process;
3. times the best lesson-06 configuration and the registered ones in bf16 too;
4. prints the SASS instruction mix of each registered lesson-06 kernel's main loop when
   numba can disassemble (nvdisasm on the PATH), else says how to get it with cuobjdump;
5. prints the table last: TFLOP/s and the ratio to cuBLAS (> 1: faster).
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402

from gemm_lessons import harness  # noqa: E402
from gemm_lessons.kernels import k05_wmma as k05  # noqa: E402
from gemm_lessons.kernels import (k06_cp_async, k06_double_buffer,  # noqa: E402
                                  k06_multistage, k06_wgmma)

T0 = time.time()
SIZES = (4096, 8192)
LESSON6 = {"k06db": k06_double_buffer, "k06ms": k06_multistage, "k06": k06_cp_async,
           "k06w": k06_wgmma}
REGISTERED = {"k05": "k05_wmma", "k06db": "k06_double_buffer", "k06ms": "k06_multistage",
              "k06": "k06_cp_async", "k06w": "k06_wgmma"}

# (kind, config): k05 configs are dicts of BM, BN, BK, WM, WN; the lesson-06 WMMA kernels'
# are tc_common.PipelineConfig fields changed from the kernel's GPU_CONFIG; k06w's are
# WgmmaConfig fields (BM = 64 per warpgroup, BN = the N of each wgmma, BK = 64)
K05_CONFIGS = [
    dict(BM=128, BN=128, BK=32, WM=64, WN=32),
]
K06_CONFIGS = [
    ("k06db", dict(BK=32)),                          # two stages, 16-deep slices in pairs
    ("k06ms", dict(BK=32)),
    ("k06ms", dict(STAGES=3)),
    ("k06ms", dict(BN=128, BK=32)),                  # 4 warps, 2 blocks/SM
    ("k06", dict(BK=32)),
    ("k06", dict(STAGES=3)),
    ("k06", dict(BM=256, BN=128)),                   # tall block tile
    ("k06", dict(BM=256, BN=128, STAGES=3)),
    ("k06", dict(BN=128, STAGES=3)),                 # 2 blocks/SM
    ("k06w", dict(BM=128, BN=128, STAGES=4)),
    ("k06w", dict(BM=128, BN=128, STAGES=3)),        # 96 KiB: 2 blocks per SM
    ("k06w", dict(BM=256, BN=128, STAGES=4)),        # 4 warpgroups
    ("k06w", dict(BM=128, BN=256, STAGES=3)),
    ("k06w", dict(BM=64, BN=128, STAGES=4)),         # 1 warpgroup, 2 blocks per SM
]


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def dt(d):
    return str(d).replace("torch.", "")


def full_config(kind, cfg):
    """The whole configuration: k05's dict, or the lesson-06 kernel's config object."""
    if kind == "k05":
        return dict(k05.GPU_CONFIG, **cfg)
    return LESSON6[kind].GPU_CONFIG.replace(**cfg)


def name_of(kind, cfg):
    c = full_config(kind, cfg)
    if kind == "k06w":
        return f"k06w {c.BM}x{c.BN}x64/s{c.STAGES}"
    if kind == "k05":
        return f"k05 {c['BM']}x{c['BN']}x{c['BK']}/{c['WM']}x{c['WN']}"
    return f"{kind} {c.BM}x{c.BN}x{c.BK}/{c.WM}x{c.WN}/s{c.STAGES}/g{c.GROUP_M}"


def runner(kind, cfg):
    if kind == "k05":
        return lambda a, b, out: k05.wmma(a, b, out, config=cfg)
    module = LESSON6[kind]
    return lambda a, b, out: module.run(a, b, None, out, config=cfg)


def kernel_of(kind, cfg, dtype):
    """The very kernel object the runner launches (make_kernel is cached on its
    arguments: another spelling builds another, never-launched object)."""
    bf16 = dtype == torch.bfloat16
    if kind == "k05":
        return k05.make_kernel(**dict(k05._config(), **cfg), bf16=bf16, b_layout="row")
    return LESSON6[kind].kernel_for(cfg, bf16)


def resources(kernel, threads, dyn_smem):
    """(registers, shared bytes per block, blocks per SM, occupancy %) of a launched kernel
    on this GPU (H100/H200 limits: 64K registers, 228 KiB shared per SM, 1 KiB reserved
    per block, 2048 threads, 32 blocks)."""
    if not kernel.overloads:     # this exact kernel object was not launched: nothing to read
        return 0, dyn_smem, 0, 0.0
    kern = next(iter(kernel.overloads.values()))
    regs = kern.regs_per_thread
    smem = kern.shared_mem_per_block + dyn_smem
    props = torch.cuda.get_device_properties(0)
    regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    warps = threads // 32
    per_warp = (regs * 32 + 255) // 256 * 256
    by_regs = regs_sm // (per_warp * warps) if regs else 32
    by_smem = smem_sm // (smem + 1024) if smem else 32
    blocks = min(by_regs, by_smem, 2048 // threads, 32)
    return regs, smem, blocks, 100.0 * blocks * threads / 2048


def time_sizes(run, name, dtype):
    """Time ``run`` at every size in SIZES, cuBLAS beside it (batches interleaved). Yields
    the BenchResults."""
    for n in SIZES:
        res = harness.bench(run, name, n, dtype=dtype)
        log(f"  {res}")
        yield res


def quick_check(run, name, dtype):
    cases = [harness.Case("ragged K%8", 1003, 1001, 997, hint="edges, K padding"),
             harness.Case("A transposed", 520, 384, 264, a="transposed", hint="copy path"),
             harness.Case("aligned", 1024, 768, 512, hint="basic indexing")]
    rep = harness.check(run, name, (dtype,), cases, raise_on_fail=False)
    return rep.ok, str(rep)


def check_gemm(kernel):
    for dtype in (torch.float16, torch.bfloat16):
        err, ok2, ok3 = harness.check_alpha_beta(kernel, dtype, 777, 515, 333, seed=1)
        verdict = "ok" if err < 1e-2 else "BAD"
        log(f"gl.gemm {kernel} {dt(dtype)}: alpha/beta rel err {err:.1e} ({verdict}), "
            f"beta=0 ignores NaN C: {ok2}, alpha=0 ignores NaN A: {ok3}")


def loop_mix(sass):
    """Op counts in the innermost loop that holds the HMMAs (a backward branch whose body
    has HMMA), from nvdisasm/cuobjdump text; None when there is none."""
    ins, labels = [], {}
    for line in sass.splitlines():
        m = re.match(r"\s*\.?(L_x_\d+|L_\w+):", line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m:
            ins.append(m.group(1))
    best = None
    for i, text in enumerate(ins):
        m = re.search(r"BRA\b.*?\.?(L_x_\d+|L_\w+)", text)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            body = ins[labels[m.group(1)]:i + 1]
            if any("MMA" in t for t in body) and (best is None or len(body) < len(best)):
                best = body
    if best is None:
        return None
    return Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in best)


def sass_mix(kernel):
    """SASS op counts in the main loop, per HMMA (needs nvdisasm on the PATH)."""
    try:
        kern = next(iter(kernel.overloads.values()))
        sass = kern.inspect_sass()
    except Exception as exc:  # noqa: BLE001 - nvdisasm missing, or numba without it
        return f"(no SASS here: {type(exc).__name__}: {str(exc)[:120]}; run: " \
               "cuobjdump -sass on the cubin, or NUMBA_DUMP_ASSEMBLY)"
    ops = loop_mix(sass)
    if not ops:
        return "(no loop with HMMA found in the SASS)"
    hmma = ops.get("HMMA", 0) or ops.get("HGMMA", 0)
    total = sum(ops.values())
    key = ("HMMA", "HGMMA", "LDSM", "LDGSTS", "BAR", "DEPBAR", "LDL", "STL", "BRA")
    return (f"main loop: {total} instructions, {total / max(hmma, 1):.2f} per HMMA; " +
            ", ".join(f"{k} {ops.get(k, 0)}" for k in key) +
            f"; top: {dict(ops.most_common(12))}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="registered configs only")
    ap.add_argument("--only", default=None, help="one config, by its printed name")
    ap.add_argument("--no-bf16", action="store_true")
    args = ap.parse_args()
    if not gl.engine().kind == "cuda":
        sys.exit("this sweep needs a CUDA GPU (it times kernels against cuBLAS)")
    import numba
    numba_cuda = getattr(sys.modules.get("numba.cuda"), "__version__", "?")
    log(f"{gl.engine()}; torch {torch.__version__}, numba {numba.__version__}, "
        f"numba-cuda {numba_cuda}, CUDA {torch.version.cuda}")

    # 1. the registered kernels on the shape suite, and the BLAS epilogue
    for name in REGISTERED.values():
        t = time.time()
        try:
            log(f"{gl.check(name)}  ({time.time() - t:.0f} s with compilation)")
        except Exception as exc:  # noqa: BLE001 - report and go on
            log(f"{name}: CHECK FAILED: {type(exc).__name__}: {str(exc)[:1500]}")
    for name in list(REGISTERED.values())[1:]:
        try:
            check_gemm(name)
        except Exception as exc:  # noqa: BLE001
            log(f"gl.gemm {name}: FAILED: {type(exc).__name__}: {str(exc)[:800]}")

    # 2. every configuration: check, resources, time
    configs = [(kind, {}) for kind in REGISTERED]        # the registered configurations
    if not args.quick:
        configs += [("k05", c) for c in K05_CONFIGS if c != k05.GPU_CONFIG]
        configs += [(k, c) for k, c in K06_CONFIGS if full_config(k, c) != full_config(k, {})]
    if args.only:
        configs = [(k, c) for k, c in configs if args.only in name_of(k, c)]
    rows = []
    for kind, cfg in configs:
        name = name_of(kind, cfg)
        run = runner(kind, cfg)
        t = time.time()
        try:
            ok, msg = quick_check(run, name, torch.float16)
        except Exception as exc:  # noqa: BLE001
            log(f"{name}: FAILED to run: {type(exc).__name__}: {str(exc)[:600]}")
            continue
        kernel = kernel_of(kind, cfg, torch.float16)
        dyn = getattr(kernel, "smem_bytes", 0) if kind != "k05" else 0  # dynamic shared
        regs, smem, blocks, occ = resources(kernel, kernel.threads, dyn)
        log(f"{name}: {msg} ({time.time() - t:.0f} s); {regs} registers, {smem} B shared, "
            f"{blocks} block(s)/SM, occupancy {occ:.0f}%")
        if not ok:
            continue
        for res in time_sizes(run, name, torch.float16):
            rows.append((name, "float16", res.M, res.tflops, res.baseline_tflops, res.ratio,
                         regs, smem, blocks))

    # 3. bf16 for the registered configs and the best lesson-06 one
    if not args.no_bf16:
        k06_rows = [r for r in rows if r[0].startswith("k06") and r[2] == max(SIZES)]
        best = max(k06_rows, key=lambda r: r[5])[0] if k06_rows else None
        keep = {best} | {name_of(kind, {}) for kind in REGISTERED}
        for kind, cfg in configs:
            name = name_of(kind, cfg)
            if name not in keep:
                continue
            run = runner(kind, cfg)
            ok, msg = quick_check(run, name, torch.bfloat16)
            log(f"{name} bf16: {msg}")
            if not ok:
                continue
            for res in time_sizes(run, name, torch.bfloat16):
                rows.append((name, "bfloat16", res.M, res.tflops, res.baseline_tflops, res.ratio,
                             "", "", ""))

    # 4. SASS of the registered lesson-06 kernels and of the fastest configuration
    for kind in LESSON6:
        log(f"{REGISTERED[kind]} registered config SASS: " +
            sass_mix(kernel_of(kind, {}, torch.float16)))
    k06_rows = [r for r in rows if r[0].startswith("k06") and r[2] == max(SIZES)]
    if k06_rows:
        best = max(k06_rows, key=lambda r: r[5])[0]
        kind, cfg = next((k, c) for k, c in configs if name_of(k, c) == best)
        log(f"{best} SASS: " + sass_mix(kernel_of(kind, cfg, torch.float16)))

    # 5. the table
    print()
    print(f"{gl.engine()}; torch {torch.__version__}, numba-cuda {numba_cuda}")
    print(f"{'kernel / config':34s} {'dtype':9s} {'size':>5s} {'TFLOP/s':>8s} "
          f"{'cuBLAS':>8s} {'ratio':>6s} {'regs':>5s} {'smem B':>7s} {'blk/SM':>6s}")
    for name, d, n, tf, btf, ratio, regs, smem, blocks in rows:
        print(f"{name:34s} {d:9s} {n:5d} {tf:8.1f} {btf:8.1f} {ratio:6.2f} "
              f"{regs!s:>5s} {smem!s:>7s} {blocks!s:>6s}")
    log("done")


if __name__ == "__main__":
    main()
