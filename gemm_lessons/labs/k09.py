"""Lesson 09's measurements: the output traffic a fused epilogue saves, the fused
kernels against torch eager and ``torch.compile``, and split-K against no split.

    from gemm_lessons.labs import k09 as lab
    lab.fusion_bytes(8192, 16384)                 # bytes, unfused vs fused
    print(lab.bench_epilogue())                    # on a GPU: one run, every baseline
    lab.bench_split_k(256, 256, 65536)             # {label: ms}
    lab.suite_ratios("h200_epilogue_ws.csv", "k09_fused_tma_splitk", "eager")
    lab.show_diff_part("k07_triton_swizzle", "k09_fused_epilogue", None, "num_pid_m")
    lab.show_gluon_diff("    # 1.", "    # 4.")     # k09_fused_ws against the kernel before it

Each benchmark checks what it times against torch first, and times the baselines in the
same run (ratios, never a lone time). Off the GPU nothing is timed: the result says so.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

import torch

from .. import api, common, engines, harness, results
from ..kernels import k09_fused_epilogue as k09
from ..kernels import k09_fused_splitk as fsk
from ..kernels import k09_fused_tma_splitk as tsk
from ..kernels import k09_fused_tma as tma
from ..kernels import k09_fused_ws as wsk
from .k06 import show_diff_part, show_part  # noqa: F401  (the lesson reads diffs in parts)

__all__ = ["fusion_bytes", "EpilogueBench", "epilogue_operands", "bench_epilogue",
           "bench_split_k", "suite_ratios", "summarize", "BASELINES", "KERNEL_NAMES",
           "show_part", "show_diff_part", "show_gluon_diff"]


def fusion_bytes(M, N, dtype=torch.float16, unfused_passes=1):
    """Global-memory bytes of the element-wise work after a GEMM, unfused vs fused.

    Unfused (torch eager ``gelu(addmm(bias, a, b))``: cuBLAS adds the bias in its own
    epilogue, then ``gelu`` is a separate kernel): the GEMM writes the (M, N) product, and
    each of ``unfused_passes`` element-wise kernels reads it and writes it again. Fused: the
    product is written once, already activated. Returns (unfused, fused, saved) in bytes.
    """
    size = M * N * torch.empty((), dtype=dtype).element_size()
    unfused = size + unfused_passes * 2 * size
    fused = size
    return unfused, fused, unfused - fused


@dataclass
class EpilogueBench:
    """Times (ms, median) of one fused-epilogue problem, all measured in one run: the fused
    kernels (names starting with "k09") and the baselines."""
    M: int
    N: int
    K: int
    dtype: torch.dtype
    activation: str | None
    ms: dict            # name -> milliseconds (k09 kernels, torch eager, torch.compile, mm)
    note: str = ""
    config: str = ""    # k09_fused_epilogue's tile configuration
    bias: bool = True
    configs: dict = field(default_factory=dict)   # kernel name -> its configuration

    def tflops(self, name):
        return 2.0 * self.M * self.N * self.K / (self.ms[name] * 1e-3) / 1e12

    def ratio(self, baseline, name="k09_fused_epilogue"):
        """Speed of ``name`` relative to ``baseline`` (> 1: faster)."""
        return self.ms[baseline] / self.ms[name]

    def add_note(self, text):
        """Add ``text`` to the note (several kernels may each leave one)."""
        self.note = f"{self.note}; {text}" if self.note else text

    @property
    def kernels(self):
        """The fused kernels timed (the other entries of ``ms`` are baselines)."""
        return [n for n in self.ms if n.startswith("k09")]

    def __str__(self):
        dt = common.dtype_name(self.dtype)
        what = " + ".join(["bias"] * self.bias + [str(self.activation)] * bool(self.activation))
        head = f"GEMM + {what or 'nothing'}, {dt}, M={self.M} N={self.N} K={self.K}"
        if not self.ms:
            return f"{head}: not timed ({self.note})"
        lines = [head + (f" ({self.note})" if self.note else "")]
        ours = self.kernels
        for name, ms in self.ms.items():
            if name in ours:
                extra = f"   [{self.configs.get(name, '')}]"
            else:
                extra = "   " + ", ".join(f"{k} is {self.ratio(name, k):.2f}x this"
                                          for k in ours)
            lines.append(f"  {name:<22} {ms:8.3f} ms  {self.tflops(name):6.1f} TFLOP/s{extra}")
        return "\n".join(lines)


def _torch_epilogue(activation):
    """The same computation in torch: ``act(addmm(bias, a, b))`` (``a @ b`` without a bias)."""
    import torch.nn.functional as F

    def fn(a, b, bias):
        y = torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
        if activation == "gelu":
            return F.gelu(y)
        if activation == "relu":
            return F.relu(y)
        if activation == "leaky_relu":
            return F.leaky_relu(y, k09.LEAKY_SLOPE)
        return y
    return fn


BASELINES = ("torch eager", "torch.compile", "cuBLAS mm alone")
KERNEL_NAMES = ("k09_fused_epilogue", "k09_fused_tma")
# the autotuned kernels, each tuned by its first call (the check), before the timing
AUTOTUNED = {"k09_fused_splitk": fsk, "k09_fused_tma_splitk": tsk, "k09_fused_ws": wsk}


def epilogue_operands(M, N, K, dtype=torch.float16, *, seed=0, b_layout="row"):
    """Seeded A (M, K), B (K, N) and bias (N,) on the engine's device, sized so that
    |A @ B| is near 1, gelu's curved range: entries of size 1/8 and 8 / sqrt(K).
    ``b_layout="transposed"``: B is ``W.t()`` of an (N, K) weight, as ``nn.Linear`` stores it."""
    gen = torch.Generator().manual_seed(seed)
    dev = engines.device()
    a = (torch.randn(M, K, generator=gen) / 8).to(dtype).to(dev)
    if b_layout == "transposed":
        b = (torch.randn(N, K, generator=gen) * (8 / K ** 0.5)).to(dtype).to(dev).t()
    else:
        b = (torch.randn(K, N, generator=gen) * (8 / K ** 0.5)).to(dtype).to(dev)
    bias = torch.randn(N, generator=gen).to(dtype).to(dev)
    return a, b, bias


def bench_epilogue(M=8192, N=16384, K=4096, dtype=torch.float16, activation="gelu", *,
                   bias=True, baselines=BASELINES, config=None, b_layout="row", seed=0,
                   kernels=KERNEL_NAMES, tma_config=None, graph=False):
    """Time the fused (bias +) activation GEMM and, in the same run, ``baselines``: torch
    eager (``addmm`` then the activation), ``torch.compile`` of the same function, and
    cuBLAS's ``mm`` alone (no epilogue at all), after checking that they agree.

    ``kernels``: which fused kernels to time: ``k09_fused_epilogue`` (pointer loads, one
    program per tile; ``config`` overrides its tiles) and ``k09_fused_tma`` (TMA loads,
    persistent grid; ``tma_config``, a ``k09_fused_tma.TmaConfig``, overrides its tiles),
    the latter only on Hopper (sm_90+) and for fp16/bf16; elsewhere it is left out and the
    result's ``note`` says so; ``k09_fused_splitk`` (lesson 08's split-K kernel, autotuned
    per shape bucket, with the epilogue; tuned by its first call, before the timing) and
    ``k09_fused_tma_splitk`` (the same with TMA loads; sm_90+, fp16/bf16) and
    ``k09_fused_ws`` (that with a producer warp and consumer warps; Hopper, Gluon).
    ``graph=True`` times the GPU alone, every contender replayed from a CUDA graph
    (:func:`harness.time_cuda_many`): on a small product the host's cost per call would
    otherwise be what is measured. ``b_layout="transposed"`` passes B as ``W.t()`` of an (N, K)
    weight, as ``nn.Linear`` stores it. On the simulator nothing is timed."""
    cfg = config or k09.default_config(dtype)
    res = EpilogueBench(M, N, K, dtype, activation, {}, config=str(cfg), bias=bias)
    if not engines.on_gpu():
        res.note = harness.SIMULATOR_NOTE
        return res
    a, b, bias_t = epilogue_operands(M, N, K, dtype, seed=seed, b_layout=b_layout)
    bias_t = bias_t if bias else None
    dev = a.device
    a3, b3 = a.unsqueeze(0), b.unsqueeze(0)

    eager = _torch_epilogue(activation)
    runs = {}
    if "k09_fused_epilogue" in kernels:
        out = torch.empty(1, M, N, dtype=dtype, device=dev)
        runs["k09_fused_epilogue"] = lambda: k09.fused_gemm(
            a3, b3, None, out, 1.0, 0.0, bias_t, activation, split_k=1, config=cfg)[0]
        res.configs["k09_fused_epilogue"] = str(cfg)
    if "k09_fused_tma" in kernels:
        if not api.runs_here("k09_fused_tma") or dtype == torch.float32:
            res.add_note("k09_fused_tma not timed: it needs sm_90 and fp16/bf16")
        elif not tma.will_use_tma(a3, b3):
            res.add_note("k09_fused_tma not timed: TMA cannot address these operands")
        else:
            tcfg = tma_config or tma.default_config()
            out_t = torch.empty(1, M, N, dtype=dtype, device=dev)
            runs["k09_fused_tma"] = lambda: tma.fused_gemm_tma(
                a3, b3, None, out_t, 1.0, 0.0, bias_t, activation, config=tcfg)[0]
            res.configs["k09_fused_tma"] = str(tcfg)
    tuned = {name: mod for name, mod in AUTOTUNED.items() if name in kernels}
    if "k09_fused_tma_splitk" in tuned:
        if not api.runs_here("k09_fused_tma_splitk") or dtype == torch.float32:
            res.add_note("k09_fused_tma_splitk not timed: it needs sm_90 and fp16/bf16")
            del tuned["k09_fused_tma_splitk"]
        elif not tsk.uses_tma(a, b):     # it would time k09_fused_splitk under its name
            res.add_note("k09_fused_tma_splitk not timed: TMA cannot address these operands")
            del tuned["k09_fused_tma_splitk"]
    if "k09_fused_ws" in tuned and not wsk.uses_ws(a, b):   # else tsk under its name
        res.add_note("k09_fused_ws not timed: it needs sm_90, fp16/bf16 and operands TMA "
                     "can address")
        del tuned["k09_fused_ws"]
    for name, mod in tuned.items():
        out_s = torch.empty(M, N, dtype=dtype, device=dev)
        runs[name] = (lambda mod=mod, out_s=out_s:
                      mod.fused_gemm(a, b, None, out_s, 1.0, 0.0, bias_t, activation))
    if "torch eager" in baselines:
        runs["torch eager"] = lambda: eager(a, b, bias_t)
    if "torch.compile" in baselines:
        compiled = torch.compile(eager)
        runs["torch.compile"] = lambda: compiled(a, b, bias_t)
    ref = eager(a, b, bias_t).float()
    for name, fn in runs.items():          # check before timing
        err = ((fn().float() - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            raise harness.CheckError(f"{name} disagrees with torch eager: relative error "
                                     f"{err:.1e}; not timing it")
    if "cuBLAS mm alone" in baselines:
        mm_out = torch.empty(M, N, dtype=dtype, device=dev)
        runs["cuBLAS mm alone"] = lambda: torch.mm(a, b, out=mm_out)
    # every contender's batches interleaved: the GPU's clock drift falls on all alike
    res.ms.update(harness.time_cuda_many(runs, graph=graph))
    for name, mod in tuned.items():
        res.configs[name] = mod.chosen_config()
    return res


def bench_split_k(M=256, N=256, K=65536, dtype=torch.float16, *, splits=(1, "auto"),
                  config=None, seed=0):
    """Time the same GEMM with several split-K settings (1 = no split, "auto" = the rule,
    or a number of slices) and cuBLAS, in one run, after checking each. Returns
    {label: ms}; empty on the simulator."""
    if not engines.on_gpu():
        return {}
    a, b = harness.make_operands(M, N, K, dtype, seed=seed)
    out = torch.empty(1, M, N, dtype=dtype, device=a.device)
    ref = harness.reference(a, b)
    times, runs = {}, {}
    for s in splits:
        def run(s=s):
            return k09.fused_gemm(a.unsqueeze(0), b.unsqueeze(0), None, out, split_k=s,
                                  config=config)
        out.fill_(float("nan"))
        run()
        ok, rel, _ = harness.compare(out[0], ref, a, b, dtype)
        if not ok:
            raise harness.CheckError(f"split_k={s} is wrong: relative error {rel:.1e}")
        if s == "auto":
            cfg = config or k09.default_config(dtype)
            n = k09.split_k_rule(M, N, K, block_m=cfg.BLOCK_SIZE_M, block_n=cfg.BLOCK_SIZE_N,
                                 block_k=cfg.BLOCK_SIZE_K, sms=common.sm_count(a.device))
            label = f"split_k=auto ({n})"
        else:
            label = f"split_k={s}"
        runs[label] = run
    mm_out = torch.empty(M, N, dtype=dtype, device=a.device)
    runs["cuBLAS"] = lambda: torch.mm(a, b, out=mm_out)
    times.update(harness.time_cuda_many(runs))      # batches interleaved
    return times


# ------------------------------------------------------------------ the recorded shape suite
def suite_ratios(csv_name, kernel, base):
    """{(M, N, K): ratio} of ``kernel`` against ``base`` ("eager", "compile" or "mm") in a
    recording of ``tools/epilogue_suite.py`` in ``gemm_lessons/results`` (above 1: the
    kernel is faster), in the suite's order."""
    rows, _, _ = results.read_csv(results.HERE / csv_name)
    return {(r.M, r.N, r.K): r.ratio for _, r in rows if r.kernel == f"{kernel}_vs_{base}"}


