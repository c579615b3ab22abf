"""Lesson 11 on a GPU: check, then time, the FP8 kernels against ``torch._scaled_mm``; and
measure the error of the accumulator over K, with and without promotion. Needs an FP8 GPU
(compute capability 8.9 or 9.x: Ada, Hopper) for the timings.

    python tools/sweep_fp8.py --out gemm_lessons/results/h200_fp8.csv \\
        --errors-out gemm_lessons/results/h200_fp8_error.csv --budget-s 420
    python tools/sweep_fp8.py --dry-run --out /tmp/fp8.csv   # CPU: tiny shapes, the interpreter
    # the block-scaled kernel against the per-row ones and bf16, with its configurations:
    python tools/sweep_fp8.py --shapes 4096,8192 --budget-s 150 \\
        --kernels k11_fp8_blockwise,k11_fp8_rowwise,k11_fp8_rowwise_tma,k11_fp8_rowwise_promoted \\
        --configs k11_fp8_blockwise,k11_fp8_rowwise_promoted \\
        --out $OUT/h200_fp8_block.csv --errors-out $OUT/h200_fp8_block_error.csv

What it does, in one process, printing its progress:

1. checks each kernel (``gl.scaled_matmul``) and each ``torch._scaled_mm`` call it times on
   every timed shape, against float64 of the dequantized operands (a wrong product is
   reported and not timed);
2. times, batches interleaved in one ``harness.time_cuda_many`` call per shape: the five
   FP8 kernels of lesson 11 (``k11_fp8_rowwise_tma``, ``k11_fp8_blockwise_tma`` and ``k11_fp8_blockwise_ws`` on Hopper only), ``torch._scaled_mm`` with per-tensor and row-wise scales (with
   ``use_fast_accum`` False and True), the course's bf16 GEMM (``k08_triton_tma``) and
   cuBLAS bf16 (``torch.mm``); once as calls (direct: the host's cost included) and once
   replayed from CUDA graphs (``graph=True``: GPU time alone). Shapes: 4096 and 8192 cubes,
   then the shape suite's (``SHAPES_LLM``) with M >= 512, while ``--budget-s`` lasts;
3. ``--configs``: at the timed cubes, other tile configurations of the per-row kernel
   (against ``torch._scaled_mm``) and of the two promoting kernels (against
   ``k11_fp8_rowwise`` in its own configuration), with the course's bf16 GEMM in the same
   interleaved batches;
4. the error over K (512 ... 16384; M = N = 512), on layer-like data and on positive data
   (every product positive: the sums grow with K), of the per-row kernel unpromoted and
   promoted, the block-scaled kernel and ``torch._scaled_mm`` both ways.

Rows (``gemm_lessons.results`` format): dtype ``float8_e4m3fn``; ``kernel`` the FP8 kernel
(``k11_fp8_rowwise``, and ``k11_fp8_rowwise:graph`` for the graph replays), ``baseline_ms``
the ``torch._scaled_mm`` of the same scales and the same accumulation (fast accumulation for
``k11_fp8_tensorwise`` / ``k11_fp8_rowwise``, promoted for the others; the block-scaled
kernel against the row-wise call), named in the ``versions`` column. Extra rows:
``k11_fp8_blockwise:vs_rowwise`` (baseline: ``k11_fp8_rowwise``), ``k11_fp8_blockwise:vs_bf16``
and ``k11_fp8_rowwise:vs_bf16`` ... (baseline: the course's bf16 GEMM), ``torch._scaled_mm:...:vs_bf16``.
Error rows (``--errors-out``): kernel, data, M, N, K, rel_error, device, versions.

``--kernels`` keeps some of the FP8 kernels (the ``torch._scaled_mm`` calls and the bf16
GEMMs are always timed), ``--shapes`` names the shapes (``4096`` for a cube, ``MxNxK``),
``--no-errors`` skips step 4; ``--configs NAMES`` limits step 3 to those kernels, and an entry
``KERNEL@BMxBNxBKwWsS`` times that one configuration. The block kernel's configurations against
each other, the per-row kernel and bf16 in one run (no step starts after 100 s):

    python tools/sweep_fp8.py --shapes 4096,8192 --budget-s 100 --no-errors \\
        --kernels k11_fp8_blockwise,k11_fp8_rowwise \\
        --configs k11_fp8_blockwise@128x128x128w8s4,k11_fp8_blockwise@64x128x128w4s3,k11_fp8_blockwise@64x128x128w4s4 \\
        --out $OUT/h100_fp8_block_configs.csv

(128 x 128 tiles over 8 warps: one program a multiprocessor, whose promotion stalls its
tensor core; 64 x 128 over 4 warps: two programs a multiprocessor, one's promotion free to
overlap the other's ``wgmma``.) The Gluon kernel's configurations take its two options after
the tile, ``r`` (1: the producer brings each K-step's scales into the ring; 0: each consumer
loads its own in the K-step) and ``p`` (1: a persistent grid; 0: one program a tile), each
timed beside the per-row kernel:

    python tools/sweep_fp8.py --shapes 4096,8192 --budget-s 150 --no-errors \
        --kernels k11_fp8_rowwise,k11_fp8_blockwise_ws \
        --configs k11_fp8_blockwise_ws@128x128x128w4s5r0p0,k11_fp8_blockwise_ws@128x128x128w4s5r1p1 \
        --out $OUT/h100_fp8_block_ws3.csv
"""
from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gemm_lessons as gl  # noqa: E402  (first: it decides the engine)
import torch  # noqa: E402

