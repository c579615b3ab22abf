"""Ladder results recorded on a GPU, shipped with the package so that every learner (and
lesson 10 on a laptop) can read the numbers measured by ``python -m gemm_lessons ladder``.

    python -m gemm_lessons ladder --csv gemm_lessons/results/h200_ladder.csv --out gemm_lessons/results/h200_ladder.png
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

import torch

from .common import dtype_name
from .harness import BenchResult

HERE = Path(__file__).resolve().parent / "results"
FIELDS = ["kernel", "lesson", "dtype", "M", "N", "K", "ms", "baseline_ms", "device", "versions"]


def versions_text(versions):
    """A recording's ``versions`` column: ``{"torch": "2.11.0", ...}`` as "torch 2.11.0; ..."."""
    return "; ".join(f"{k} {v}" for k, v in versions.items())


def row(kernel, lesson, dtype, M, N, K, ms, baseline_ms, *, device, versions):
    """One recorded row: ``ms`` the measured time, ``baseline_ms`` the time it is compared
    with in the same run; ``dtype`` a torch dtype or its name; ``versions`` a dict (see
    :func:`versions_text`) or the column's text."""
    return {"kernel": kernel, "lesson": lesson,
            "dtype": dtype if isinstance(dtype, str) else dtype_name(dtype),
            "M": M, "N": N, "K": K, "ms": f"{ms:.6f}", "baseline_ms": f"{baseline_ms:.6f}",
            "device": device,
            "versions": versions if isinstance(versions, str) else versions_text(versions)}


def merge_csv(path, new, *, keep=True):
    """Write the rows ``new`` (:func:`row`) to the CSV at ``path``. With ``keep``, the rows
    already there stay, except those of a kernel and shape that ``new`` measures again."""
    path = Path(path)
    done = {(r["kernel"], int(r["M"]), int(r["N"]), int(r["K"])) for r in new}
    old = list(csv.DictReader(open(path, newline=""))) if keep and path.exists() else []
    kept = [r for r in old if (r["kernel"], int(r["M"]), int(r["N"]), int(r["K"])) not in done]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(kept + list(new))
    return len(kept)


def write_csv(path, results, lessons, *, device, versions, keep=False):
    """Write ladder results (``BenchResult``) to the CSV at ``path``; with ``keep``, the rows
    of kernels and shapes not measured again stay (:func:`merge_csv`)."""
    merge_csv(path, [row(r.kernel, lesson, r.dtype, r.M, r.N, r.K, r.ms, r.baseline_ms,
                         device=device, versions=versions)
                     for r, lesson in zip(results, lessons)], keep=keep)


def read_csv(path=None):
    """[(lesson, BenchResult)], device, versions from a recorded ladder."""
    path = Path(path) if path else HERE / "h200_ladder.csv"
    rows, device, versions = [], "", ""
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if not row["ms"]:               # a row that records a failure
                continue
            r = BenchResult(row["kernel"], getattr(torch, row["dtype"]), int(row["M"]),
                            int(row["N"]), int(row["K"]), ms=float(row["ms"]),   # no baseline
                            baseline_ms=float(row["baseline_ms"] or "nan"))      # timed: NaN
            rows.append((int(row["lesson"] or 0), r))      # 0: no lesson's (kernel="auto")
            device, versions = row["device"], row["versions"]
    return rows, device, versions


# ------------------------------------------------------------------ figures quoted in prose
# A measured figure in a notebook's markdown or in README.md is written as
#     <span data-fig="k04_register_tiling 4096 ratio">0.90</span>x
# and ``python tools/render_figures.py`` fills every such span from the recorded CSV
# (tests/test_figures.py fails when one differs), so no two texts can quote the same
# measurement differently. The key: ``[file.csv] kernel [dtype] size field`` where size is
# ``4096`` (a cube) or ``2048x11008x4096``, dtype defaults to the kernel's first row's, and
# field is one of FIELD_FORMATS (``times_baseline``: ms / baseline_ms, for costs where more
# is worse, as in ``h200_launch_cost.csv``'s host times).
FIELD_FORMATS = {
    "ratio": lambda r: f"{r.ratio:.2f}",
    "tflops": lambda r: f"{r.tflops:.1f}",
    "baseline_tflops": lambda r: f"{r.baseline_tflops:.1f}",
    "ms": lambda r: f"{r.ms:.3f}",
    "baseline_ms": lambda r: f"{r.baseline_ms:.3f}",
    "us": lambda r: f"{r.ms * 1e3:.1f}",
    "times_baseline": lambda r: _times(r.ms / r.baseline_ms),    # the inverse of ratio
}


