"""Plots the lessons share: the ladder (every kernel against cuBLAS) and the roofline."""
from __future__ import annotations

import matplotlib.pyplot as plt

__all__ = ["ladder_plot", "roofline_plot", "PEAKS", "gemm_intensity", "tile_intensity",
           "ladder_roofline", "mma_a_fragment_owner", "wmma_fragment_plot"]

# Datasheet peaks (dense, no sparsity): FP32 SIMT TFLOP/s, FP16 tensor-core TFLOP/s with
# FP32 accumulation, memory bandwidth in GB/s. Leads, not measurements.
PEAKS = {
    "T4":        {"fp32": 8.1,  "fp16": 65.0,  "bandwidth": 320.0},
    "A100 SXM":  {"fp32": 19.5, "fp16": 312.0, "bandwidth": 2039.0},
    "H100 SXM":  {"fp32": 67.0, "fp16": 989.0, "bandwidth": 3350.0},
    "H200 SXM":  {"fp32": 67.0, "fp16": 989.0, "bandwidth": 4800.0},
}


def gemm_intensity(M, N, K, bytes_per_elem):
    """FLOP per byte of an M x N x K GEMM that reads A and B once and writes C once."""
    return 2.0 * M * N * K / (bytes_per_elem * (M * K + K * N + M * N))


def tile_intensity(BM, BN, bytes_per_elem):
    """FLOP per byte of global traffic for a BM x BN block tile: per step of K, the block
    loads BM + BN elements and does 2 * BM * BN flops (C's traffic is negligible)."""
    return 2.0 * BM * BN / (bytes_per_elem * (BM + BN))


def roofline_plot(peak_tflops, bandwidth_gbs, points=(), title="", ax=None):
    """A roofline: min(peak, intensity x bandwidth), with labelled (name, intensity) points,
    or (name, intensity, measured TFLOP/s) points."""
    import numpy as np
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.2))
    x = np.logspace(-1, 4, 200)
    roof = np.minimum(peak_tflops, x * bandwidth_gbs / 1000.0)
    ax.loglog(x, roof, color="black", lw=2, label="roofline")
    ridge = peak_tflops * 1000.0 / bandwidth_gbs
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.text(ridge * 1.1, peak_tflops * 0.02, f"ridge {ridge:.0f} FLOP/B", color="grey", fontsize=8)
    # each point in the legend, with its intensity: labels beside points that sit close
    # together on a log axis would overlap
    for i, p in enumerate(points):
        name, ai = p[0], p[1]
        y = p[2] if len(p) > 2 and p[2] is not None else min(peak_tflops, ai * bandwidth_gbs / 1000.0)
        ax.plot([ai], [y], "os^Dvp<>"[i % 8], ms=7, label=f"{name}: {ai:.3g} FLOP/B")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of DRAM traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    return ax