from gemm_lessons import fp8, harness, results  # noqa: E402
from gemm_lessons.__main__ import _versions  # noqa: E402
from gemm_lessons.kernels import k11_triton_fp8 as k11  # noqa: E402
from gemm_lessons.kernels.k07_triton_swizzle import TileConfig  # noqa: E402
from gemm_lessons.kernels.k11_gluon_fp8 import WsConfig  # noqa: E402
from gemm_lessons.shapes import SHAPES_LLM, shape_name  # noqa: E402

T0 = time.time()
E4M3 = torch.float8_e4m3fn
OUT = torch.bfloat16
BF16_KERNEL = "k08_triton_tma"
# kernel -> (scale granularity of A, of B, the torch._scaled_mm it is compared with)
KERNELS = {"k11_fp8_tensorwise": ("tensor", "tensor", "tensorwise_fast"),
           "k11_fp8_rowwise": ("row", "col", "rowwise_fast"),
           "k11_fp8_rowwise_promoted": ("row", "col", "rowwise"),
           "k11_fp8_blockwise": ((1, 128), (128, 128), "rowwise"),
           "k11_fp8_rowwise_tma": ("row", "col", "rowwise_fast"),
           "k11_fp8_blockwise_tma": ((1, 128), (128, 128), "rowwise"),
           "k11_fp8_blockwise_ws": ((1, 128), (128, 128), "rowwise")}
CONFIGS = [TileConfig(128, 256, 128, 8, 3), TileConfig(128, 256, 128, 8, 4),
           TileConfig(128, 256, 64, 8, 4), TileConfig(128, 128, 128, 4, 4),
           TileConfig(256, 128, 128, 8, 3), TileConfig(64, 256, 128, 4, 4)]
# the promoting kernels hold two fp32 tiles a thread (the sum and the K-step's partial):
# tiles of at most 64 of them a thread (ptxas, sm_90: no spills); the block kernel's
# BLOCK_SIZE_N divides 128. 64 x 128 over 4 warps leaves room for two programs a
# multiprocessor (189 registers, 96 KB), whose promotions may overlap each other's wgmma.
PROMOTED_CONFIGS = [TileConfig(128, 128, 128, 8, 4), TileConfig(128, 128, 128, 8, 3),
                    TileConfig(64, 128, 128, 4, 4), TileConfig(64, 128, 128, 4, 3),
                    TileConfig(128, 64, 128, 4, 4), TileConfig(128, 128, 64, 8, 4)]
# the Gluon kernel: two warpgroups of 64 rows, K-steps of one scale block; its two options
# (labels ...r1p1: r, the producer brings the scales into the ring (1) or each consumer loads
# its own in the K-step (0); p, a persistent grid (1) or one program a tile (0)) each way,
# then the ring's depth and the tile's width with both on (the default)
WS_CONFIGS = [WsConfig(128, 128, 128, 4, 5, ring, persistent)
              for ring in (False, True) for persistent in (False, True)]
