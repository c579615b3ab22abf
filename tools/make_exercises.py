"""Generate the release ``exercises/NN_*.ipynb`` from the sources ``solutions/NN_*.ipynb``.

Solutions are nbgrader source notebooks: answer cells carry nbgrader's ``solution``
metadata and mark each answer with ``### BEGIN SOLUTION`` / ``### END SOLUTION``, with a
``# TODO (about N lines): what to write`` comment just above (it stays in the release);
check cells are locked, graded test cells with points, and may hold
``### BEGIN HIDDEN TESTS`` / ``### END HIDDEN TESTS`` regions that only autograding runs.

The release is what nbgrader's ``generate_assignment`` writes, made here by the same
nbgrader preprocessors in the same order (``LockCells``, ``ClearSolutions``,
``ClearOutput``, ``CheckCellMetadata``, ``ComputeChecksums``, ``ClearHiddenTests``,
``ClearMarkScheme``, ``ComputeChecksums``, ``CheckCellMetadata``; the gradebook step
``SaveCells`` and the empty header/footer step are left out). Each answer becomes nbgrader's
stub ``# YOUR CODE HERE`` / ``raise NotImplementedError()``, inside kernels too (the
simulator and the interpreter raise it, and the checks say "the TODO is not done yet").

One step is added for nbval: answer cells and graded cells get the tag
``raises-exception``, so that ``pytest --nbval exercises/`` runs an unanswered notebook top to
bottom (it verifies the materials; grading is nbgrader's ``autograde``). Exercises are
stored without outputs. ``--check`` regenerates in memory and fails if the committed
exercises differ (the tests run it), and checks every TODO comment's line count.

    python tools/make_exercises.py           # write exercises/
    python tools/make_exercises.py --check   # exit 1 on drift
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = re.compile(r"^\s*### BEGIN SOLUTION\s*$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
TODO = re.compile(r"^\s*# TODO \(about (?P<n>\d+) lines?\): \S")


def _src(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def todo_problems(nb: dict, name: str = "") -> list[str]:
    """Each solution region must sit in an nbgrader solution cell, right under a
    ``# TODO (about N lines): ...`` comment whose N counts the region's code lines."""
    problems = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        lines = _src(cell).split("\n")
        is_solution = cell.get("metadata", {}).get("nbgrader", {}).get("solution", False)
        for j, line in enumerate(lines):
            if not BEGIN.match(line):
                if "BEGIN SOLUTION" in line:
                    problems.append(f"{name} cell {i}: write the hint in the TODO comment above, "
                                    f"not after BEGIN SOLUTION: {line.strip()!r}")
                continue
            if not is_solution:
                problems.append(f"{name} cell {i}: a solution region in a cell without "
                                "nbgrader solution metadata")
            k = j + 1
            while k < len(lines) and not END.match(lines[k]):
                k += 1
            if k == len(lines):
                problems.append(f"{name} cell {i}: ### BEGIN SOLUTION without ### END SOLUTION")
                continue
            n = sum(1 for x in lines[j + 1:k] if x.strip() and not x.strip().startswith("#"))
            m = TODO.match(lines[j - 1]) if j else None
            if not m:
                problems.append(f"{name} cell {i}: no '# TODO (about N lines): ...' comment "
                                "right above ### BEGIN SOLUTION")
            elif int(m.group("n")) != n:
                problems.append(f"{name} cell {i}: the TODO says about {m.group('n')} lines, "
                                f"the solution has {n}")
    return problems


def nbgrader_release(nb: dict) -> dict:
    """The student version of a source notebook, by nbgrader's own preprocessors."""
    import nbformat
    from nbgrader.preprocessors import (CheckCellMetadata, ClearHiddenTests, ClearMarkScheme,
                                        ClearOutput, ClearSolutions, ComputeChecksums,
                                        LockCells)
    node = nbformat.reads(json.dumps(nb), as_version=4)
    resources = {}
    for cls in (LockCells, ClearSolutions, ClearOutput, CheckCellMetadata, ComputeChecksums,
                ClearHiddenTests, ClearMarkScheme, ComputeChecksums, CheckCellMetadata):
        node, resources = cls().preprocess(node, resources)
    return json.loads(json.dumps(node))


def tag_for_nbval(nb: dict) -> dict:
    """Answer and graded cells may raise in an unanswered release: tag them."""
    for cell in nb["cells"]:
        meta = cell.get("metadata", {})
        g = meta.get("nbgrader", {})
        if cell["cell_type"] == "code" and (g.get("solution") or g.get("grade")):
            tags = list(meta.get("tags", []))
            if "raises-exception" not in tags:
                tags.append("raises-exception")
            meta["tags"] = tags
            cell["metadata"] = meta
    return nb


def make_exercise(nb: dict) -> dict:
    out = tag_for_nbval(nbgrader_release(nb))
    for cell in out["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return out


def render(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def generate():
    """({exercise path: text} for every solution notebook, [problems])."""
    result, problems = {}, []
    for sol in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(sol.read_text())
        problems += todo_problems(nb, f"solutions/{sol.name}")
        result[ROOT / "exercises" / sol.name] = render(make_exercise(nb))
    return result, problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if exercises/ is out of date")
    args = ap.parse_args(argv)
    wanted, problems = generate()
    for p in problems:
        print(p)
    if args.check:
        stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
        extra = [p for p in (ROOT / "exercises").glob("*.ipynb") if p not in wanted]
        for p in stale:
            print(f"out of date: {p.relative_to(ROOT)}")
        for p in extra:
            print(f"no solution for: {p.relative_to(ROOT)}")
        if stale or extra or problems:
            print("run: python tools/make_exercises.py")
            return 1
        print(f"{len(wanted)} exercise notebooks up to date")
        return 0
    if problems:
        return 1
    (ROOT / "exercises").mkdir(exist_ok=True)
    for p, text in wanted.items():
        p.write_text(text)
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
