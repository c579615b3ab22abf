"""nbgrader end to end: a temporary course, ``generate_assignment`` from the solutions, the
release compared with ``exercises/``, then ``autograde`` of two submissions: the solutions
(full points) and the unanswered release (no points).

Three representative lessons keep it to about a minute on 2 cores (autograde executes every
notebook): 03 (numba's simulator, a barrier audit, a conflict counter), 09 (Triton's
interpreter, BLAS epilogue rules, the split-K reduction) and 11 (plain torch: FP8 rounding,
an emulated tensor core; it adds about 7 s). Every lesson's release is compared
with nbgrader's by tests/test_notebooks.py (same preprocessors) and its checks by
tests/test_exercise_mutants.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ["03_bank_conflicts", "09_fused_epilogue", "11_fp8_scaled_gemm"]
ASSIGNMENT = "gemm"

nbgrader = pytest.importorskip("nbgrader")


def _nbgrader(course, *args, timeout=900):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _cells(path):
    import nbformat
    nb = nbformat.read(str(path), as_version=4)
    return [(c.cell_type, c.source, json.dumps(c.metadata, sort_keys=True)) for c in nb.cells]


def _points(nb_path):
    """{grade_id: points} of the graded cells of a source notebook."""
    nb = json.loads(Path(nb_path).read_text())
    return {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"]["points"]
            for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade")}


def test_generate_assignment_and_autograde(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import make_exercises

    course = tmp_path / "course"
    (course / "source" / ASSIGNMENT).mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        "c.CourseDirectory.course_id = 'gemm-lessons'\n"
        "c.ExecutePreprocessor.timeout = 600\n")
    for name in LESSONS:
        shutil.copy(ROOT / "solutions" / f"{name}.ipynb", course / "source" / ASSIGNMENT)

    _nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")

    # the release is exercises/ (make_exercises adds only nbval's raises-exception tags)
    import nbformat
    for name in LESSONS:
        released = nbformat.read(str(course / "release" / ASSIGNMENT / f"{name}.ipynb"), as_version=4)
        tagged = make_exercises.tag_for_nbval(json.loads(nbformat.writes(released)))
        tmp = tmp_path / f"{name}.tagged.ipynb"
        tmp.write_text(json.dumps(tagged))
        assert _cells(tmp) == _cells(ROOT / "exercises" / f"{name}.ipynb"), (
            f"exercises/{name}.ipynb differs from nbgrader's release: run "
            "python tools/make_exercises.py")
        text = (course / "release" / ASSIGNMENT / f"{name}.ipynb").read_text()
        assert "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text

    # two submissions: the solutions, and the release as handed out
    for student, folder in (("solved", course / "source" / ASSIGNMENT),
                            ("unsolved", course / "release" / ASSIGNMENT)):
        _nbgrader(course, "db", "student", "add", student)
        dest = course / "submitted" / student / ASSIGNMENT
        dest.mkdir(parents=True)
        for name in LESSONS:
            shutil.copy(folder / f"{name}.ipynb", dest)
    _nbgrader(course, "autograde", ASSIGNMENT, "--force")

    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        solved = gb.find_submission(ASSIGNMENT, "solved")
        unsolved = gb.find_submission(ASSIGNMENT, "unsolved")
        total = sum(sum(_points(ROOT / "solutions" / f"{n}.ipynb").values()) for n in LESSONS)
        assert solved.max_score == total
        assert solved.score == total, [
            (g.name, g.score, g.max_score) for nb in solved.notebooks for g in nb.grades]
        assert unsolved.score == 0, [
            (g.name, g.score) for nb in unsolved.notebooks for g in nb.grades if g.score]

    # feedback for the students renders
    _nbgrader(course, "generate_feedback", ASSIGNMENT, "--force")
    assert list((course / "feedback" / "solved" / ASSIGNMENT).glob("*.html"))