WS_CONFIGS += [WsConfig(128, 128, 128, 4, 4), WsConfig(128, 128, 128, 4, 6),
               WsConfig(128, 64, 128, 4, 6)]
# the kernels --configs times, with their lists of configurations
CONFIG_KERNELS = {"k11_fp8_rowwise": CONFIGS, "k11_fp8_blockwise": PROMOTED_CONFIGS,
                  "k11_fp8_rowwise_promoted": PROMOTED_CONFIGS,
                  "k11_fp8_blockwise_tma": PROMOTED_CONFIGS,
                  "k11_fp8_blockwise_ws": WS_CONFIGS}
ERROR_K = (512, 1024, 2048, 4096, 8192, 16384)
ERROR_FIELDS = ["kernel", "data", "M", "N", "K", "rel_error", "device", "versions"]


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).parent).stdout.strip() or "?"
    except OSError:
        return "?"


def operands(M, N, K, seed=0, data="layer"):
    """Layer-like fp32 activations (M, K) and weights (K, N); ``data="positive"``: their
    magnitudes, so that every product is positive and the sums grow in proportion to K (the
    accumulator's worst case)."""
    x = fp8.activations(M, K, seed=seed)
    w = fp8.weights(K, N, seed=seed + 1)
    if data == "positive":
        x, w = x.abs(), w.abs()
    return x, w


def quantized(x, w, ga, gb, dev):
    """(qa, qb, sa, sb, reference) on ``dev`` (quantized there, and the float64 reference
    computed there: on a GPU in seconds where the CPU would take minutes); qb column-major
    (W.t())."""
    x, w = x.to(dev), w.to(dev)
    qa, sa = fp8.quantize(x, ga)
    gwt = {"tensor": "tensor", "col": "row"}.get(gb) if isinstance(gb, str) else (gb[1], gb[0])
    qw, sw = fp8.quantize(w.t().contiguous(), gwt)          # the (N, K) weight, quantized
    qb, sb = qw.t(), sw.t()
    ref = (fp8.dequantize(qa, sa, None if isinstance(ga, str) else ga).double()
           @ fp8.dequantize(qb, sb, None if isinstance(gb, str) else gb).double())
    return qa, qb, sa.contiguous(), sb.contiguous(), ref


def scaled_mm(qa, qb, sa, sb, fast):
    return lambda out=None: torch._scaled_mm(qa, qb, scale_a=sa, scale_b=sb, out_dtype=OUT,
                                             use_fast_accum=fast)


def timer(dry):
    """The harness's interleaved timer on a GPU; on the CPU (--dry-run) a wall clock over
    three calls (its figures mean nothing: the code paths run)."""
    if not dry:
        return harness.time_cuda_many

    def cpu_many(fns, graph=False, **_):
        out = {}
        for k, f in fns.items():
            ts = []
            for _ in range(3):
                t = time.perf_counter()
                f()
                ts.append((time.perf_counter() - t) * 1e3)
            out[k] = statistics.median(ts)
        return out
    return cpu_many


def calls_for_shape(M, N, K, dev, kernels=tuple(KERNELS)):
    """{name: (call, check)}: every callable timed on this shape, each with a function that
    returns its relative error against float64 (None: no check, a bf16 product)."""
    x, w = operands(M, N, K)
    fns = {}
    ops = {}
    for name, (ga, gb, _) in KERNELS.items():
        if name not in kernels or not gl.runs_here(name):
            continue
        qa, qb, sa, sb, ref = quantized(x, w, ga, gb, dev)
        out = torch.empty(M, N, dtype=OUT, device=dev)
        call = (lambda qa=qa, qb=qb, sa=sa, sb=sb, out=out, name=name:
                gl.scaled_matmul(qa, qb, sa, sb, kernel=name, out=out))
        fns[name] = (call, lambda call=call, ref=ref: fp8.rel_error(call(), ref))
        ops[name] = (qa, qb, sa, sb, ref)
    for gran, kname in (("tensorwise", "k11_fp8_tensorwise"), ("rowwise", "k11_fp8_rowwise")):
        ga, gb, _ = KERNELS[kname]
        qa, qb, sa, sb, ref = ops[kname] if kname in ops else quantized(x, w, ga, gb, dev)
        for fast in (False, True):
            call = scaled_mm(qa, qb, sa, sb, fast)
            fns[f"{gran}{'_fast' if fast else ''}"] = (
                call, lambda call=call, ref=ref: fp8.rel_error(call(), ref))
    xb = x.to(torch.bfloat16).to(dev)
    wb = w.to(torch.bfloat16).to(dev).contiguous()            # (K, N) row-major
    outb = torch.empty(M, N, dtype=torch.bfloat16, device=dev)
    if gl.runs_here(BF16_KERNEL):
        fns["bf16_course"] = (lambda: gl.matmul(xb, wb, BF16_KERNEL, out=outb), None)
    if dev.type == "cuda":
        fns["bf16_cublas"] = (lambda: torch.mm(xb, wb, out=outb), None)
    return fns


