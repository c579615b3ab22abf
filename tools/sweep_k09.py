"""Lesson 09 on a GPU: check, then time, the fused-epilogue GEMMs against torch eager and
torch.compile, and split-K against the same kernel without a split.

    python tools/sweep_k09.py            # checks, headline, TMA configs, split-K, table (< 4 min)
    python tools/sweep_k09.py --quick    # checks and the two headline measurements only
    python tools/sweep_k09.py --more     # also k09_fused_epilogue's other tiles, split-K tiles

What it does, in one process:
1. checks the three kernels on the shape suite in fp16 (``gl.check``; every dtype and every
   semantic: ``pytest tests/test_k09*.py``), and the BLAS promises on the GPU (NaN in C
   with beta = 0, NaN in A and B with alpha = 0, a broadcast batch with B = W.t()), and that
   k09_fused_tma takes its TMA path (not the pointer fallback) for the timed operands;
2. the headline from the package's benchmark (``labs.k09.bench_epilogue``): bias + gelu, fp16,
   M=8192, N=16384, K=4096 (an MLP up-projection): k09_fused_epilogue and, on Hopper,
   k09_fused_tma against torch eager (``gelu(addmm(b, x, W))``), ``torch.compile`` of the
   same function, and cuBLAS's ``mm`` alone (the GEMM with no epilogue);
3. unless --quick: k09_fused_tma's tile configurations (the registered kernel with a
   ``TmaConfig``), the cost of its epilogue (no bias / no activation), B as an nn.Linear
   weight (``W.t()``) and bf16 for both kernels;
4. split-K on M=N=256, K=65536: no split, the rule's choice, fixed splits, cuBLAS;
5. prints the table last: milliseconds, TFLOP/s, each kernel's speed relative to each
   baseline (> 1: the kernel is faster), and the compiled kernel's registers and spills.
   Targets: >= 1.30x torch eager and >= 1.00x torch.compile on the headline; split-K
   faster than no split on the skinny shape.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402
import triton  # noqa: E402

from gemm_lessons.kernels import k09_fused_epilogue as k09  # noqa: E402
from gemm_lessons.kernels import k09_fused_tma as tma  # noqa: E402
from gemm_lessons.labs import k09 as lab  # noqa: E402
from gemm_lessons.kernels.k09_fused_epilogue import Config  # noqa: E402
from gemm_lessons.kernels.k09_fused_tma import TmaConfig  # noqa: E402

T0 = time.time()
HEAD = (8192, 16384, 4096)
SKINNY = (256, 256, 65536)
# k09_fused_tma's tile configurations tried on the headline (its default is timed there)
TMA_CONFIGS = [TmaConfig(128, 256, 64, 8, 8, 3),                         # whole-tile epilogue
               TmaConfig(128, 256, 64, 8, 8, 3, epilogue_subtile=True, flatten=False),
               TmaConfig(256, 128, 64, 8, 8, 3, epilogue_subtile=True),
               TmaConfig(128, 256, 32, 8, 8, 5, epilogue_subtile=True),
               TmaConfig(128, 128, 64, 8, 8, 4)]
# --more: k09_fused_epilogue's other tiles (measured in notebook 09 already), split-K tiles
CONFIGS = [Config(128, 256, 64, 8, 8, 3), Config(128, 256, 32, 8, 8, 4),
           Config(128, 128, 32, 8, 8, 5)]
SPLIT_CONFIGS = [Config(64, 64, 64, 8, 4, 4), Config(128, 128, 64, 8, 4, 4)]
ROWS = []   # (section, what, config, ms, tflops, {baseline: ratio})


class Capture:
    """Wraps a @triton.jit kernel: keeps the compiled kernel of the last launch, so the
    table can show its registers, spills, shared memory and programs per SM."""

    def __init__(self, kernel):
        self.kernel, self.last = kernel, None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.last = self.kernel[grid](*args, **kwargs)
            return self.last
        return launch

    def info(self):
        return compiled_info(self.last)


def compiled_info(k):
    """Registers, spills, shared memory and programs per SM of a compiled kernel."""
    try:
        regs, spills = k.n_regs, k.n_spills
        smem, warps = k.metadata.shared, k.metadata.num_warps
        per_sm = min(65536 // max(1, regs * 32 * warps), (228 * 1024) // max(1, smem + 1024))
        return f"{regs} regs, {spills} spills, {smem // 1024} KB smem, {per_sm}/SM"
    except Exception:  # noqa: BLE001 - diagnostics only
        return "?"


CAPTURE = {}


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def add(section, what, config, ms, M, N, K, ratios=None, info=""):
    ROWS.append((section, what, str(config), ms, 2.0 * M * N * K / (ms * 1e-3) / 1e12,
                 ratios or {}, info))


KERNEL_FN = {"k09_fused_epilogue": "fused_gemm_kernel", "k09_fused_tma": "fused_tma_kernel"}


def kernel_info(name="k09_fused_epilogue"):
    fn = KERNEL_FN.get(name, name)
    return CAPTURE[fn].info() if fn in CAPTURE else ""


def record(section, res):
    """One row per fused kernel (with its speed relative to each baseline), then one per
    baseline."""
    baselines = [b for b in res.ms if b not in res.kernels]
    for name in res.kernels:
        add(section, name, res.configs.get(name, ""), res.ms[name], res.M, res.N, res.K,
            {b: res.ratio(b, name) for b in baselines}, kernel_info(name))
    for b in baselines:
        add(section, f"  {b}", "", res.ms[b], res.M, res.N, res.K)
    if res.note:
        log(f"{section}: {res.note}")


def guarded(label, fn):
    """Run one measurement; a failure is logged and the sweep goes on."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - report and continue
        log(f"FAILED: {label}\n{traceback.format_exc(limit=3)}")
        return None


