"""Generate ``exercises/NN_*.ipynb`` from ``solutions/NN_*.ipynb``.

Solutions are the source. In a solution notebook each answer sits between nbgrader's
markers (so instructors can also use nbgrader)::

    ### BEGIN SOLUTION: load one tile of A into sA
    ...answer...
    ### END SOLUTION

The exercise gets, in its place:

* inside a kernel (the enclosing ``def`` is decorated ``@cuda.jit`` or ``@triton.jit``):
  ``# TODO: load one tile of A into sA (about 4 lines)`` and ``pass``;
* in host code: the same comment and ``raise NotImplementedError(...)``.

Cells that hold a stub, and cells tagged ``check`` (the checks after an exercise), get the
tag ``raises-exception``: an unanswered exercise fails its check, as it should, while
``pytest --nbval exercises/`` still runs the notebook top to bottom. Exercises are stored
without outputs. ``--check`` regenerates in memory and fails if the committed exercises
differ (CI runs it through the tests).

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
BEGIN = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION(?::\s*(?P<hint>.*))?\s*$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
JIT = re.compile(r"@\s*(cuda\.jit|triton\.jit|jit)\b")


def _in_kernel(lines, i, indent):
    """Is line i inside a function decorated as a GPU kernel?"""
    for j in range(i - 1, -1, -1):
        line = lines[j]
        stripped = line.lstrip()
        ind = len(line) - len(stripped)
        if stripped.startswith("def ") and ind < len(indent):
            k = j - 1
            while k >= 0 and lines[k].lstrip().startswith("@"):
                if JIT.search(lines[k]):
                    return True
                k -= 1
            return False
    return False


def stub_source(src: str):
    """(new source, number of stubs) for one cell's source."""
    lines = src.split("\n")
    out, i, n = [], 0, 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, hint = m.group("indent"), (m.group("hint") or "your code here").strip()
        j = i + 1
        while j < len(lines) and not END.match(lines[j]):
            j += 1
        if j == len(lines):
            raise ValueError(f"### BEGIN SOLUTION without ### END SOLUTION: {lines[i]!r}")
        body = [line for line in lines[i + 1:j] if line.strip() and not line.strip().startswith("#")]
        size = len(body)
        about = f"about {size} line{'s' if size != 1 else ''}"
        out.append(f"{indent}# TODO: {hint} ({about})")
        if _in_kernel(lines, i, indent):
            out.append(f"{indent}pass")
        else:
            out.append(f"{indent}raise NotImplementedError({hint!r})")
        n += 1
        i = j + 1
    return "\n".join(out), n


def make_exercise(nb: dict) -> dict:
    nb = json.loads(json.dumps(nb))
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new, n = stub_source(src)
        tags = list(cell.get("metadata", {}).get("tags", []))
        if (n or "check" in tags) and "raises-exception" not in tags:
            tags.append("raises-exception")
        cell["source"] = new
        cell["outputs"] = []
        cell["execution_count"] = None
        if tags:
            cell.setdefault("metadata", {})["tags"] = tags
    return nb


def render(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def generate():
    """{exercise path: text} for every solution notebook."""
    result = {}
    for sol in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(sol.read_text())
        result[ROOT / "exercises" / sol.name] = render(make_exercise(nb))
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if exercises/ is out of date")
    args = ap.parse_args(argv)
    wanted = generate()
    if args.check:
        stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
        extra = [p for p in (ROOT / "exercises").glob("*.ipynb") if p not in wanted]
        for p in stale:
            print(f"out of date: {p.relative_to(ROOT)}")
        for p in extra:
            print(f"no solution for: {p.relative_to(ROOT)}")
        if stale or extra:
            print("run: python tools/make_exercises.py")
            return 1
        print(f"{len(wanted)} exercise notebooks up to date")
        return 0
    (ROOT / "exercises").mkdir(exist_ok=True)
    for p, text in wanted.items():
        p.write_text(text)
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