def check_all(fns, M, N, K):
    """Check every callable with a reference; returns the names that passed."""
    good = []
    for name, (call, check) in fns.items():
        if check is None:
            good.append(name)
            continue
        try:
            rel = check()
        except Exception as e:  # noqa: BLE001 - reported, not timed
            log(f"  {name} {shape_name(M, N, K)}: FAILED to run: {type(e).__name__}: {e}")
            continue
        # FP8 against its own dequantized operands: fp32 sums, a bf16 output (2**-8)
        if rel < 1e-2:
            good.append(name)
        else:
            log(f"  {name} {shape_name(M, N, K)}: WRONG, relative error {rel:.2e}")
    return good


def time_shape(M, N, K, dev, timeit, dry, rows, versions, device, kernels=tuple(KERNELS)):
    log(f"{shape_name(M, N, K)}: quantizing, compiling and checking")
    fns = calls_for_shape(M, N, K, dev, kernels)
    good = check_all(fns, M, N, K)
    log(f"{shape_name(M, N, K)}: checked {len(good)}/{len(fns)} against float64")
    calls = {n: fns[n][0] for n in good}
    for graph in ((False,) if dry else (False, True)):
        ms = timeit(calls, graph=graph)
        tag = ":graph" if graph else ""
        how = "CUDA-graph replays" if graph else "direct calls"

        def add(row_name, name, base, what):
            if name in ms and base in ms:
                ver = f"{versions}; baseline {what} ({how})"
                rows.append(results.row(f"{row_name}{tag}", 11, E4M3, M, N, K, ms[name],
                                        ms[base], device=device, versions=ver))

        for name, (_, _, base) in KERNELS.items():
            add(name, name, base, f"torch._scaled_mm {base.replace('_fast', '')} "
                                  f"use_fast_accum={base.endswith('_fast')}")
        for block in ("k11_fp8_blockwise", "k11_fp8_blockwise_tma", "k11_fp8_blockwise_ws"):
            add(f"{block}:vs_rowwise", block, "k11_fp8_rowwise", "k11_fp8_rowwise")
        for name in ("k11_fp8_blockwise", "k11_fp8_rowwise", "k11_fp8_rowwise_promoted",
                     "k11_fp8_rowwise_tma", "k11_fp8_blockwise_tma", "k11_fp8_blockwise_ws"):
            if name in ms and "bf16_course" in ms:
                rows.append(results.row(f"{name}:vs_bf16{tag}", 11, E4M3, M, N, K, ms[name],
                                        ms["bf16_course"], device=device,
                                        versions=f"{versions}; baseline {BF16_KERNEL} bf16 ({how})"))
        for base in ("tensorwise", "rowwise", "tensorwise_fast", "rowwise_fast"):
            if base in ms and "bf16_cublas" in ms:
                rows.append(results.row(f"torch._scaled_mm_fp8:{base}:vs_bf16{tag}", 0, E4M3,
                                        M, N, K, ms[base], ms["bf16_cublas"], device=device,
                                        versions=f"{versions}; baseline torch.mm bf16 ({how})"))
        flops = 2.0 * M * N * K
        line = "  ".join(f"{n} {flops / (t * 1e-3) / 1e12:.0f}" for n, t in ms.items())
        log(f"  {how}, TFLOP/s: {line}")


