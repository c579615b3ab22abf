"""Fill every quoted measurement in the lessons and the README from the recorded CSV.

A figure in markdown is written ``<span data-fig="KEY">VALUE</span>`` (see
``gemm_lessons.results.figure`` for KEY); this rewrites VALUE from the CSV.

    python tools/render_figures.py            # rewrite notebooks/, solutions/, README.md
    python tools/render_figures.py --check    # exit 1 and list every figure that differs
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPAN = re.compile(r'(<span data-fig="([^"]+)">)([^<]*)(</span>)')


def files():
    yield ROOT / "README.md"
    for d in ("notebooks", "solutions", "docs"):
        yield from sorted((ROOT / d).glob("*.ipynb"))
        yield from sorted((ROOT / d).glob("*.md"))


def _render_text(text, where, diffs):
    from gemm_lessons.results import figure

    def sub(m):
        want = figure(m.group(2))
        if m.group(3) != want:
            diffs.append(f"{where}: {m.group(2)!r} quotes {m.group(3)!r}, the CSV says {want!r}")
        return m.group(1) + want + m.group(4)
    return SPAN.sub(sub, text)


def render(check=False):
    """Rewrite (or, with ``check``, only compare) every file; returns the differences."""
    diffs = []
    for path in files():
        if not path.exists():
            continue
        rel = path.relative_to(ROOT)
        if path.suffix == ".md":
            text = path.read_text()
            new = _render_text(text, rel, diffs)
            if new != text and not check:
                path.write_text(new)
            continue
        raw = path.read_text()
        nb = json.loads(raw)
        changed = False
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "markdown":
                continue
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            new = _render_text(src, f"{rel} cell {i}", diffs)
            if new != src:
                cell["source"] = new.splitlines(keepends=True)
                changed = True
        if changed and not check:
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return diffs


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    diffs = render(check=check)
    for d in diffs:
        print(d)
    if check and diffs:
        print(f"{len(diffs)} quoted figure(s) differ from the CSV: python tools/render_figures.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