def ladder_plot(results, path=None, title="gemm_lessons ladder"):
    """Bar chart of TFLOP/s per kernel (one group per size), with cuBLAS as a line per
    dtype and size. ``results``: harness.BenchResult list (timed ones only)."""
    import numpy as np
    timed = [r for r in results if r.ms is not None]
    if not timed:
        return None
    sizes = sorted({r.M for r in timed})
    names = []
    for r in timed:
        if r.kernel not in names:
            names.append(r.kernel)
    fig, ax = plt.subplots(figsize=(max(7, 0.7 * len(names) + 3), 4.5))
    width = 0.8 / len(sizes)
    for si, size in enumerate(sizes):
        xs, ys = [], []
        for ni, name in enumerate(names):
            for r in timed:
                if r.kernel == name and r.M == size:
                    xs.append(ni + si * width)
                    ys.append(r.tflops)
                    ratio = r.ratio
                    if ratio is not None:
                        ax.text(ni + si * width, r.tflops, f"{ratio:.2f}x", ha="center",
                                va="bottom", fontsize=7, rotation=90)
        ax.bar(xs, ys, width=width, label=f"{size}")
    seen = set()
    for r in timed:
        key = (str(r.dtype), r.M)
        if r.baseline_tflops and key not in seen:
            seen.add(key)
            ax.axhline(r.baseline_tflops, ls="--", lw=0.8, color="grey")
            ax.text(len(names) - 0.5, r.baseline_tflops,
                    f"cuBLAS {str(r.dtype).replace('torch.', '')} {r.M}", fontsize=7,
                    va="bottom", ha="right", color="grey")
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(names)) + width * (len(sizes) - 1) / 2)
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s (log scale); label: ratio to cuBLAS of the same dtype")
    ax.set_title(title)
    ax.legend(title="M = N = K", fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def ladder_roofline(results, peaks, title="the ladder on the roofline"):
    """Every timed kernel of a ladder on its roofline, one panel per kind of arithmetic:
    fp32 kernels under the FP32 SIMT peak, fp16/bf16 kernels under the tensor-core peak, both
    under the memory slope. ``peaks``: a PEAKS entry (TFLOP/s and GB/s). A kernel's x is the
    intensity of its GEMM with A, B and C moved once (``gemm_intensity``); its y, the TFLOP/s
    measured; cuBLAS of the same precision as a star."""
    import numpy as np
    timed = [r for r in results if r.ms is not None]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    panels = (("fp32: FP32 SIMT peak", lambda r: r.dtype.itemsize == 4, peaks["fp32"]),
              ("fp16 / bf16: tensor-core peak", lambda r: r.dtype.itemsize == 2, peaks["fp16"]))
    for ax, (name, keep, peak) in zip(axes, panels):
        rows = [r for r in timed if keep(r)]
        x = np.logspace(0, 4, 200)
        ax.loglog(x, np.minimum(peak, x * peaks["bandwidth"] / 1000.0), color="black", lw=2)
        ridge = peak * 1000.0 / peaks["bandwidth"]
        ax.axvline(ridge, color="grey", ls=":", lw=1)
        ax.text(ridge * 1.1, peak * 0.012, f"ridge {ridge:.0f} FLOP/B", color="grey", fontsize=8)
        kernels = []
        for r in rows:
            if r.kernel not in kernels:
                kernels.append(r.kernel)
        cmap = plt.get_cmap("tab20")
        for i, k in enumerate(kernels):
            pts = [r for r in rows if r.kernel == k]
            ax.plot([gemm_intensity(r.M, r.N, r.K, r.dtype.itemsize) for r in pts],
                    [r.tflops for r in pts], "o", color=cmap(i % 20), label=k)
        base = [r for r in rows if r.baseline_ms is not None]
        if base:
            ax.plot([gemm_intensity(r.M, r.N, r.K, r.dtype.itemsize) for r in base],
                    [r.baseline_tflops for r in base], "*", color="black", ms=10, label="cuBLAS")
        ax.set_xlim(1, 1e4)
        ax.set_ylim(peak * 1e-3, peak * 2)
        ax.set_xlabel("FLOP per byte (A, B and C moved once)")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{name} {peak:g} TFLOP/s, {peaks['bandwidth'] / 1000:g} TB/s", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.suptitle(title)
# ------------------------------------------------------------------ lesson 05: fragments
def mma_a_fragment_owner():
    """16 x 16 array: the lane that holds each element of a 16x16 fp16 A tile, as one
    ``ldmatrix.x4`` loads it on sm_80 and later (the layout of ``mma.m16n8k16``): lane l
    holds rows l/4 and l/4 + 8, columns 2(l%4), 2(l%4)+1 and the same + 8."""
    import numpy as np
    owner = np.zeros((16, 16), int)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r in (g, g + 8):
            for c in (2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9):
                owner[r, c] = lane
    return owner


def wmma_fragment_plot(lanes=(0, 5)):
    """Which lane of a warp holds which element of a 16x16 fp16 A tile (sm_80+), and the
    four 32-bit registers of two chosen lanes, each holding two neighbouring halves."""
    import numpy as np
    owner = mma_a_fragment_owner()
    fig, axes = plt.subplots(1, 1 + len(lanes), figsize=(4.4 * (1 + len(lanes)), 4.6))
    axes[0].imshow(owner, cmap="viridis")
    for r in range(16):
        for c in range(16):
            axes[0].text(c, r, owner[r, c], ha="center", va="center", fontsize=5.5,
                         color="white" if owner[r, c] < 16 else "black")
    axes[0].set_title("the lane that holds each element", fontsize=10)
    for lane, ax in zip(lanes, axes[1:]):
        ax.imshow(owner == lane, cmap="Greys", vmin=0, vmax=1.5)
        rows, cols = np.nonzero(owner == lane)
        # register k holds a pair of neighbouring halves: (row g, cols 2t..2t+1) = R0,
        # (row g+8) = R1, (row g, cols +8) = R2, (row g+8, cols +8) = R3 (mma.m16n8k16's a0..a3)
        for r, c in zip(rows, cols):
            reg = (r >= 8) + 2 * (c >= 8)
            ax.text(c, r, f"R{reg}", ha="center", va="center", color="crimson", fontsize=7)
        ax.set_title(f"lane {lane}: 8 halves in 4 registers", fontsize=10)
    for ax in axes:
        ax.set_xticks([0, 8, 15])
        ax.set_yticks([0, 8, 15])
        ax.set_xlabel("column (k)")
        ax.set_ylabel("row (m)")
    fig.suptitle("a 16x16 fp16 A fragment across the 32 lanes of a warp (sm_80 and later)",
                 fontsize=11)
    fig.tight_layout()
    return fig
# ------------------------------------------------------------------ lesson 04's pictures
def outer_product_plot(TM=8, TN=16, ax=None):
    """One k of a thread's register tile: TM values of A's column k (rA) and TN values of
    B's row k (rB), loaded once each, meet in TM x TN multiply-adds into ``acc``."""
    import numpy as np
    from matplotlib.patches import Rectangle
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.2))
    ax.set_aspect("equal")
    ax.axis("off")
    for i in range(TM):                       # rA: a column, left of the tile
        ax.add_patch(Rectangle((-2, i), 1, 1, fc="tab:blue", ec="white", alpha=0.7))
    for j in range(TN):                       # rB: a row, above the tile
        ax.add_patch(Rectangle((j, -2), 1, 1, fc="tab:orange", ec="white", alpha=0.7))
    shade = np.add.outer(np.arange(TM), np.arange(TN)) / (TM + TN)
    for i in range(TM):
        for j in range(TN):
            ax.add_patch(Rectangle((j, i), 1, 1, fc=plt.cm.Greens(0.3 + 0.4 * shade[i, j]),
                                   ec="white"))
    ax.text(-1.5, TM + 0.9, f"rA\n{TM} values\n({TM // 4} float4)", ha="center", va="top",
            fontsize=8)
    ax.text(TN + 0.3, -1.5, f"rB: {TN} values ({TN // 4} float4)", va="center", fontsize=8)
    ax.text(TN / 2, TM + 0.9, f"acc[i, j] += rA[i] * rB[j]: {TM * TN} FMAs per "
            f"{(TM + TN) // 4} shared loads", ha="center", va="top", fontsize=9)
    ax.set_xlim(-2.5, TN + 6)
    ax.set_ylim(TM + 3, -2.5)
    ax.set_title(f"one k of a {TM} x {TN} register tile", fontsize=10)
    return ax