def _label(cfg):
    label = f"{cfg.BM}x{cfg.BN}x{cfg.BK}w{cfg.num_warps}s{cfg.num_stages}"
    if isinstance(cfg, WsConfig):          # the Gluon kernel's options: r(ing) and p(ersistent)
        label += f"r{int(cfg.scale_ring)}p{int(cfg.persistent)}"
    return label


def _entry(name):
    return next(k for k in gl.kernels() if k.name == name)


def time_configs(sizes, dev, timeit, rows, versions, device, kernels=tuple(KERNELS)):
    """Other tile configurations at each cube of ``sizes``: the per-row kernel's against
    ``torch._scaled_mm`` (fast accumulation), the promoting kernels' against
    ``k11_fp8_rowwise``; every configuration checked against float64 first; the course's
    bf16 GEMM in the same interleaved batches (graph replays)."""
    plan = [("k11_fp8_rowwise", configs_of("k11_fp8_rowwise", kernels), "rowwise_fast",
             "torch._scaled_mm rowwise use_fast_accum=True")]
    plan += [(k, configs_of(k, kernels), "k11_fp8_rowwise", "k11_fp8_rowwise")
             for k in ("k11_fp8_blockwise", "k11_fp8_rowwise_promoted",
                       "k11_fp8_blockwise_tma", "k11_fp8_blockwise_ws")]
    plan = [p for p in plan if p[1] and gl.runs_here(p[0])]
    for n in sizes:
        x, w = operands(n, n, n)
        base_ops = quantized(x, w, "row", "col", dev)
        qa, qb, sa, sb, _ = base_ops
        out_base = torch.empty(n, n, dtype=OUT, device=dev)
        calls = {"rowwise_fast": scaled_mm(qa, qb, sa, sb, True),
                 "k11_fp8_rowwise": lambda: gl.scaled_matmul(qa, qb, sa, sb, out=out_base,
                                                             kernel="k11_fp8_rowwise")}
        if gl.runs_here(BF16_KERNEL):
            xb = x.to(torch.bfloat16).to(dev)
            wb = w.to(torch.bfloat16).to(dev).contiguous()
            outb = torch.empty(n, n, dtype=torch.bfloat16, device=dev)
            calls["bf16_course"] = lambda: gl.matmul(xb, wb, BF16_KERNEL, out=outb)
        bases = {}
        for name, cfgs, base, what in plan:
            ga, gb, _ = KERNELS[name]
            qa_, qb_, sa_, sb_, ref = quantized(x, w, ga, gb, dev)
            out = torch.empty(n, n, dtype=OUT, device=dev)
            entry = _entry(name)
            for cfg in cfgs:
                label = f"{name}@{_label(cfg)}"

                def call(entry=entry, ops=(qa_, qb_, sa_, sb_), out=out, cfg=cfg):
                    return entry.scaled(*ops, out, config=cfg)
                log(f"  config {label}: compiling and checking")
                try:
                    call()
                    rel = fp8.rel_error(out, ref)
                except Exception as e:  # noqa: BLE001 - a config that does not fit
                    log(f"  config {label}: FAILED: {type(e).__name__}: {str(e)[:120]}")
                    continue
                if rel > 1e-2:
                    log(f"  config {label}: WRONG ({rel:.2e})")
                    continue
                calls[label] = call
                bases[label] = (base, what)
        log(f"configs at {n}: timing {len(calls)} callables (graph replays, interleaved)")
        ms = timeit(calls, graph=True)
        for label, (base, what) in bases.items():
            if label in ms and base in ms:
                rows.append(results.row(f"{label}:graph", 11, E4M3, n, n, n, ms[label],
                                        ms[base], device=device,
                                        versions=f"{versions}; baseline {what} (graph)"))
            if label in ms and "bf16_course" in ms and not label.startswith("k11_fp8_rowwise@"):
                ver = f"{versions}; baseline {BF16_KERNEL} bf16 (graph)"
                rows.append(results.row(f"{label}:vs_bf16:graph", 11, E4M3, n, n, n, ms[label],
                                        ms["bf16_course"], device=device, versions=ver))
        log(f"configs at {n}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()))


def errors_over_k(ks, dev, versions, device, M=512, N=512, kernels=tuple(KERNELS)):
    out = []
    for data in ("layer", "positive"):
        for K in ks:
            x, w = operands(M, N, K, seed=K, data=data)
            vals = {}
            for name, (ga, gb, _) in KERNELS.items():
                if (name == "k11_fp8_tensorwise" or name not in kernels
                        or not gl.runs_here(name)):
                    continue
                qa, qb, sa, sb, ref = quantized(x, w, ga, gb, dev)
                got = gl.scaled_matmul(qa, qb, sa, sb, kernel=name, out_dtype=torch.float32)
                vals[name] = fp8.rel_error(got, ref)
                if name == "k11_fp8_rowwise":
                    # cuBLAS's accumulation alone: unit scales and an fp32 C (row-wise
                    # scales need a bf16 C, whose rounding would hide it), the row and
                    # column scales applied after, in float64 (they factor out exactly)
                    one = torch.ones((), dtype=torch.float32, device=dev)
                    for fast in (False, True):
                        r = torch._scaled_mm(qa, qb, scale_a=one, scale_b=one,
                                             out_dtype=torch.float32, use_fast_accum=fast)
                        r = r.double() * sa.double() * sb.double()
                        vals[f"torch._scaled_mm_fp8:rowwise{'_fast' if fast else ''}"] = \
                            fp8.rel_error(r, ref)
            for name, rel in vals.items():
                out.append({"kernel": name, "data": data, "M": M, "N": N, "K": K,
                            "rel_error": f"{rel:.6e}", "device": device, "versions": versions})
            log(f"error, {data} data, K={K}: " + ", ".join(f"{k} {v:.2e}" for k, v in vals.items()))
    return out


def write_errors(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ERROR_FIELDS)
        w.writeheader()
        w.writerows(rows)


def parse_shapes(text):
    """'4096,8192' (cubes) or '512x4096x4096,...' -> [(M, N, K), ...]."""
    shapes = []
    for item in text.split(","):
        dims = [int(d) for d in item.lower().split("x")]
        if len(dims) == 1:
            dims *= 3
        if len(dims) != 3 or min(dims) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: a size (a cube) or MxNxK")
        shapes.append(tuple(dims))
    return shapes


def parse_config(label):
    """'128x128x128w8s4' (BM x BN x BK, warps, stages) -> TileConfig; with the Gluon kernel's
    options, '128x128x128w4s5r1p0' (r: scale_ring, p: persistent, 0 or 1) -> WsConfig."""
    import re
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)w(\d+)s(\d+)(?:r([01])p([01]))?", label.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{label!r}: a configuration is BMxBNxBKwWARPSsSTAGES, "
                                         "e.g. 128x128x128w8s4 (k11_fp8_blockwise_ws: "
                                         "optionally r0/r1 p0/p1 after, e.g. 128x128x128w4s5r1p0)")
    tile = TileConfig(*(int(g) for g in m.groups()[:5]))
    if m.group(6) is None:
        return tile
    return WsConfig(*tile, scale_ring=m.group(6) == "1", persistent=m.group(7) == "1")


