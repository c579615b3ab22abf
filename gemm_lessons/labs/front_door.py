"""The front door's recording read back: ``gl.matmul`` and ``gl.gemm`` as a user calls
them, against the torch calls they replace (``tools/front_door.py`` records it on a GPU;
this module only reads the CSV, so it runs anywhere).

    from gemm_lessons.labs import front_door as fd
    print(fd.plain_table())      # kernel="auto" on the suite: its choice, direct and graph
    print(fd.fused_table())      # fused bias + GELU, auto, against eager and torch.compile
    fd.summary()                 # the figures the lessons quote

Rows name ``<kernel>:<direct|prepare|graph|host>:<mm|eager|compile>``; a ratio is the torch
call's time over the kernel's, both timed in one run, batches interleaved. *Direct* is a
loop of ordinary calls (the larger of host and GPU time per call); *graph* the GPU's time
alone, both sides replayed from CUDA graphs.
"""
from __future__ import annotations

import csv

from ..common import geomean
from ..results import HERE
from ..shapes import SHAPES_LLM, shape_name

__all__ = ["CSV", "rows", "ratios", "plain_table", "fused_table", "summary"]

CSV = "h200_front_door.csv"


def rows(path=None):
    """The recording's measured rows (dicts), failures left out."""
    with open(path or HERE / CSV, newline="") as f:
        return [r for r in csv.DictReader(f) if r["ms"] and r["baseline_ms"]]


def ratios(path=None):
    """{(M, N, K, layout, baseline): {"kernel:mode": torch's time / the kernel's}} and
    {same key: the kernel auto chose}, host rows left out."""
    by, chosen = {}, {}
    for r in rows(path):
        name, mode, base = r["kernel"].split(":")
        if mode == "host":
            continue
        key = (int(r["M"]), int(r["N"]), int(r["K"]), r["layout"], base)
        by.setdefault(key, {})[f"{name}:{mode}"] = float(r["baseline_ms"]) / float(r["ms"])
        if name == "auto" and mode == "direct":
            chosen[key] = r["status"]
    return by, chosen


def _best(d):
    named = {k: v for k, v in d.items() if k.endswith(":direct") and not k.startswith("auto")}
    return max(named.items(), key=lambda kv: kv[1]) if named else (None, None)


def plain_table(path=None):
    """The suite with B row-major: auto's kernel, its ratio to ``torch.mm`` called directly
    and replayed from graphs, and the best of the timed kernels called directly."""
    by, chosen = ratios(path)
    lines = [f"{'M x N x K':>18}  {'auto runs':20} {'direct':>6} {'graph':>6}   best kernel (direct)"]
    for M, N, K in SHAPES_LLM:
        key = (M, N, K, "row", "mm")
        if key not in by or "auto:direct" not in by[key]:
            continue
        d = by[key]
        best, v = _best(d)
        lines.append(f"{shape_name(M, N, K):>18}  {chosen[key]:20} {d['auto:direct']:6.2f} "
                     f"{d.get('auto:graph', float('nan')):6.2f}   {best.split(':')[0]} {v:.2f}")
    return "\n".join(lines)


def fused_table(path=None):
    """The suite with ``W.t()``: ``gl.gemm(..., bias, "gelu", kernel="auto")`` called
    directly against eager ``F.gelu(F.linear(...))`` and ``torch.compile`` of it, and
    replayed from graphs against eager."""
    by, chosen = ratios(path)
    lines = [f"{'M x N x K':>18}  {'auto runs':22} {'eager':>6} {'compile':>8} {'graph':>6}"]
    for M, N, K in SHAPES_LLM:
        e, c = by.get((M, N, K, "wt", "eager")), by.get((M, N, K, "wt", "compile"))
        if not e or "auto:direct" not in e:
            continue
        lines.append(f"{shape_name(M, N, K):>18}  {chosen[(M, N, K, 'wt', 'eager')]:22} "
                     f"{e['auto:direct']:6.2f} {c['auto:direct']:8.2f} "
                     f"{e.get('auto:graph', float('nan')):6.2f}")
    return "\n".join(lines)


def summary(path=None, out=print):
    """The targets' figures: host time per call at 64^3 against torch's, fused auto against
    eager and compile, the best plain kernel per shape, auto's distance from it."""
    fig = {}
    out("host time per call at 64^3 (direct; a prepared call), times torch's, where torch's "
        "was timed beside it:")
    for r in (r for r in rows(path) if ":host:" in r["kernel"]):
        name, _, base = r["kernel"].split(":")
        t = float(r["ms"]) / float(r["baseline_ms"])
        p = float(r["prepare_ms"]) / float(r["baseline_ms"]) if r["prepare_ms"] else None
        fig[f"host {name} {base}"] = (t, p)
        out(f"  {name:24s} {base:6s} {t:5.2f}x" + ("" if p is None else f"   prepare {p:5.2f}x"))
    by, _ = ratios(path)
    for base in ("eager", "compile"):
        got = {s: d["auto:direct"] for s, d in by.items() if s[4] == base and "auto:direct" in d}
        if got:
            low = min(got.items(), key=lambda kv: kv[1])
            big = [v for s, v in got.items() if s[0] >= 256]
            fig[f"fused {base}"] = geomean(got.values())
            out(f"fused bias+gelu, auto, direct, against {base}: geometric mean "
                f"{fig[f'fused {base}']:.2f}x on {len(got)} shapes, lowest {low[1]:.2f}x "
                f"({shape_name(*low[0][:3])} {low[0][3]}); M >= 256: "
                f"{sum(v >= 1 for v in big)} of {len(big)} at 1.00x or more")
    plain = {s: d for s, d in by.items() if s[4] == "mm"}
    best = {s: _best(d)[1] for s, d in plain.items() if _best(d)[1] is not None}
    if best:
        odd = [v for s, v in best.items() if any(x % 8 for x in s[:3])]
        m64 = [v for s, v in best.items() if s[0] >= 64]
        near = [s for s in best if "auto:direct" in plain[s]
                and plain[s]["auto:direct"] >= 0.95 * best[s]]
        fig.update({"plain best": geomean(best.values()), "plain near": (len(near), len(best))})
        out(f"plain, best timed kernel per shape, direct, against torch.mm: geometric mean "
            f"{fig['plain best']:.2f}x on {len(best)} shapes"
            + (f"; M >= 64: lowest {min(m64):.2f}x" if m64 else "")
            + (f"; sizes not all multiples of 8: geometric mean {geomean(odd):.2f}x"
               if odd else ""))
        out(f"auto within 5 % of the best timed kernel on {len(near)} of {len(best)} shapes")
    return fig
