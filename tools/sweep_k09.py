"""Lesson 09 on a GPU: check, then time, the fused-epilogue GEMM against torch eager and
torch.compile, and split-K against the same kernel without a split.

    python tools/sweep_k09.py            # checks, headline, configs, split-K, table (~3 min)
    python tools/sweep_k09.py --quick    # checks and the two headline measurements only

What it does, in one process:
1. checks both kernels on the shape suite in fp16 (``gl.check``; every dtype and every
   semantic: ``pytest tests/test_k09_fused_epilogue.py``), and the BLAS promises on the GPU
   (NaN in C with beta = 0, NaN in A and B with alpha = 0, a broadcast batch);
2. the headline: bias + gelu, fp16, M=8192, N=16384, K=4096 (an MLP up-projection): k09
   against torch eager (``gelu(addmm(b, x, W))``), ``torch.compile`` of the same function,
   and cuBLAS's ``mm`` alone (the GEMM with no epilogue: what fusion has to hide);
3. unless --quick: the same problem with other tile configurations (k09 only), the cost of
   the epilogue (no bias / no activation), B as an nn.Linear weight (``W.t()``) and bf16
   against torch eager;
4. split-K on M=N=256, K=65536: no split, the rule's choice, fixed splits, cuBLAS;
5. prints the table last: milliseconds, TFLOP/s, and k09's speed relative to each baseline
   (> 1: k09 is faster). Targets: >= 1.30x torch eager and >= 1.00x torch.compile on the
   headline; split-K faster than no split on the skinny shape.
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
import triton.language as tl  # noqa: E402

from gemm_lessons import harness  # noqa: E402
from gemm_lessons.kernels import k09_fused_epilogue as k09  # noqa: E402
from gemm_lessons.kernels.k09_fused_epilogue import Config  # noqa: E402

T0 = time.time()
HEAD = (8192, 16384, 4096)
SKINNY = (256, 256, 65536)
# other tile configurations tried on the headline (the default is timed in the headline)
CONFIGS = [Config(128, 128, 64, 8, 8, 4), Config(128, 256, 64, 8, 8, 3),
           Config(256, 128, 64, 8, 8, 3), Config(128, 128, 32, 8, 8, 5),
           Config(128, 256, 32, 8, 8, 4), Config(128, 128, 64, 8, 4, 3),
           Config(128, 128, 128, 8, 8, 2), Config(128, 128, 64, 16, 8, 3),
           Config(128, 128, 64, 8, 8, 3, maxnreg=128)]   # forces 2 programs per SM
SPLIT_CONFIGS = [Config(64, 64, 64, 8, 4, 4), Config(128, 128, 64, 8, 4, 4)]
ROWS = []   # (section, what, config, ms, tflops, {baseline: ratio})


# ---------------------------------------------------------------- exploratory variant
@triton.jit
def tma_persistent_kernel(a_desc, b_desc, bias_ptr, out_ptr, M, N, K, stride_om,
                          ACTIVATION: tl.constexpr, B_KMAJOR: tl.constexpr,
                          BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                          BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                          NUM_SMS: tl.constexpr):
    # not part of the lesson: TMA loads (tensor descriptors) and a persistent grid, with
    # lesson 09's epilogue; contiguous 16-byte-aligned operands only
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    num_tiles = num_pid_m * num_pid_n
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        group_id = tile_id // num_pid_in_group
        first_pid_m = group_id * GROUP_SIZE_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
        pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
        pid_n = (tile_id % num_pid_in_group) // group_size_m
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_SIZE_M, ki * BLOCK_SIZE_K])
            if B_KMAJOR:
                b = b_desc.load([pid_n * BLOCK_SIZE_N, ki * BLOCK_SIZE_K])
                acc = tl.dot(a, b.T, acc)
            else:
                b = b_desc.load([ki * BLOCK_SIZE_K, pid_n * BLOCK_SIZE_N])
                acc = tl.dot(a, b, acc)
        offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        k09._epilogue(acc, offs_m, offs_n, 0, M, N, out_ptr, 0, 0, 0, bias_ptr, 1,
                      out_ptr, 0, stride_om, 1, 1.0, 0.0, False, True, ACTIVATION)


def tma_gemm(cfg, persistent=True):
    """A run(a, b, bias, out) launcher of the TMA variant (B row-major or W.t())."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    BM, BN, BK = cfg.BLOCK_SIZE_M, cfg.BLOCK_SIZE_N, cfg.BLOCK_SIZE_K

    def run(a, b, bias, out, activation="gelu"):
        M, K = a.shape
        N = b.shape[1]
        kmajor = b.stride(0) == 1
        a_desc = TensorDescriptor.from_tensor(a, [BM, BK])
        b_desc = (TensorDescriptor.from_tensor(b.t(), [BN, BK]) if kmajor
                  else TensorDescriptor.from_tensor(b, [BK, BN]))
        tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
        grid = min(sms, tiles) if persistent else tiles
        run.last = tma_persistent_kernel[(grid,)](
            a_desc, b_desc, bias, out, M, N, K, out.stride(0),
            ACTIVATION=k09.ACTIVATION_CODES[activation], B_KMAJOR=kmajor,
            BLOCK_SIZE_M=BM, BLOCK_SIZE_N=BN, BLOCK_SIZE_K=BK, GROUP_SIZE_M=cfg.GROUP_SIZE_M,
            NUM_SMS=grid, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return out
    return run


TMA_CONFIGS = [(Config(128, 128, 64, 8, 8, 3), True), (Config(128, 256, 64, 8, 8, 3), True),
               (Config(128, 128, 64, 8, 8, 4), True), (Config(128, 128, 64, 8, 8, 2), False)]


def bench_tma(cfg, persistent, b_layout, eager_ms):
    M, N, K = HEAD
    gen = torch.Generator().manual_seed(0)
    dev = gl.device()
    a = (torch.randn(M, K, generator=gen) / 8).half().to(dev)
    if b_layout == "transposed":
        b = (torch.randn(N, K, generator=gen) * (8 / K ** 0.5)).half().to(dev).t()
    else:
        b = (torch.randn(K, N, generator=gen) * (8 / K ** 0.5)).half().to(dev)
    bias = torch.randn(N, generator=gen).half().to(dev)
    out = torch.full((M, N), float("nan"), dtype=torch.float16, device=dev)
    run = tma_gemm(cfg, persistent)
    run(a, b, bias, out)
    ref = torch.nn.functional.gelu(torch.addmm(bias, a, b)).float()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise harness.CheckError(f"TMA variant wrong: relative error {err:.1e}")
    ms = harness.time_cuda(lambda: run(a, b, bias, out))
    add(f"TMA {'persistent' if persistent else 'one tile/program'}",
        f"tma B {b_layout}", cfg, ms, M, N, K, {"torch eager": eager_ms / ms},
        compiled_info(getattr(run, "last", None)))


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


def kernel_info(name="fused_gemm_kernel"):
    return CAPTURE[name].info() if name in CAPTURE else ""


def record(section, res, name="k09_fused_epilogue"):
    ratios = {b: res.ratio(b) for b in res.ms if b != name}
    add(section, name, res.config, res.ms[name], res.M, res.N, res.K, ratios, kernel_info())
    for b in ratios:
        add(section, f"  {b}", "", res.ms[b], res.M, res.N, res.K)


def guarded(label, fn):
    """Run one measurement; a failure is logged and the sweep goes on."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - report and continue
        log(f"FAILED: {label}\n{traceback.format_exc(limit=3)}")
        return None


def checks():
    for name in ("k09_fused_epilogue", "k09_split_k"):   # every dtype: pytest tests/test_k09*
        log(str(gl.check(name, dtypes=(torch.float16,))))
    dev = gl.device()
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(*s, generator=gen).half().to(dev) for s in ((300, 200), (200, 260),
                                                                         (300, 260)))
    bias = torch.randn(260, generator=gen).half().to(dev)
    nan = float("nan")
    for kernel in ("k09_fused_epilogue", "k09_split_k"):
        out = gl.gemm(a, b, torch.full_like(c, nan), beta=0.0, bias=bias, activation="gelu",
                      kernel=kernel)
        ref = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
        ok1 = not out.isnan().any() and torch.allclose(out.double(), ref, atol=0.05, rtol=2e-3)
        out = gl.gemm(torch.full_like(a, nan), torch.full_like(b, nan), c, alpha=0.0, beta=2.0,
                      kernel=kernel)
        ok2 = torch.equal(out, 2 * c)
        x = torch.randn(4, 300, 200, generator=gen).half().to(dev)
        out = gl.gemm(x, b.t().contiguous().t(), bias=bias, activation="relu", kernel=kernel)
        ref = torch.relu(x.double() @ b.double() + bias.double())
        ok3 = torch.allclose(out.double(), ref, atol=0.05, rtol=2e-3)
        log(f"{kernel}: beta=0 ignores NaN C: {ok1}; alpha=0 ignores NaN A, B: {ok2}; "
            f"batched x @ W.t() broadcast: {ok3}")
        if not (ok1 and ok2 and ok3):
            raise SystemExit(f"{kernel} breaks a BLAS promise on the GPU: fix before timing")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="checks and the headline only")
    args = ap.parse_args(argv)
    if gl.backend() != "cuda":
        raise SystemExit("this sweep times kernels: it needs a GPU")
    log(f"{gl.engine()}; torch {torch.__version__}, triton {triton.__version__}")
    checks()
    M, N, K = HEAD
    CAPTURE["fused_gemm_kernel"] = k09.fused_gemm_kernel = Capture(k09.fused_gemm_kernel)

    log("headline: bias + gelu, fp16 (torch.compile compiles first)")
    res = k09.bench_epilogue(M, N, K, torch.float16, "gelu")
    log("\n" + str(res))
    record("headline fp16", res)

    log("split-K, skinny")
    times = k09.bench_split_k(*SKINNY, splits=(1, "auto") if args.quick else
                              (1, "auto", 4, 8, 16, 64))
    base = times["split_k=1"]
    for label, ms in times.items():
        add("split-K 256x256x65536", label,
            "" if label == "cuBLAS" else k09.default_config(torch.float16), ms, *SKINNY,
            {"split_k=1": base / ms})

    if not args.quick:
        for cfg in CONFIGS:
            log(f"config {cfg}")
            r = guarded(str(cfg), lambda: k09.bench_epilogue(M, N, K, torch.float16, "gelu",
                                                              config=cfg, baselines=()))
            if r:
                add("configs bias+gelu", "k09_fused_epilogue", cfg, r.ms["k09_fused_epilogue"],
                    M, N, K, {"torch eager": res.ms["torch eager"] / r.ms["k09_fused_epilogue"],
                              "torch.compile": res.ms["torch.compile"]
                              / r.ms["k09_fused_epilogue"]}, kernel_info())
        for cfg in (None, CONFIGS[1]):
            for bias, act in ((False, None), (True, None), (False, "gelu")):
                what = " + ".join(["bias"] * bias + ["gelu"] * bool(act)) or "nothing"
                log(f"epilogue cost: {what}, {cfg or 'default'}")
                r = guarded(what, lambda: k09.bench_epilogue(
                    M, N, K, torch.float16, act, bias=bias, config=cfg,
                    baselines=("torch eager", "cuBLAS mm alone")))
                if r:
                    record(f"epilogue: {what}", r)
        log("B = W.t() (nn.Linear's layout)")
        r = guarded("W.t()", lambda: k09.bench_epilogue(M, N, K, torch.float16, "gelu",
                                                         b_layout="transposed",
                                                         baselines=("torch eager",)))
        eager_t = None
        if r:
            record("B transposed fp16", r)
            eager_t = r.ms["torch eager"]
        log("bf16")
        r = guarded("bf16", lambda: k09.bench_epilogue(M, N, K, torch.bfloat16, "gelu",
                                                        baselines=("torch eager",)))
        if r:
            record("headline bf16", r)
        log("exploratory: TMA loads (tensor descriptors), persistent grid")
        for cfg, persistent in TMA_CONFIGS:
            guarded(f"TMA {cfg}", lambda: bench_tma(cfg, persistent, "row",
                                                   res.ms["torch eager"]))
        guarded("TMA W.t()", lambda: bench_tma(TMA_CONFIGS[0][0], True, "transposed",
                                              eager_t or res.ms["torch eager"]))
        for cfg in SPLIT_CONFIGS:
            log(f"split-K config {cfg}")
            t = guarded(str(cfg), lambda: k09.bench_split_k(*SKINNY, splits=(1, "auto"),
                                                            config=cfg))
            if t:
                for label, ms in t.items():
                    if label != "cuBLAS":
                        add("split-K configs", label, cfg, ms, *SKINNY, {"split_k=1 (default)": base / ms})
        t = guarded("1024 x 1024", lambda: k09.bench_split_k(1024, 1024, 65536,
                                                             splits=(1, "auto", 4)))
        if t:
            b1 = t["split_k=1"]
            for label, ms in t.items():
                add("split-K 1024x1024x65536", label, "", ms, 1024, 1024, 65536,
                    {"split_k=1": b1 / ms})

    print()
    print(f"{'section':<24} {'what':<26} {'config':<24} {'ms':>9} {'TFLOP/s':>8}  "
          f"ratios (>1: k09 faster)  [compiled: registers, spills, shared memory, programs/SM]")
    for section, what, cfg, ms, tf, ratios, info in ROWS:
        rs = ", ".join(f"{r:.2f}x {b}" for b, r in ratios.items())
        print(f"{section:<24} {what:<26} {cfg:<24} {ms:9.4f} {tf:8.1f}  {rs}"
              + (f"  [{info}]" if info else ""))
    head = [r for r in ROWS if r[0] == "headline fp16" and r[1] == "k09_fused_epilogue"][0]
    print(f"\nheadline: k09 vs torch eager {head[5]['torch eager']:.2f}x (target 1.30x), vs "
          f"torch.compile {head[5]['torch.compile']:.2f}x (target 1.00x), vs cuBLAS mm "
          f"with no epilogue {head[5]['cuBLAS mm alone']:.2f}x")
    print(f"split-K on {SKINNY}: rule's choice "
          f"{[v for k, v in times.items() if k.startswith('split_k=auto')][0] * 1e3:.1f} us vs "
          f"no split {base * 1e3:.1f} us vs cuBLAS {times['cuBLAS'] * 1e3:.1f} us")
    log("done")


if __name__ == "__main__":
    main()
