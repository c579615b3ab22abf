"""The Colab setup cell: the first code cell of every notebook in notebooks/, solutions/ and
exercises/.

On a fresh Colab runtime ``import gemm_lessons`` fails: the course is not installed there.
The setup cell installs it from the repository when (and only when) the package cannot be
found and the notebook runs on Colab. Wherever ``gemm_lessons`` is installed it does
nothing and prints nothing, so nbval's stored output for it is empty on a laptop and on a
GPU alike. Elsewhere, with the package missing, it stops with the command that installs it.

On Colab it first asks the GPU driver (``cuDriverGetVersion``, through ctypes: no torch
import) which CUDA it runs. Where that is CUDA 13 or newer, pip installs the course with
its dependencies, torch's CUDA 13 build included. Where it is older, or there is no GPU,
that torch would not run on the GPU (or would be a download for nothing): the cell keeps
Colab's own torch, Triton and numpy, installs the course with ``--no-deps`` and then
KEEP_TORCH_DEPS. Where pip changed a package that Python had already imported (torch, numpy,
numba), the cell says to restart the runtime, since the old version stays loaded until then.

The cell carries the tag ``colab-setup`` and the id ``colab-setup``; this tool inserts it
(before the first code cell) or brings it up to date, and leaves every other cell as it is.

    python tools/colab.py                 # insert or update the cell in every notebook
    python tools/colab.py --check         # exit 1 if a notebook lacks it or differs
    python tools/colab.py --root DIR      # the same on another checkout (tests use it)

``REPO_URL`` below is the one place the repository's address is written: the setup cell
installs from it and ``tools/update_readme.py`` builds the README's "open in Colab" links
from it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The course's public repository (the one place it is written) and the branch learners get.
REPO_URL = "https://github.com/gemm-lessons/gemm-lessons"
BRANCH = "main"

# The CUDA version (as cuDriverGetVersion gives it: 1000 * major + 10 * minor) that the torch
# pip brings is built for (torch >= 2.11, CUDA 13): a driver older than that cannot run it.
CUDA_OF_TORCH = 13000
# What the course needs beside Colab's own torch, Triton and numpy, where pip's torch would not
# run: numba-cuda with the CUDA 12 bindings and compiler (those of Colab's torch and driver).
KEEP_TORCH_DEPS = ("numba-cuda[cu12]>=0.30,<0.31", "numpy<2.5", "tqdm>=4.60")

CELL = """\
# Colab: install the course if it is missing (does nothing where it is installed)
import importlib.util, subprocess, sys
if importlib.util.find_spec("gemm_lessons") is None:
    if "google.colab" not in sys.modules:
        raise ModuleNotFoundError("gemm_lessons is not installed: run "
                                  "pip install -e . in the course's folder")
    import ctypes, importlib.metadata as md
    cuda = ctypes.c_int(0)    # the newest CUDA that this runtime's driver runs (0: no GPU)
    try:
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(cuda))
    except OSError:
        pass
    cuda = cuda.value
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    course = "@COURSE@"
    loaded = {m: md.version(m) for m in ("torch", "numpy", "numba") if m in sys.modules}
    if cuda >= @CUDA@:    # the driver runs the torch that pip brings (built for CUDA 13)
        print("installing the course and torch's CUDA 13 build (several minutes)")
        subprocess.check_call(pip + [course])
    else:                # it would not: keep Colab's own torch, Triton and numpy
        driver = f"CUDA {cuda // 1000}.{cuda % 1000 // 10}" if cuda else "no GPU"
        print(f"installing the course beside Colab's torch {md.version('torch')} "
              f"(this runtime's driver: {driver}; pip's torch needs CUDA 13)")
        subprocess.check_call(pip + ["--no-deps", course])
        subprocess.check_call(pip + [@DEPS@])
    importlib.invalidate_caches()
    changed = [m for m, v in loaded.items() if md.version(m) != v]
    if changed:
        print(f"pip changed {', '.join(changed)}, already imported: restart the runtime "
              "(Runtime > Restart session), then run the notebook again")
