"""Regenerate the lesson tables in README.md from the registry and the notebooks.

The lesson table (with an "open in Colab" link per notebook, built from ``REPO_URL`` in
tools/colab.py) sits between ``<!-- lessons:start -->`` and ``<!-- lessons:end -->``; the
table of which lessons run where, derived from each kernel's ``min_cc``/``cc_below`` in the
registry, between ``<!-- runs-where:start -->`` and ``<!-- runs-where:end -->``.

    python tools/update_readme.py            # rewrite README.md
    python tools/update_readme.py --check    # exit 1 if README.md is out of date
"""
from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from colab import colab_url  # noqa: E402

START, END = "<!-- lessons:start -->", "<!-- lessons:end -->"
WHERE_START, WHERE_END = "<!-- runs-where:start -->", "<!-- runs-where:end -->"

# Where learners run the course: (column heading, compute capability or None for no GPU,
# what that GPU lacks). The cells of the table come from the registry, not from this list.
MACHINES = [
    ("laptop (no GPU)", None, ""),
    ("Colab T4 (sm_75)", (7, 5), "no cp.async, no wgmma"),
    ("A100 (sm_80)", (8, 0), "no wgmma, no TMA"),
    ("H100/H200 (sm_90)", (9, 0), ""),
]


def _title(nb_path):
    for cell in json.loads(nb_path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            first = "".join(cell["source"]).strip().splitlines()[0]
            return first.lstrip("# ").split("—", 1)[-1].strip()
    return nb_path.stem


def _checked(nb_path):
    """The kernels a notebook's checkpoints name (``gl.check("...")``, ``gl.check_anywhere``)."""
    code = "\n".join("".join(c["source"]) for c in json.loads(nb_path.read_text())["cells"]
                     if c["cell_type"] == "code")
    return set(re.findall(r"""check(?:_anywhere)?\(\s*["'](\w+)["']""", code))


def kernels_by_notebook(kernels, notebooks):
    """{notebook: its lesson's kernels}. A lesson taught in several notebooks lists each
    kernel under the first of them whose checkpoint checks it (else under its first)."""
    out = {nb: [] for nb in notebooks}
    for k in kernels:
        mine = [nb for nb in notebooks if int(nb.name[:2]) == k.lesson]
        if mine:
            out[next((nb for nb in mine if k.name in _checked(nb)), mine[0])].append(k)
    return out


def table():
    import gemm_lessons as gl
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    by_notebook = kernels_by_notebook(gl.kernels(), notebooks)
    rows = ["| # | notebook | what it teaches | kernels (`gl.kernels()`) | Colab |",
            "|---|---|---|---|---|"]
    for nb in notebooks:
        n = int(nb.name[:2])
        ks = ", ".join(f"`{k.name}` ({'/'.join(k.dtype_names)})" for k in by_notebook[nb])
        link = f"[open in Colab]({colab_url(f'notebooks/{nb.name}')})"
        rows.append(f"| {n:02d} | [{nb.stem}](notebooks/{nb.name}) | {_title(nb)} | "
                    f"{ks or '-'} | {link} |")
    rows += ["",
             "On Colab, each notebook's first cell installs the course (elsewhere that cell "
             "does nothing).",
             "To read the course as a website, with every stored output and plot: "
             "`python tools/build_site.py`",
             "writes it to `build/site/` (open `index.html`)."]
    return "\n".join(rows)


def _where(kernels, cc):
    """One cell of the runs-where table: where a lesson's kernels run on a machine."""
    if not kernels:
        return "yes"
    # a GPU-only (Gluon) kernel this machine's GPU lacks the instructions of runs nowhere here
    nowhere = [k.name for k in kernels if not k.simulator and (cc is None or not k.runs_on(cc))]
    also = ("; not run: " + ", ".join(f"`{n}`" for n in nowhere)) if nowhere else ""
    kernels = [k for k in kernels if k.name not in nowhere]
    if cc is None:
        return "simulator" + also
    on_gpu = [k.name for k in kernels if k.runs_on(cc)]
    off = [k.name for k in kernels if not k.runs_on(cc)]
    if not off:
        return "GPU" + also
    if not on_gpu:
        return "simulator" + also
    return "GPU; simulator: " + ", ".join(f"`{n}`" for n in off) + also


def where_table():
    import gemm_lessons as gl
    lines = [
        "Where each lesson's kernels run, from the compute capability each kernel needs "
        "(`min_cc` in `gl.kernels()`). \"simulator\" means numba's CUDA simulator or "
        "Triton's interpreter on CPU tensors and tiny shapes: the lesson runs, its timings "
        "mean nothing. " + "; ".join(f"{name}: {lacks}" for name, _, lacks in MACHINES if lacks)
        + ".",
        "",
        "| # | " + " | ".join(name for name, _, _ in MACHINES) + " |",
        "|---|" + "---|" * len(MACHINES),
    ]
    needs = {}
    for k in gl.kernels():
        if tuple(k.min_cc) >= (8, 0) or k.cc_below is not None:
            cc = "sm_" + "".join(map(str, k.min_cc))
            if k.cc_below is not None:
                cc += " (" + ".".join(map(str, k.min_cc[:1])) + ".x only)"
            needs.setdefault(cc, []).append(f"`{k.name}`")
    lines[0] = textwrap.fill(
        lines[0] + " Kernels that need sm_80 or newer: "
        + "; ".join(f"{cc}: {', '.join(ns)}" for cc, ns in sorted(needs.items())) + ".",
        width=92, break_long_words=False, break_on_hyphens=False)
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for nb, ks in kernels_by_notebook(gl.kernels(), notebooks).items():
        n = int(nb.name[:2])
        lines.append(f"| {n:02d} | " + " | ".join(_where(ks, cc) for _, cc, _ in MACHINES) + " |")
    return "\n".join(lines)


RESULTS_START, RESULTS_END = "<!-- results:start -->", "<!-- results:end -->"


def results_table():
    """The ladder table, rendered from the recorded CSV (gemm_lessons/results/)."""
    from gemm_lessons.results import read_csv
    rows, device, versions = read_csv()
    lines = [f"Recorded on one {device} ({versions}).", "",
             "| kernel | lesson | dtype | M=N=K | ms | TFLOP/s | cuBLAS TFLOP/s | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for lesson, r in rows:
        dt = str(r.dtype).replace("torch.", "")
        lines.append(f"| {r.kernel} | {lesson:02d} | {dt} | {r.M} | {r.ms:.3f} | "
                     f"{r.tflops:.1f} | {r.baseline_tflops:.1f} | {r.ratio:.2f} |")
    return "\n".join(lines)


def _replace(text, start, end, body):
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def render(text):
    text = _replace(text, START, END, table())
    if WHERE_START not in text:          # first run: the region goes right after the lessons
        head, tail = text.split(END, 1)
        text = f"{head}{END}\n\n{WHERE_START}\n{WHERE_END}{tail}"
    text = _replace(text, WHERE_START, WHERE_END, where_table())
    if RESULTS_START in text:
        text = _replace(text, RESULTS_START, RESULTS_END, results_table())
    return text


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print("README.md lesson tables are out of date: run python tools/update_readme.py")
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