def summarize(ratios):
    """(geometric mean, the lowest shape, the highest shape, how many are below 1) of
    :func:`suite_ratios`' result."""
    if not ratios:
        raise ValueError("no ratios to summarize: is the kernel in that recording?")
    return (common.geomean(ratios.values()), min(ratios, key=ratios.get), max(ratios, key=ratios.get),
            sum(v < 1 for v in ratios.values()))


# ------------------------------------------------------------------ the Gluon step as a diff
def show_gluon_diff(start=None, end=None, context=2):
    """Print what ``k09_fused_ws``'s kernel changes in ``k09_fused_tma_splitk``'s, from the
    first line that holds ``start`` up to the next that holds ``end`` (``None``: the start or
    the end of the source), as :func:`show_diff_part` does. Gluon names most operations as
    ``tl`` does (``gl.program_id``, ``gl.cdiv``), so the old kernel is read with ``tl.`` as
    ``gl.``: what the diff shows is what the step changed, not the module's name."""
    old = api.source_text(tsk.fused_tma_splitk_kernel).replace("tl.", "gl.")
    new = api.source_text(wsk.fused_ws_kernel)

    def part(text):
        lines = text.splitlines()
        i = 0 if start is None else next(n for n, ln in enumerate(lines) if start in ln)
        j = len(lines) if end is None else next(
            (n for n in range(i + 1, len(lines)) if end in lines[n]), len(lines))
        return lines[i:j]
    print("\n".join(difflib.unified_diff(
        part(old), part(new), "k09_fused_tma_splitk (tl. read as gl.)", "k09_fused_ws",
        n=context, lineterm="")))