"""

TAG = "colab-setup"
CELL_ID = "colab-setup"
FOLDERS = ("notebooks", "solutions", "exercises")


def colab_url(relpath: str) -> str:
    """The address that opens ``relpath`` (a notebook's path in the repository) in Colab."""
    prefix = "https://github.com/"
    if not REPO_URL.startswith(prefix):
        raise ValueError(f"REPO_URL must be a GitHub address, got {REPO_URL!r}")
    return f"https://colab.research.google.com/github/{REPO_URL[len(prefix):]}/blob/{BRANCH}/{relpath}"


def cell_source() -> str:
    """The setup cell's code. It must not import gemm_lessons (nor numba, triton or torch):
    the next cell imports gemm_lessons first, so that it picks the engine."""
    deps = ", ".join(f'"{r}"' for r in KEEP_TORCH_DEPS)
    return (
        CELL.replace("@COURSE@", f"gemm_lessons @ git+{REPO_URL}@{BRANCH}")
        .replace("@CUDA@", str(CUDA_OF_TORCH)).replace("@DEPS@", deps).rstrip("\n")
    )


def _lines(text: str) -> list:
    """A cell source as nbformat stores it: a list of lines, each but the last with its \\n."""
    return text.splitlines(keepends=True)


def _src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _is_setup(cell) -> bool:
    return cell.get("id") == CELL_ID or TAG in cell.get("metadata", {}).get("tags", [])


def new_cell(folder: str, old=None) -> dict:
    """The setup cell for a notebook in ``folder``. Exercises hold their sources as one
    string, as tools/make_exercises.py writes them, so that its drift check agrees."""
    source = cell_source()
    count = old.get("execution_count") if old is not None and folder != "exercises" else None
    return {
        "cell_type": "code",
        "execution_count": count,
        "id": CELL_ID,
        "metadata": {"tags": [TAG]},
        "outputs": [],
        "source": source if folder == "exercises" else _lines(source),
    }


def _first_code(cells) -> int:
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            return i
    return len(cells)


def problems(nb: dict) -> list:
    """What is wrong with a notebook's setup cell ([] if nothing)."""
    cells = nb["cells"]
    setup = [i for i, c in enumerate(cells) if _is_setup(c)]
    if not setup:
        return ["no setup cell"]
    out = []
    if len(setup) > 1:
        out.append(f"{len(setup)} setup cells")
    i = setup[0]
    cell = cells[i]
    if i != _first_code(cells):
        out.append("the setup cell is not the first code cell")
    if cell["cell_type"] != "code":
        out.append("the setup cell is not a code cell")
    if _src(cell) != cell_source():
        out.append("the setup cell's code differs")
    if cell.get("id") != CELL_ID or TAG not in cell.get("metadata", {}).get("tags", []):
        out.append(f"the setup cell lacks the id or the tag {TAG!r}")
    if cell.get("outputs"):
        out.append("the setup cell has stored output")
    return out


def apply(nb: dict, folder: str) -> dict:
    """The notebook with one up-to-date setup cell before its first code cell."""
    nb = json.loads(json.dumps(nb))
    cells = nb["cells"]
    old = [c for c in cells if _is_setup(c)]
    if old and not problems(nb):
        return nb
    cells[:] = [c for c in cells if not _is_setup(c)]
    cells.insert(_first_code(cells), new_cell(folder, old[0] if old else None))
    if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) < (4, 5):
        nb["nbformat"], nb["nbformat_minor"] = 4, 5       # cell ids came with 4.5
    return nb


def render(nb: dict) -> str:
    """Notebook text as nbformat and tools/make_exercises.py write it."""
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def notebooks(root: Path) -> list:
    return sorted(p for folder in FOLDERS for p in (root / folder).glob("*.ipynb"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if a notebook lacks the setup cell or it differs")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    paths = notebooks(root)
    if not paths:
        print(f"no notebooks under {root}/{{{','.join(FOLDERS)}}}")
        return 1
    bad = 0
    for path in paths:
        rel = path.relative_to(root)
        text = path.read_text()
        nb = json.loads(text)
        if args.check:
            found = problems(nb)
            if found:
                bad += 1
                print(f"{rel}: {'; '.join(found)}")
            continue
        if problems(nb):                # a notebook already right is left byte for byte
            path.write_text(render(apply(nb, rel.parts[0])))
            print(f"wrote {rel}")
    if args.check:
        if bad:
            print(f"{bad} notebook(s) out of date: run python tools/colab.py")
            return 1
        print(f"{len(paths)} notebooks have the Colab setup cell")
    return 0


if __name__ == "__main__":
    sys.exit(main())