def warp_tile_map(BM, BN, WM, WN, TM, TN, lanes=(0, 1), ax=None):
    """Which outputs of a BM x BN block tile each warp computes (colours), and the TM x TN
    outputs of some lanes of warp 0 (dots): (TM/4) x (TN/4) blocks of 4 x 4, spaced
    4*(WM/TM) rows and 4*(WN/TN) columns apart."""
    import numpy as np
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 6 * BM / BN + 0.6))
    LM, LN, warps_n = WM // TM, WN // TN, BN // WN
    owner = np.zeros((BM, BN))
    for wm in range(BM // WM):
        for wn in range(warps_n):
            owner[wm * WM:(wm + 1) * WM, wn * WN:(wn + 1) * WN] = wm * warps_n + wn
    ax.imshow(owner, cmap="Pastel1", interpolation="nearest")
    for lane, colour in zip(lanes, ("black", "tab:blue", "tab:red", "tab:green")):
        am, bn = (lane // LN) * 4, (lane % LN) * 4
        rows = [am + g * 4 * LM + i for g in range(TM // 4) for i in range(4)]
        cols = [bn + h * 4 * LN + j for h in range(TN // 4) for j in range(4)]
        ax.scatter([c for r in rows for c in cols], [r for r in rows for c in cols], s=2,
                   c=colour, label=f"warp 0, lane {lane}: {TM} x {TN} outputs")
    ax.set_title(f"{BM} x {BN} block tile: {(BM // WM) * warps_n} warps of {WM} x {WN}, "
                 f"lanes in a {LM} x {LN} grid", fontsize=10)
    ax.set_xlabel("column of the block tile")
    ax.set_ylabel("row")
    ax.legend(loc="lower left", fontsize=8)
    return ax


def overlapped_loop_plot(BK=8, tiles=2, ax=None):
    """The overlapped main loop over ``tiles`` tiles: per k step, the fragment loads of the
    next k (shared -> registers) beside the multiply-adds of this k; before each tile's
    last step, the next tile stored to the other buffer and the one barrier."""
    from matplotlib.patches import Rectangle
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.6))
    lanes = {"FMA (this k)": 2, "LDS fragments (next k)": 1, "tile: store, barrier": 0}
    for t in range(tiles):
        for j in range(BK):
            x = t * BK + j
            ax.add_patch(Rectangle((x, 2), 0.95, 0.8, fc="tab:green", alpha=0.6))
            ax.text(x + 0.47, 2.4, f"k{j}", ha="center", va="center", fontsize=7)
            nxt = f"k{j + 1}" if j < BK - 1 else "k0'"
            ax.add_patch(Rectangle((x, 1), 0.95, 0.8, fc="tab:orange", alpha=0.6))
            ax.text(x + 0.47, 1.4, nxt, ha="center", va="center", fontsize=7)
        x = t * BK + BK - 1
        ax.add_patch(Rectangle((x - 0.5, 0), 0.45, 0.8, fc="tab:blue", alpha=0.6))
        ax.plot([x - 0.02] * 2, [-0.1, 2.9], color="black", lw=1.5)
        ax.text(x - 0.02, -0.35, "barrier", ha="center", fontsize=7)
    ax.set_yticks([lanes[k] + 0.4 for k in lanes], list(lanes), fontsize=8)
    ax.set_xticks([t * BK for t in range(tiles)], [f"tile {t}" for t in range(tiles)])
    ax.set_xlim(-0.2, tiles * BK)
    ax.set_ylim(-0.6, 3)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    ax.set_title("overlapped main loop: the last step of a tile hides the next tile's first "
                 "loads", fontsize=10)
    ax.figure.tight_layout()
    return ax


def occupancy_plot(rows, ax=None):
    """Warps resident per SM for ``[(kernel, warps per SM, limiting resource), ...]``."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1))
    names = [r[0] for r in rows][::-1]
    warps = [r[1] for r in rows][::-1]
    ax.barh(names, warps, color="tab:purple", alpha=0.7)
    for y, (w, why) in enumerate(zip(warps, [r[2] for r in rows][::-1])):
        ax.text(w + 0.5, y, f"{w} ({why})", va="center", fontsize=8)
    ax.set_xlim(0, 72)
    ax.axvline(64, color="grey", ls=":")
    ax.set_xlabel("warps resident per SM (64 at most)")
    ax.set_title("occupancy from the ptxas report", fontsize=10)
    ax.figure.tight_layout()
    return ax
# ------------------------------------------------------------ lesson 06: pipeline timelines
def pipeline_schedule(n_tiles, stages, latency=3.0, math=1.0):
    """A model of a cp.async pipeline: per tile (issue, land, start, end) times when a copy
    takes ``latency`` and the math on a tile ``math``, copies overlap each other freely and
    the copy of tile t + stages - 1 is issued when the math on tile t starts (after the
    wait and the barrier). ``stages=1`` is lesson 05: load, wait, compute, then the next
    load."""
    issue, land, start, end = {}, {}, {}, {}
    if stages == 1:
        free = 0.0
        for t in range(n_tiles):
            issue[t] = free
            land[t] = issue[t] + latency
            start[t], end[t] = land[t], land[t] + math
            free = end[t]
        return issue, land, start, end
    for t in range(min(stages - 1, n_tiles)):
        issue[t] = 0.0
    prev_end = 0.0
    for t in range(n_tiles):
        land[t] = issue[t] + latency
        start[t] = max(prev_end, land[t])              # wait_group + syncthreads
        if t + stages - 1 < n_tiles:
            issue[t + stages - 1] = start[t]           # into the stage tile t - 1 used
        end[t] = prev_end = start[t] + math
    return issue, land, start, end


def pipeline_timeline(depths=((1, "lesson 05"), (2, "2 stages"), (4, "4 stages")),
                      n_tiles=8, latency=3.0, math=1.0):
    """Copies in flight (light bars) and tensor-core math (dark bars) per tile for each
    pipeline depth of :func:`pipeline_schedule`; colour = the shared buffer a tile uses."""
    fig, ax = plt.subplots(figsize=(11, 1.6 * len(depths) + 0.8))
    colors = plt.cm.tab10.colors
    ticks, labels = [], []
    for row, (stages, label) in enumerate(depths):
        issue, land, start, end = pipeline_schedule(n_tiles, stages, latency, math)
        y = 3.2 * (len(depths) - 1 - row)
        lanes = max(stages - 1, 1)                     # copies in flight at once
        h = 1.2 / lanes
        for t in range(n_tiles):
            buf = t % stages
            yc = y + 0.9 + (t % lanes) * h
            ax.barh(yc, land[t] - issue[t], left=issue[t], height=0.9 * h, align="edge",
                    color=colors[buf], alpha=0.45, edgecolor="k", linewidth=0.3)
            ax.text(issue[t] + 0.3, yc + 0.45 * h, str(t), va="center", fontsize=7)
            ax.barh(y, end[t] - start[t], left=start[t], height=0.7, color=colors[buf],
                    edgecolor="k")
            ax.text(start[t] + math / 2, y, str(t), ha="center", va="center", fontsize=8)
        ax.text(-0.5, y + 0.8, f"{label}\n{max(end.values()):g} units", ha="right",
                va="center", fontsize=9)
        ticks += [y, y + 1.5]
        labels += ["math", "copies"]
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_xlabel(f"time (model units: a copy takes {latency:g}, the math on a tile "
                  f"{math:g})")
    ax.set_xlim(-7, None)
    ax.set_title(f"{n_tiles} K-tiles: copies in flight (light) and tensor-core math (dark), "
                 "colour = shared buffer")
    fig.tight_layout()
    return fig


def _segments(ax, y, segs, height=0.6):
    for left, width, color, text in segs:
        ax.barh(y, width, left=left, height=height, color=color, edgecolor="k", linewidth=0.4)
        if text:
            ax.text(left + width / 2, y, text, ha="center", va="center", fontsize=7)


def fragment_timeline(ksteps=4, load=0.4, mma=1.0, barrier=0.5):
    """Inside one warp, two k-tiles of ``ksteps`` 16-deep slices, in a model where the
    tensor cores are the bottleneck (so an instruction written after a slice's math issues
    when that math ends): ``k06_multistage`` takes the barrier, then per slice loads the
    fragments (``ldmatrix``, ``load``) and only then multiplies (``mma``), so each load
    waits in full; ``k06_cp_async`` loads slice k + 1 while slice k is multiplied, and
    takes the barrier and the next tile's first loads during the last slice's math."""
    fig, ax = plt.subplots(figsize=(11, 2.8))
    c_bar, c_ld, c_mma = "0.75", "tab:orange", "tab:blue"
    issue1, tc1, t = [], [], 0.0                      # k06_multistage
    for tile in range(2):
        issue1.append((t, barrier, c_bar, "bar"))
        t += barrier
        for k in range(ksteps):
            issue1.append((t, load, c_ld, f"ld {k}"))
            tc1.append((t + load, mma, c_mma, f"mma {k}"))
            t += load + mma
    end1 = t
    # k06_cp_async: slot 0 is loaded before the loop; the loads of slice k + 1 (or the
    # barrier and the next tile's slice 0) run beside the math of slice k
    issue2 = [(0.0, barrier, c_bar, "bar"), (barrier, load, c_ld, "ld 0")]
    tc2, t = [], barrier + load
    for tile in range(2):
        for k in range(ksteps):
            tc2.append((t, mma, c_mma, f"mma {k}"))
            if k + 1 < ksteps:
                issue2.append((t, load, c_ld, f"ld {k + 1}"))
                t = max(t + mma, t + load)
            elif tile == 0:
                issue2.append((t, barrier, c_bar, "bar"))
                issue2.append((t + barrier, load, c_ld, "ld 0"))
                t = max(t + mma, t + barrier + load)
            else:
                t += mma
    end2 = t
    _segments(ax, 3.0, issue1)
    _segments(ax, 2.3, tc1)
    _segments(ax, 1.0, issue2)
    _segments(ax, 0.3, tc2)
    ax.set_yticks([3.0, 2.3, 1.0, 0.3], ["loads, barrier", "tensor cores"] * 2, fontsize=8)
    ax.text(-0.3, 2.65, f"k06_multistage\n{end1:g} units", ha="right", va="center",
            fontsize=9)
    ax.text(-0.3, 0.65, f"k06_cp_async\n{end2:g} units", ha="right", va="center", fontsize=9)
    ax.set_xlim(-4.5, max(end1, end2) + 0.5)
    ax.set_xlabel(f"time (model units: a slice's fragment loads {load:g}, its math {mma:g}, "
                  f"the barrier {barrier:g})")
    ax.set_title(f"One warp, two k-tiles of {ksteps} slices: fragments loaded before the "
                 "math, or during the previous slice's math")
    fig.tight_layout()
    return fig


def wgmma_timeline(ksteps=4, mma=1.0, issue=0.2, copies=0.6, tiles=3):
    """One warpgroup of ``k06_wgmma`` over a few k-tiles: the threads issue the tile's
    ``ksteps`` wgmma (no fragments: the tensor cores read shared memory), then the copies
    of a later tile, then wait for the previous tile's products; the tensor cores work
    through the queued wgmma meanwhile."""
    fig, ax = plt.subplots(figsize=(11, 2.0))
    c_is, c_cp, c_wait, c_mma = "tab:orange", "tab:green", "0.75", "tab:blue"
    thr, tc = [], []
    t, tc_free = 0.0, 0.0
    for tile in range(tiles):
        thr.append((t, issue * ksteps, c_is, f"{ksteps} wgmma"))
        start = max(t + issue, tc_free)
        for k in range(ksteps):
            tc.append((start + k * mma, mma, c_mma, f"t{tile} k{k}"))
        done_prev = tc_free                            # tile - 1's products
        tc_free = start + ksteps * mma
        t += issue * ksteps
        thr.append((t, copies, c_cp, "copies"))
        t += copies
        if done_prev > t:
            thr.append((t, done_prev - t, c_wait, "wait(1)"))
            t = done_prev
    _segments(ax, 1.0, thr)
    _segments(ax, 0.3, tc)
    ax.set_yticks([1.0, 0.3], ["threads (issue)", "tensor cores"], fontsize=8)
    ax.set_xlabel("time (model units: one wgmma 64xNx16 takes 1)")
    ax.set_title("k06_wgmma: the threads issue and copy while the tensor cores work "
                 "through the queued wgmma")
    fig.tight_layout()
    return fig