def parse_configs(text):
    """'--configs' entries: a kernel (its whole list of configurations) or kernel@config (that
    one configuration), e.g. 'k11_fp8_rowwise,k11_fp8_blockwise@64x128x128w4s3'."""
    entries = []
    for item in (n.strip() for n in text.split(",")):
        if not item:
            continue
        name, _, label = item.partition("@")
        parse_kernels(name)
        if label:
            if name not in CONFIG_KERNELS:
                raise argparse.ArgumentTypeError(f"{name}: configurations are timed for "
                                                 f"{', '.join(CONFIG_KERNELS)}")
            cfg = parse_config(label)
            if isinstance(cfg, WsConfig) and name != "k11_fp8_blockwise_ws":
                raise argparse.ArgumentTypeError(f"{item}: only k11_fp8_blockwise_ws takes the "
                                                 "r (scale ring) and p (persistent) options")
            label = _label(cfg)
        entries.append(f"{name}@{label}" if label else name)
    return tuple(entries)


def configs_of(name, entries):
    """The configurations of ``name`` that ``--configs`` entries ask for (in their order)."""
    if name in entries:
        return list(CONFIG_KERNELS[name])
    return [parse_config(e.split("@", 1)[1]) for e in entries if e.startswith(f"{name}@")]


def parse_kernels(text):
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}: the FP8 kernels are "
                                         f"{', '.join(KERNELS)}")
    return tuple(names)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the timings CSV (gemm_lessons.results format)")
    p.add_argument("--errors-out", help="the error-over-K CSV (default: --out's name + _error)")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="no new shape (or --configs) is started after this many seconds (the "
                        "error measurement is kept for the end and runs unless --no-errors)")
    p.add_argument("--shapes", type=parse_shapes,
                   help="comma-separated: a size (a cube) or MxNxK (default: 4096, 8192, then "
                        "the shape suite's with M >= 512)")
    p.add_argument("--kernels", type=parse_kernels, default=tuple(KERNELS),
                   help="comma-separated FP8 kernels to time (default: all five; the "
                        "torch._scaled_mm calls and the bf16 GEMMs are always timed)")
    p.add_argument("--configs", nargs="?", const=",".join(CONFIG_KERNELS), type=parse_configs,
                   help="also time other tile configurations, at the timed cubes, of the "
                        "per-row kernel and of the promoting kernels (or of those named; "
                        "KERNEL@BMxBNxBKwWsS: that configuration alone)")
    p.add_argument("--no-errors", action="store_true", help="skip the error over K")
    p.add_argument("--dry-run", action="store_true",
                   help="on the CPU: tiny shapes through Triton's interpreter, wall-clock "
                        "times (meaningless), every code path but the CUDA timers")
    args = p.parse_args(argv)
    dry = args.dry_run
    on_gpu = gl.backend() == "cuda"
    if not on_gpu and not dry:
        print("sweep_fp8 times kernels on an FP8 GPU; here there is none: use --dry-run to "
              "run its code paths on tiny shapes", file=sys.stderr)
        return 2
    if on_gpu and not gl.runs_here("k11_fp8_rowwise"):
        print(f"{gl.engine()}: FP8 kernels need compute capability 8.9 or 9.x", file=sys.stderr)
        return 2
    dev = gl.device()
    device = gl.engine().device_name if on_gpu else "cpu (dry run: Triton's interpreter)"
    versions = f"{results.versions_text(_versions())}; tools/sweep_fp8.py (commit {commit()})"
    errors_out = args.errors_out or str(Path(args.out).with_name(Path(args.out).stem + "_error.csv"))
    if dry:
        shapes = [(64, 48, 256), (40, 32, 160)]
        ks = (64, 128, 256)
    else:
        shapes = [(4096, 4096, 4096), (8192, 8192, 8192)] + [s for s in SHAPES_LLM
                                                            if s[0] >= 512]
        ks = ERROR_K
    shapes = args.shapes or shapes
    cubes = [m for m, n, k in shapes if m == n == k]
    kernels = args.kernels
    timeit = timer(dry)
    rows = []
    log(f"{device}; {len(shapes)} shapes; kernels {', '.join(kernels)}; "
        f"budget {args.budget_s:.0f} s")
    for i, (M, N, K) in enumerate(shapes):
        if time.time() - T0 > args.budget_s:
            log(f"budget spent: {len(shapes) - i} shapes left untimed")
            break
        try:
            time_shape(M, N, K, dev, timeit, dry, rows, versions, device, kernels)
        except Exception:  # noqa: BLE001 - report and go on
            log(f"FAILED on {shape_name(M, N, K)}:\n{traceback.format_exc(limit=4)}")
        results.merge_csv(args.out, rows, keep=False)      # what is done, kept at each step
    if args.configs:
        for n in (cubes if args.shapes or not dry else [256]):
            if time.time() - T0 > args.budget_s:
                log(f"budget spent: configurations at {n} left untimed")
                break
            try:
                time_configs((n,), dev, timeit, rows, versions, device, args.configs)
            except Exception:  # noqa: BLE001
                log(f"FAILED in --configs at {n}:\n{traceback.format_exc(limit=4)}")
            results.merge_csv(args.out, rows, keep=False)
    log(f"wrote {len(rows)} rows to {args.out}")
    if args.no_errors:
        return 0
    err = errors_over_k(ks, dev, versions, device, *((32, 32) if dry else (512, 512)),
                        kernels=kernels)
    write_errors(errors_out, err)
    log(f"wrote {len(err)} error rows to {errors_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
