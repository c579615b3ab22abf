"""Plots of lessons 07-08: the order in which programs visit the tiles of C, a model of the
L2 reuse of one wave of programs, and the TFLOP/s of autotuning configs."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .kernels import k07_triton_swizzle as k07

__all__ = ["tile_order_plot", "wave_plot", "config_plot", "recorded", "recorded_table"]


def tile_order_plot(num_pid_m, num_pid_n, group_sizes=(1, 4), wave=None, axes=None):
    """One heatmap per group size: the program id that computes each tile of C (dark:
    early). ``wave``: outline the tiles of the first ``wave`` programs (those that run
    together, one per multiprocessor) and count the row and column strips they touch."""
    if axes is None:
        _, axes = plt.subplots(1, len(group_sizes), figsize=(4.2 * len(group_sizes), 3.6),
                               squeeze=False)
        axes = axes[0]
    for ax, g in zip(axes, group_sizes):
        order = k07.program_order(num_pid_m, num_pid_n, g).numpy()
        ax.imshow(order, cmap="viridis")
        if num_pid_m * num_pid_n <= 80:
            for (i, j), pid in np.ndenumerate(order):
                ax.text(j, i, str(pid), ha="center", va="center", fontsize=7,
                        color="white" if pid < order.max() * 0.6 else "black")
        title = "row-major (GROUP_SIZE_M=1)" if g == 1 else f"grouped (GROUP_SIZE_M={g})"
        if wave:
            inside = order < wave
            for i, j in zip(*np.nonzero(inside)):
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False,
                                           edgecolor="red", lw=1.2))
            rows = int(inside.any(axis=1).sum())
            cols = int(inside.any(axis=0).sum())
            title += f"\nfirst {wave} programs: {rows} A strips + {cols} B strips"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("pid_n (column of tiles)")
        ax.set_ylabel("pid_m (row of tiles)")
    return axes


def wave_plot(shapes, BM, BN, group_sizes=(1, 2, 4, 8, 16), programs=132, ax=None):
    """For each (M, N): the fraction of the first wave's tile loads that must come from
    DRAM (the rest can hit in L2), against GROUP_SIZE_M. Lower is better."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.6))
    for M, N in shapes:
        frac = [k07.wave_traffic(M, N, BM, BN, g, programs) for g in group_sizes]
        ax.plot(range(len(group_sizes)), frac, "o-", label=f"{M} x {N}")
    ax.set_xticks(range(len(group_sizes)), [str(g) for g in group_sizes])
    ax.set_xlabel("GROUP_SIZE_M (1 = row-major)")
    ax.set_ylabel("distinct / requested tile bytes")
    ax.set_title(f"one wave of {programs} programs, {BM} x {BN} tiles", fontsize=10)
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.legend(title="M x N", fontsize=8)
    return ax


def config_plot(rows, ax=None, title="autotuning configs"):
    """Bars of TFLOP/s per config, one group per problem size, cuBLAS as a dashed line.
    ``rows``: (config label, size, TFLOP/s, cuBLAS TFLOP/s) tuples."""
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.8))
    labels = list(dict.fromkeys(r[0] for r in rows))
    sizes = list(dict.fromkeys(r[1] for r in rows))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        ys = [next((r[2] for r in rows if r[0] == label and r[1] == s), 0.0) for s in sizes]
        ax.bar(np.arange(len(sizes)) + i * width, ys, width, label=label)
    for j, s in enumerate(sizes):
        base = next(r[3] for r in rows if r[1] == s)
        ax.hlines(base, j - 0.1, j + 0.9, colors="black", linestyles="--",
                  label="cuBLAS" if j == 0 else None)
    ax.set_xticks(np.arange(len(sizes)) + 0.4 - width / 2, [f"{s}" for s in sizes])
    ax.set_xlabel("M = N = K")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return ax


def recorded(csv_name):
    """{(kernel, dtype, M, N, K): BenchResult} of a CSV under gemm_lessons/results/."""
    from . import results
    rows, _, _ = results.read_csv(results.HERE / csv_name)
    return {(r.kernel, str(r.dtype).replace("torch.", ""), r.M, r.N, r.K): r for _, r in rows}


def recorded_table(csv_name, kernels, columns, field="all"):
    """A text table of recorded timings: one row per kernel, one column per (dtype, size)
    with "ms, TFLOP/s, ratio x" (field="all") or only the TFLOP/s and ratio ("tflops").
    The first row is the baseline of each column (cuBLAS in the sweeps of lessons 07-08)."""
    rec = recorded(csv_name)
    cells = {}
    for name in kernels:
        for dtype, n in columns:
            r = rec[(name, dtype, n, n, n)]
            cells[name, dtype, n] = (f"{r.ms:.3f} ms, {r.tflops:.0f}, {r.ratio:.2f}x"
                                     if field == "all" else f"{r.tflops:.0f}, {r.ratio:.2f}x")
    base = {(d, n): rec[(kernels[0], d, n, n, n)] for d, n in columns}
    heads = [f"{'fp16' if d == 'float16' else 'bf16'} {n}" for d, n in columns]
    width = max(len(v) for v in cells.values()) + 1
    namew = max(len(k) for k in kernels + ["cuBLAS"]) + 1
    lines = [f"{'':{namew}}" + "".join(f"{h:>{width}}" for h in heads)]
    cub = "".join(f"{(f'{b.baseline_ms:.3f} ms, {b.baseline_tflops:.0f}' if field == 'all' else f'{b.baseline_tflops:.0f}'):>{width}}"
                  for b in base.values())
    lines.append(f"{'cuBLAS':{namew}}" + cub)
    for name in kernels:
        lines.append(f"{name:{namew}}" + "".join(f"{cells[name, d, n]:>{width}}" for d, n in columns))
    return "\n".join(lines)