def checks(kernels):
    for name in kernels:                # every dtype: pytest tests/test_k09*
        log(str(gl.check(name, dtypes=(torch.float16,))))
    dev = gl.device()
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(*s, generator=gen).half().to(dev) for s in ((300, 200), (200, 264),
                                                                         (300, 264)))
    bias = torch.randn(264, generator=gen).half().to(dev)
    W = torch.randn(264, 200, generator=gen).half().to(dev)        # nn.Linear's (N, K)
    nan = float("nan")
    for kernel in kernels:
        out = gl.gemm(a, b, torch.full_like(c, nan), beta=0.0, bias=bias, activation="gelu",
                      kernel=kernel)
        ref = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
        ok1 = not out.isnan().any() and torch.allclose(out.double(), ref, atol=0.05, rtol=2e-3)
        out = gl.gemm(torch.full_like(a, nan), torch.full_like(b, nan), c, alpha=0.0, beta=2.0,
                      kernel=kernel)
        ok2 = torch.equal(out, 2 * c)
        x = torch.randn(4, 300, 200, generator=gen).half().to(dev)
        out = gl.gemm(x, W.t(), c, alpha=0.5, beta=-1.0, bias=bias, activation="relu",
                      kernel=kernel)
        ref = torch.relu(0.5 * x.double() @ W.double().t() - c.double() + bias.double())
        ok3 = torch.allclose(out.double(), ref, atol=0.05, rtol=2e-3)
        xb = torch.randn(4, 200, 264, generator=gen).half().to(dev)
        out = gl.gemm(a, xb, bias=bias, activation="leaky_relu", kernel=kernel)
        ref = torch.nn.functional.leaky_relu(a.double() @ xb.double() + bias.double(), 0.01)
        ok4 = torch.allclose(out.double(), ref, atol=0.05, rtol=2e-3)
        log(f"{kernel}: beta=0 ignores NaN C: {ok1}; alpha=0 ignores NaN A, B: {ok2}; "
            f"batched x @ W.t() + C: {ok3}; shared a @ batched b: {ok4}")
        if not (ok1 and ok2 and ok3 and ok4):
            raise SystemExit(f"{kernel} breaks a BLAS promise on the GPU: fix before timing")
    if "k09_fused_tma" in kernels:     # the timed operands take the TMA path, not the fallback
        x3 = x[:1]
        paths = {"row-major B": tma.will_use_tma(x3, b.unsqueeze(0)),
                 "B = W.t()": tma.will_use_tma(x3, W.t().unsqueeze(0)),
                 "batched x, 3-D descriptors": tma.will_use_tma(x, xb)}
        log(f"k09_fused_tma takes the TMA path: {paths}")
        if not all(paths.values()):
            raise SystemExit("k09_fused_tma falls back to the pointer kernel on aligned operands")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="checks and the headline only")
    ap.add_argument("--more", action="store_true",
                    help="also k09_fused_epilogue's other tiles and split-K tiles")
    args = ap.parse_args(argv)
    if gl.backend() != "cuda":
        raise SystemExit("this sweep times kernels: it needs a GPU")
    log(f"{gl.engine()}; torch {torch.__version__}, triton {triton.__version__}")
    hopper = gl.runs_here("k09_fused_tma")
    kernels = ["k09_fused_epilogue", "k09_split_k"] + ["k09_fused_tma"] * hopper
    if not hopper:
        log("not Hopper: k09_fused_tma (TMA, sm_90) is neither checked nor timed")
    checks(kernels)
    M, N, K = HEAD
    CAPTURE["fused_gemm_kernel"] = k09.fused_gemm_kernel = Capture(k09.fused_gemm_kernel)
    CAPTURE["fused_tma_kernel"] = tma.fused_tma_kernel = Capture(tma.fused_tma_kernel)

    log("headline: bias + gelu, fp16 (torch.compile compiles first)")
    res = lab.bench_epilogue(M, N, K, torch.float16, "gelu")
    log("\n" + str(res))
    record("headline fp16", res)

    log("split-K, skinny")
    times = lab.bench_split_k(*SKINNY, splits=(1, "auto") if args.quick else
                              (1, "auto", 8, 64))
    base = times["split_k=1"]
    for label, ms in times.items():
        add("split-K 256x256x65536", label,
            "" if label == "cuBLAS" else k09.default_config(torch.float16), ms, *SKINNY,
            {"split_k=1": base / ms})

    if not args.quick:
        if hopper:
            for cfg in TMA_CONFIGS:
                log(f"k09_fused_tma config {cfg}")
                r = guarded(str(cfg), lambda: lab.bench_epilogue(
                    M, N, K, torch.float16, "gelu", kernels=("k09_fused_tma",),
                    tma_config=cfg, baselines=()))
                if r and r.ms:
                    ms = r.ms["k09_fused_tma"]
                    add("tma configs bias+gelu", "k09_fused_tma", cfg, ms, M, N, K,
                        {b: res.ms[b] / ms for b in ("torch eager", "torch.compile",
                                                      "cuBLAS mm alone")},
                        kernel_info("k09_fused_tma"))
            for bias, act in ((False, None), (True, None)):
                what = " + ".join(["bias"] * bias + ["gelu"] * bool(act)) or "nothing"
                log(f"epilogue cost: {what}")
                r = guarded(what, lambda: lab.bench_epilogue(
                    M, N, K, torch.float16, act, bias=bias, kernels=("k09_fused_tma",),
                    baselines=("torch eager", "cuBLAS mm alone")))
                if r:
                    record(f"epilogue: {what}", r)
        log("B = W.t() (nn.Linear's layout)")
        r = guarded("W.t()", lambda: lab.bench_epilogue(M, N, K, torch.float16, "gelu",
                                                         b_layout="transposed",
                                                         baselines=("torch eager",
                                                                    "torch.compile")))
        if r:
            record("B = W.t() fp16", r)
        log("bf16")
        r = guarded("bf16", lambda: lab.bench_epilogue(M, N, K, torch.bfloat16, "gelu",
                                                        baselines=("torch eager",)))
        if r:
            record("headline bf16", r)
    if args.more:
        for cfg in CONFIGS:
            log(f"k09_fused_epilogue config {cfg}")
            r = guarded(str(cfg), lambda: lab.bench_epilogue(
                M, N, K, torch.float16, "gelu", config=cfg, kernels=("k09_fused_epilogue",),
                baselines=()))
            if r:
                ms = r.ms["k09_fused_epilogue"]
                add("configs bias+gelu", "k09_fused_epilogue", cfg, ms, M, N, K,
                    {"torch eager": res.ms["torch eager"] / ms,
                     "torch.compile": res.ms["torch.compile"] / ms}, kernel_info())
        for cfg in SPLIT_CONFIGS:
            log(f"split-K config {cfg}")
            t = guarded(str(cfg), lambda: lab.bench_split_k(*SKINNY, splits=(1, "auto"),
                                                            config=cfg))
            if t:
                for label, ms in t.items():
                    if label != "cuBLAS":
                        add("split-K configs", label, cfg, ms, *SKINNY,
                            {"split_k=1 (default)": base / ms})

    print()
    print(f"{'section':<24} {'what':<26} {'config':<28} {'ms':>9} {'TFLOP/s':>8}  "
          f"ratios (>1: the kernel is faster)  [compiled: registers, spills, shared memory, "
          f"programs/SM]")
    for section, what, cfg, ms, tf, ratios, info in ROWS:
        rs = ", ".join(f"{r:.2f}x {b}" for b, r in ratios.items())
        print(f"{section:<24} {what:<26} {cfg:<28} {ms:9.4f} {tf:8.1f}  {rs}"
              + (f"  [{info}]" if info else ""))
    print()
    for name in res.kernels:
        print(f"headline (package benchmark, one run): {name} vs torch eager "
              f"{res.ratio('torch eager', name):.2f}x (target 1.30x), vs torch.compile "
              f"{res.ratio('torch.compile', name):.2f}x (target 1.00x), vs cuBLAS mm with no "
              f"epilogue {res.ratio('cuBLAS mm alone', name):.2f}x")
    print(f"split-K on {SKINNY}: rule's choice "
          f"{[v for k, v in times.items() if k.startswith('split_k=auto')][0] * 1e3:.1f} us vs "
          f"no split {base * 1e3:.1f} us vs cuBLAS {times['cuBLAS'] * 1e3:.1f} us")
    log("done")


if __name__ == "__main__":
    main()
