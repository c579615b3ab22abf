"""Lesson 04's demonstrations, above the API: the deliberate bug of the float4 steps, and
a launch of any lesson-04 kernel traced in the simulator (bank counters, loop events).

    from gemm_lessons.labs import k04
    print(k04.unpadded_failure())      # the launcher without its copy: misaligned address

The lesson reads its longer diffs a part at a time with :func:`show_diff_part` (and a part
of a source with :func:`show_part`), the same functions as lesson 06's lab.
"""
from __future__ import annotations

import re

import torch

from .. import common, compiled, counters, engines, harness
from ..common import run_on_simulator
from ..occupancy import occupancy as occupancy_of
from ..common import cdiv
from ..kernels import k04_tiles
from .k06 import show_diff_part, show_part  # noqa: F401  (the lesson reads diffs in parts)

RAGGED = harness.Case("ragged", 21, 24, 19, hint="K % 4 != 0: rows of A not 16-byte aligned")


def _unpadded_here():
    from ..kernels.k04_vectorized import launch_unpadded
    try:
        harness.check(launch_unpadded, "launch_unpadded", cases=[RAGGED])
    except IndexError as exc:            # the simulator's (and the GPU's) misaligned address
        # the instruction and the error, without the thread that met it first (any thread)
        m = re.search(r"(\w+): misaligned address", str(exc))
        return f"{type(exc).__name__}: {m.group(0) if m else str(exc).splitlines()[0]}"
    return "no error: the float4 loads happened to be aligned"


def unpadded_failure() -> str:
    """``k04_vectorized`` launched without the copy into float4-ready buffers, on a
    21 x 24 x 19 product: the error line. Always run in the simulator (on a GPU the
    misaligned load is fatal to the CUDA context of the process)."""
    return common.run_on_simulator("gemm_lessons.labs.k04:_unpadded_here")


def _trace_here(name, cfg, M, N, K, seed):
    from ..kernels import k04_register_tiling as lesson
    make = {k.name: k.source for k in lesson.KERNELS}[name]
    kernel = make(**cfg)
    a, b = harness.make_operands(M, N, K, seed=seed)
    c = torch.full((M, N), float("nan"))
    tiles = k04_tiles.Tiles(**cfg)
    grid = (cdiv(N, cfg["BN"]), cdiv(M, cfg["BM"]))
    vector = name not in ("k04_1d_tiling", "k04_2d_tiling")
    a4, b4 = (k04_tiles.padded4(a), k04_tiles.padded4(b)) if vector else (a, b)
    vec_c = int(N % 4 == 0 and c.data_ptr() % 16 == 0)   # as the launcher decides
    args = [engines.as_numba(x) for x in (a4, b4, c)] + ([vec_c] if vector else [])
    with counters.trace(A=a4, B=b4, C=c) as t:
        kernel[grid, tiles.threads](*args)
    ok = harness.compare(c, harness.reference(a, b), a, b, torch.float32)[0]
    return t, bool(ok)


def trace(name, cfg, M, N, K, *, seed=0):
    """(trace, correct) of one launch of lesson-04 kernel ``name`` with tile sizes ``cfg``
    (any, e.g. its GPU configuration) on seeded M x N x K inputs, in the simulator."""
    return run_on_simulator("gemm_lessons.labs.k04:_trace_here", name, dict(cfg),
                                  M, N, K, seed)


# ------------------------------------------------------------- PTX, SASS and occupancy
def ptx_of(names, cc=(9, 0)):
    """{name: PTX} of registered numba kernels' GPU configurations, compiled in one process
    (here on a GPU, else in one child process with the simulator off)."""
    return compiled.ptx_many(names, cc)


def sass(ptx_text):
    """The SASS ptxas makes of ``ptx_text``, disassembled without a GPU (None where the tools
    are missing): :func:`gemm_lessons.compiled.sass`."""
    return compiled.sass(ptx_text)


_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")


def main_loop_mix(sass_text):
    """{opcode (without modifiers): count} of the main loop: the backward branch whose body
    holds the most FFMAs. Also 'total' (instructions in it)."""
    from collections import Counter
    lines = sass_text.splitlines()
    labels, instrs = {}, []
    for line in lines:
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(instrs)
        m = _INSTR.search(line)
        if m:
            instrs.append((m.group(3), m.group(4)))
    best = Counter()
    for end, (op, rest) in enumerate(instrs):
        m = re.search(r"\(?(\.L_x_\d+)", rest) if op == "BRA" else None
        if m and labels.get(m.group(1), end + 1) <= end:
            body = Counter(o.split(".")[0] for o, _ in instrs[labels[m.group(1)]:end + 1])
            if body["FFMA"] > best["FFMA"]:
                best = body
    best["total"] = sum(v for k, v in best.items() if k != "total")
    return dict(best)


def occupancy(registers, smem_bytes, threads, cc=(9, 0)):
    """Blocks per SM each resource allows, the resident blocks (the least) and the
    occupancy (resident warps / the SM's most): :func:`gemm_lessons.occupancy.occupancy`
    (the limits and their sources are there), as a dict for the lesson's table."""
    o = occupancy_of(registers, smem_bytes, threads, cc)
    return dict(by=o.caps, blocks=o.blocks, warps=o.warps, limit=o.limiter,
                occupancy=o.fraction)


_ORDER = [("ld.global", r"\bld\.global"), ("st.shared", r"\bst\.shared"),
          ("bar.sync", r"\bbar\.sync"), ("math", r"\b(?:ld\.shared|fma\.rn)"),
          ("st.global", r"\bst\.global")]


def memory_order(ptx_text):
    """The order of a kernel's memory instructions and barriers in its PTX, up to its first
    store to C: each line classed as ld.global, st.shared, bar.sync or math (shared loads
    and FMAs), a run of lines of one class written once."""
    seq = []
    for line in ptx_text.splitlines():
        kind = next((k for k, pat in _ORDER if re.search(pat, line)), None)
        if kind == "st.global":
            break
        if kind is not None and (not seq or seq[-1] != kind):
            seq.append(kind)
    return seq