def _times(x):
    return f"{x:.2f}" if x < 1 else f"{x:.1f}"


class FigureError(KeyError):
    """A quoted figure whose key names nothing in the recorded CSV."""

    def __str__(self):
        return self.args[0]


def figure(key: str) -> str:
    """The recorded value a ``data-fig`` key names, formatted as prose quotes it."""
    words = key.split()
    path = None
    if words and words[0].endswith(".csv"):
        path = HERE / words.pop(0)
    if len(words) not in (3, 4):
        raise FigureError(f"figure key {key!r}: want '[file.csv] kernel [dtype] size field'")
    kernel, *dtype, size, field = words
    if field not in FIELD_FORMATS:
        raise FigureError(f"figure key {key!r}: field {field!r} is not one of "
                          f"{', '.join(FIELD_FORMATS)}")
    dims = [int(x) for x in size.split("x")]
    M, N, K = dims * 3 if len(dims) == 1 else dims
    if path is not None and not path.exists():
        raise FigureError(f"figure key {key!r}: gemm_lessons/results/{path.name} does not "
                          "exist (it is written on a GPU by the tool that records it)")
    rows, _, _ = _read_cached(str(path) if path else None)
    hits = [r for _, r in rows if r.kernel == kernel and (r.M, r.N, r.K) == (M, N, K)
            and (not dtype or dtype_name(r.dtype) == dtype[0])]
    if not hits:
        raise FigureError(f"figure key {key!r}: no such row in "
                          f"{path.name if path else 'h200_ladder.csv'}")
    return FIELD_FORMATS[field](hits[0])


_CACHE = {}


def _read_cached(path):
    if path not in _CACHE:
        _CACHE[path] = read_csv(path)
    return _CACHE[path]


# ------------------------------------------------------------------ recorded Nsight Compute runs
RECORDED = HERE / "recorded"


class NcuLaunch:
    """One kernel launch in a recorded ``ncu`` report (``tools/record_ncu.sh``): its name as
    ncu prints it, its grid and block, and the numeric metrics of its sections."""

    def __init__(self, name, grid, block):
        self.name, self.grid, self.block = name, grid, block
        self.metrics = {}                 # "Elapsed Cycles" -> 76613.0, ...

    @property
    def short_name(self):
        """The name without ``void``, template arguments and parameters."""
        name = self.name[5:] if self.name.startswith("void ") else self.name
        for stop in "<([":
            name = name.split(stop, 1)[0]
        return name.strip()

    def __getitem__(self, metric):
        return self.metrics[metric]

    def __repr__(self):
        return f"NcuLaunch({self.short_name!r}, grid={self.grid}, block={self.block})"


def _dims(text):
    return tuple(int(x) for x in text.split(","))


def read_ncu(name):
    """(command, preamble, [NcuLaunch]) of the recording ``name`` in
    ``gemm_lessons/results/recorded``: the command line that made it (its first line, after
    ``$ ``), what the profiled program printed before the first launch (lines), and each
    profiled launch in order, with the metrics whose values are numbers (``1,024`` read as
    1024)."""
    lines = (RECORDED / name).read_text().splitlines()
    if not lines or not lines[0].startswith("$ "):
        raise ValueError(f"{name}: a recording starts with '$ ' and the command that made it")
    head = re.compile(r"^  (\S.*) \(([\d, ]+)\)x\(([\d, ]+)\), Context ")
    launches, preamble = [], []
    for line in lines[1:]:
        m = head.match(line)
        if m:
            launches.append(NcuLaunch(m.group(1), _dims(m.group(2)), _dims(m.group(3))))
            continue
        if not launches:
            if not re.match(r"^\[\d+\] ", line):     # ncu's line naming the process
                preamble.append(line)
            continue
        if not line.startswith("    ") or line.startswith("     "):
            continue                      # an advice paragraph
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) in (2, 3):
            value = parts[-1].replace(",", "")
            wide = re.fullmatch(r"[^\d\s]\S* ([\d.]+)", value)
            if len(parts) == 2 and wide:      # a value too wide for its column: one space
                value = wide.group(1)         # after its unit ("inst 9,643,229,184")
            try:
                launches[-1].metrics[parts[0]] = float(value)
            except ValueError:
                pass                      # a table's header or rule, a policy's name
    return lines[0][2:], preamble, launches
