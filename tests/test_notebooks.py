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
            assert "BEGIN SOLUTION" not in src(cell) and "BEGIN HIDDEN TESTS" not in src(cell)


@pytest.mark.parametrize("path", sorted((ROOT / "solutions").glob("*.ipynb")), ids=lambda p: p.name)
def test_solutions_are_nbgrader_sources(path):
    """Answer cells are nbgrader solution cells under a TODO; every exercise has a locked,
    graded check with points, which calls a check of gemm_lessons.exercise_checks."""
    nb = json.loads(path.read_text())
    graded = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    answers = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    assert len(graded) >= 2 and len(answers) >= len(graded)
    for c in graded:
        g = c["metadata"]["nbgrader"]
        assert g["locked"] and g["points"] > 0 and not g["solution"]
        assert "checks.ex" in src(c), f"{g['grade_id']}: a check of gemm_lessons.exercise_checks"
    for c in answers:
        assert "### BEGIN SOLUTION" in src(c), c["metadata"]["nbgrader"]["grade_id"]
    ids = [c["metadata"]["nbgrader"]["grade_id"] for c in graded + answers]
    assert len(ids) == len(set(ids)), "grade_ids must be unique"
    sys.path.insert(0, str(ROOT / "tools"))
    import make_exercises
    assert make_exercises.todo_problems(nb, path.name) == []


def test_release_stubs_and_todo_counts():
    sys.path.insert(0, str(ROOT / "tools"))
    import make_exercises
    nb = {"cells": [{"cell_type": "code", "id": "a", "execution_count": None, "outputs": [],
                     "source":
                     "@cuda.jit\ndef k(A):\n    i = 0\n    # TODO (about 2 lines): index\n"
                     "    ### BEGIN SOLUTION\n    j = i + 1\n    A[j] = 1\n    ### END SOLUTION\n",
                     "metadata": {"nbgrader": {"grade": False, "grade_id": "a", "locked": False,
                                               "schema_version": 3, "solution": True,
                                               "task": False}}}],
          "metadata": {"kernelspec": {"name": "python3", "language": "python",
                                      "display_name": "Python 3"}},
          "nbformat": 4, "nbformat_minor": 5}
    assert make_exercises.todo_problems(nb) == []
    out = make_exercises.make_exercise(nb)
    text = src(out["cells"][0])
    assert "# TODO (about 2 lines): index\n    # YOUR CODE HERE\n    raise NotImplementedError()" in text
    assert "A[j]" not in text and out["cells"][0]["metadata"]["tags"] == ["raises-exception"]
    nb["cells"][0]["source"] = nb["cells"][0]["source"].replace("about 2 lines", "about 5 lines")
    assert "the solution has 2" in make_exercises.todo_problems(nb)[0]
    del nb["cells"][0]["metadata"]["nbgrader"]
    assert any("without nbgrader solution" in p for p in make_exercises.todo_problems(nb))
