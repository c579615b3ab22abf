"""Regenerate the lesson table in README.md from the registry and the notebooks.

The table sits between ``<!-- lessons:start -->`` and ``<!-- lessons:end -->``.

    python tools/update_readme.py            # rewrite README.md
    python tools/update_readme.py --check    # exit 1 if README.md is out of date
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- lessons:start -->", "<!-- lessons:end -->"


def _title(nb_path):
    for cell in json.loads(nb_path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            first = "".join(cell["source"]).strip().splitlines()[0]
            return first.lstrip("# ").split("—", 1)[-1].strip()
    return nb_path.stem


def table():
    import gemm_lessons as gl
    by_lesson = {}
    for k in gl.kernels():
        by_lesson.setdefault(k.lesson, []).append(k)
    rows = ["| # | notebook | what it teaches | kernels (`gl.kernels()`) |", "|---|---|---|---|"]
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        n = int(nb.name[:2])
        ks = ", ".join(f"`{k.name}` ({'/'.join(k.dtype_names)})" for k in by_lesson.get(n, []))
        rows.append(f"| {n:02d} | [{nb.stem}](notebooks/{nb.name}) | {_title(nb)} | {ks or '-'} |")
    return "\n".join(rows)


def render(text):
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print("README.md lesson table is out of date: run python tools/update_readme.py")
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
