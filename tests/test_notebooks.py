"""Notebook hygiene that nbval and learners rely on, plus the exercise generator."""
import json
import re
import sys
from pathlib import Path

import pytest

import gemm_lessons as gl

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for d in ("notebooks", "solutions", "exercises")
                   for p in (ROOT / d).glob("*.ipynb"))


def cells(path, kind="code"):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == kind]


def src(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_outputs_are_clean(path):
    for i, cell in enumerate(cells(path)):
        tags = cell.get("metadata", {}).get("tags", [])
        for out in cell.get("outputs", []):
            assert out.get("name") != "stderr", f"cell {i}: stderr output (nbval compares it)"
            if out["output_type"] == "error":
                assert "raises-exception" in tags, f"cell {i}: stored error"
            data = out.get("data", {})
            assert "image/svg+xml" not in data, f"cell {i}: SVG (use PNG)"
            text = json.dumps(out)
            assert not re.search(r"(/tmp/|/root/|/work/|/home/|site-packages)", text), \
                f"cell {i}: a machine path in the output"
            assert not re.search(r"0x[0-9a-f]{6,}", text), f"cell {i}: a memory address"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_gemm_lessons_is_imported_before_numba_and_triton(path):
    code = "\n".join(src(c) for c in cells(path))
    first_gl = code.find("import gemm_lessons")
    assert first_gl >= 0, "a lesson imports gemm_lessons"
    for other in ("import numba", "from numba", "import triton", "from triton"):
        pos = code.find(other)
        assert pos < 0 or pos > first_gl, f"{other!r} before gemm_lessons picks the engine"


def test_every_lesson_has_its_notebook_and_exercise():
    lessons = {k.lesson for k in gl.kernels()}
    for n in sorted(lessons):
        nb = list((ROOT / "notebooks").glob(f"{n:02d}_*.ipynb"))
        assert nb, f"lesson {n:02d} has kernels but no notebook"
        assert list((ROOT / "solutions").glob(f"{n:02d}_*.ipynb")), f"no solutions/{n:02d}_*"
    names = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert names[0] == "00_setup_and_roofline.ipynb"


def test_exercises_have_no_outputs_and_are_in_sync():
    sys.path.insert(0, str(ROOT / "tools"))
    import make_exercises
    assert make_exercises.main(["--check"]) == 0, "run: python tools/make_exercises.py"
    for path in (ROOT / "exercises").glob("*.ipynb"):
        for cell in cells(path):
            assert cell["outputs"] == [] and cell["execution_count"] is None
            assert "### BEGIN SOLUTION" not in src(cell)


def test_stub_generator_kernel_vs_host():
    sys.path.insert(0, str(ROOT / "tools"))
    from make_exercises import stub_source
    kernel = ("@cuda.jit\ndef k(A):\n    i = 0\n    ### BEGIN SOLUTION: index\n    j = i + 1\n"
              "    A[j] = 1\n    ### END SOLUTION\n")
    out, n = stub_source(kernel)
    assert n == 1 and "# TODO: index (about 2 lines)\n    pass" in out and "A[j]" not in out
    host = "def f():\n    ### BEGIN SOLUTION: grid\n    return 1\n    ### END SOLUTION\n"
    out, n = stub_source(host)
    assert "raise NotImplementedError('grid')" in out
    with pytest.raises(ValueError, match="without ### END"):
        stub_source("### BEGIN SOLUTION\nx = 1\n")
