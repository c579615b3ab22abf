"""The exercises' checks catch the typical mistakes, with the hint that names the cause.

``tests/exercise_mutants.yaml`` is the table: per exercise (a solution notebook and the
nbgrader grade_id of its check cell), mistakes written as text substitutions of the
solution, and a word the check's message must contain (a barrier, a wait count, a mask, the
grid, the accumulator type, the tile order...). Each mutant runs in this process: the
notebook's code cells up to the check (other checks skipped), mutated, then the check,
which must raise within seconds.

Also here: each exercise passes with its own answer while every other exercise of the
notebook is left unanswered (as released), so exercises are independent.
"""
from __future__ import annotations

import json
import linecache
import re
import time
from pathlib import Path

import pytest
import yaml

import gemm_lessons as gl  # noqa: F401  (picks the engine before numba and triton)

ROOT = Path(__file__).resolve().parents[1]
TABLE = yaml.safe_load((ROOT / "tests" / "exercise_mutants.yaml").read_text())
SECONDS = 45      # a mutant must be answered well within this (most take 1-5 s)


def _src(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _notebook(folder, name):
    return json.loads((ROOT / folder / f"{name}.ipynb").read_text())


def _grade(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def _run_cell(src, ns, tag):
    # register the source so that inspect (Triton's @jit) finds it, as in a notebook
    fname = f"<{tag}>"
    linecache.cache[fname] = (len(src), None, [line + "\n" for line in src.split("\n")], fname)
    exec(compile(src, fname, "exec"), ns)


def _run_until(cells, check_id, tag):
    """Execute the code cells before the graded cell ``check_id`` (skipping other graded
    cells), then that cell; return its exception (None if it passed) and the seconds."""
    ns = {"__name__": "__main__"}
    target = None
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        g = _grade(cell)
        if g.get("grade"):
            if g.get("grade_id") == check_id:
                target = cell
                break
            continue
        try:        # as in a notebook, a cell that raises does not stop the next ones
            _run_cell(_src(cell), ns, f"{tag}-cell{i}")
        except Exception:       # noqa: BLE001  (an unanswered exercise raises)
            pass
    assert target is not None, f"no graded cell {check_id!r}"
    t0 = time.perf_counter()
    try:
        _run_cell(_src(target), ns, f"{tag}-check")
    except AssertionError as e:       # ExerciseError is an AssertionError
        return e, time.perf_counter() - t0
    return None, time.perf_counter() - t0


def _mutate(nb, check, replace, name):
    cells = json.loads(json.dumps(nb["cells"]))
    answers = [cells[i] for i in _exercise_cells(nb)[check]]
    for old, new in replace:
        hits = [c for c in answers if _src(c).count(old) == 1]
        total = sum(_src(c).count(old) for c in answers)
        assert total == 1 and len(hits) == 1, (
            f"{name}: {old!r} occurs {total} times in the answer cells (must be once)")
        hits[0]["source"] = _src(hits[0]).replace(old, new)
    return cells


MUTANTS = [(e["notebook"], e["check"], m) for e in TABLE for m in e["mutants"]]


def test_table_covers_every_graded_exercise():
    listed = {(e["notebook"], e["check"]) for e in TABLE}
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            g = _grade(cell)
            if g.get("grade"):
                assert (path.stem, g["grade_id"]) in listed, \
                    f"{path.stem} {g['grade_id']}: no mutants in tests/exercise_mutants.yaml"
    caught = sum(1 for *_, m in MUTANTS if "known_gap" not in m)
    assert caught >= 0.9 * len(MUTANTS), f"only {caught} of {len(MUTANTS)} mutants are caught"


def test_every_lesson_has_at_least_four_graded_exercises():
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        checks = list(_exercise_cells(json.loads(path.read_text())))
        assert len(checks) >= 4, f"{path.stem}: {len(checks)} graded exercises, fewer than 4"
    lessons = {p.stem[:2] for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")}
    assert lessons >= {f"{n:02d}" for n in range(1, 10)}, sorted(lessons)


@pytest.mark.parametrize("notebook,check,mutant", MUTANTS,
                         ids=[f"{nb}:{c}:{m['name']}" for nb, c, m in MUTANTS])
def test_mutant_is_caught_with_its_hint(notebook, check, mutant):
    nb = _notebook("solutions", notebook)
    cells = _mutate(nb, check, mutant["replace"], mutant["name"])
    err, seconds = _run_until(cells, check, re.sub(r"\W", "_", mutant["name"]))
    hinted = err is not None and mutant["hint"].lower() in str(err).lower()
    if "known_gap" in mutant:
        assert not hinted, f"{mutant['name']} is caught now: remove its known_gap"
        return
    assert err is not None, f"{check} accepted the mutant {mutant['name']!r}"
    assert hinted, (f"{check} caught {mutant['name']!r} but its message lacks "
                    f"{mutant['hint']!r}:\n{err}")
    assert seconds < SECONDS, f"{check} took {seconds:.0f} s to answer {mutant['name']!r}"


def _exercise_cells(nb):
    """{check grade_id: indices of the answer cells that belong to it} (the answer cells
    between the previous graded cell and this one)."""
    out, pending = {}, []
    for i, cell in enumerate(nb["cells"]):
        g = _grade(cell)
        if g.get("solution"):
            pending.append(i)
        elif g.get("grade"):
            out[g["grade_id"]] = pending
            pending = []
    return out


INDEPENDENT = [(p.stem, gid) for p in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
               for gid in list(_exercise_cells(json.loads(p.read_text())))[1:]]


@pytest.mark.parametrize("notebook,check", INDEPENDENT, ids=[f"{n}:{c}" for n, c in INDEPENDENT])
def test_exercise_passes_with_the_others_unanswered(notebook, check):
    solution = _notebook("solutions", notebook)
    release = _notebook("exercises", notebook)
    mine = _exercise_cells(solution)[check]
    cells = [solution["cells"][i] if i in mine else cell
             for i, cell in enumerate(release["cells"])]
    err, _ = _run_until(cells, check, f"independent-{check}")
    assert err is None, f"{check} fails while the other exercises are unanswered:\n{err}"
