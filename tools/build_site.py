"""Build the rendered course: a static HTML site of the lessons, the exercises and the
results, from the notebooks' stored outputs (nothing is executed).

    python tools/build_site.py              # into build/site
    python tools/build_site.py OUTDIR
    python tools/build_site.py --strict     # Sphinx warnings are errors

Sources: docs/ (conf.py, the index and results pages; docs/instructors.md when present),
README.md (the home page), notebooks/ (the lessons, in order; their Colab setup cell left
out), exercises/ and
gemm_lessons/results/ (the ladder's CSV, as a table, and its plot). They are laid out in a
staging folder and built by Sphinx with myst-nb and the furo theme, all from PyPI; MathJax
comes from the jupyter-server-mathjax package, so neither the build nor the pages fetch
anything. Open OUTDIR/index.html, or serve it: ``python -m http.server -d build/site``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ladder_table(csv_path: Path) -> str:
    """The recorded ladder as a markdown table (the figures formatted as the prose quotes
    them: gemm_lessons.results.FIELD_FORMATS)."""
    sys.path.insert(0, str(ROOT))
    from gemm_lessons.results import FIELD_FORMATS, read_csv
    rows, device, versions = read_csv(csv_path)
    f = FIELD_FORMATS
    out = [f"Recorded on one {device} ({versions}).", "",
           "| kernel | lesson | dtype | M x N x K | ms | TFLOP/s | cuBLAS TFLOP/s | ratio |",
           "|---|---|---|---|---|---|---|---|"]
    for lesson, r in rows:
        size = f"{r.M}" if r.M == r.N == r.K else f"{r.M} x {r.N} x {r.K}"
        out.append(f"| `{r.kernel}` | {lesson:02d} | {str(r.dtype).replace('torch.', '')} | "
                   f"{size} | {f['ms'](r)} | {f['tflops'](r)} | {f['baseline_tflops'](r)} | "
                   f"{f['ratio'](r)} |")
    return "\n".join(out) + "\n"


SETUP_TAG = "colab-setup"      # tools/colab.py's install cell: for Colab, not for readers


def _reading_copy(nb_path: Path, dst: Path) -> None:
    """The notebook without its Colab setup cell (the site is for reading)."""
    nb = json.loads(nb_path.read_text())
    nb["cells"] = [c for c in nb["cells"]
                   if SETUP_TAG not in c.get("metadata", {}).get("tags", [])]
    dst.write_text(json.dumps(nb, indent=1, ensure_ascii=False))


def stage(src: Path, root: Path = ROOT) -> None:
    """Lay out the site's sources (from the checkout ``root``) in ``src``."""
    docs, results = root / "docs", root / "gemm_lessons" / "results"
    for p in docs.iterdir():
        if p.name.startswith((".", "_build")) or p.name == "__pycache__":
            continue
        (shutil.copytree if p.is_dir() else shutil.copy2)(p, src / p.name)
    index = (docs / "index.md").read_text()
    more = "instructors" if (docs / "instructors.md").exists() else ""
    (src / "index.md").write_text(index.replace("%INSTRUCTORS%", more))
    shutil.copy2(root / "README.md", src / "README.md")
    for folder in ("notebooks", "exercises"):
        (src / folder).mkdir()
        for nb in sorted((root / folder).glob("[0-9][0-9]_*.ipynb")):
            _reading_copy(nb, src / folder / nb.name)
    (src / "gemm_lessons" / "results").mkdir(parents=True)
    for p in results.glob("*"):
        if p.suffix in (".csv", ".png"):
            shutil.copy2(p, src / "gemm_lessons" / "results" / p.name)
    (src / "_ladder_table.md").write_text(ladder_table(results / "h200_ladder.csv"))


def build(outdir: Path, *, strict: bool = False, quiet: bool = True) -> Path:
    """Build the site into ``outdir`` (replaced); returns the path of its index.html."""
    outdir = Path(outdir).resolve()
    with tempfile.TemporaryDirectory(prefix="gemm-lessons-site-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        stage(src, ROOT)
        if outdir.exists():
            shutil.rmtree(outdir)
        cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-d", str(Path(tmp) / "doctrees"),
               "-c", str(src), str(src), str(outdir)]
        if quiet:
            cmd.append("-q")
        if strict:
            cmd += ["-W", "--keep-going"]
        r = subprocess.run(cmd, cwd=ROOT)
        if r.returncode != 0:
            raise SystemExit(f"sphinx-build failed (exit {r.returncode}): {' '.join(cmd)}")
    index = outdir / "index.html"
    if not index.exists():
        raise SystemExit(f"the build wrote no {index}")
    return index


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir", nargs="?", type=Path, default=ROOT / "build" / "site")
    ap.add_argument("--strict", action="store_true", help="Sphinx warnings are errors")
    ap.add_argument("--verbose", action="store_true", help="Sphinx's progress output")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    index = build(args.outdir, strict=args.strict, quiet=not args.verbose)
    print(f"built {index} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
