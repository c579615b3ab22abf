"""No answer within reach: an exercise's answer stands nowhere a student can read or import.

For every exercise (the answer regions, ``### BEGIN SOLUTION`` .. ``### END SOLUTION``, of the
cells that precede its graded check in ``solutions/NN_*.ipynb``), the answer's code must not
stand in

- the package (every ``gemm_lessons/**/*.py``: kernels, labs, the exercise checks and their
  helpers, which a student can import or print with ``gl.show_source``),
- the lessons (``notebooks/*.ipynb``: code cells, and the code in markdown cells, fenced or
  inline),
- the exercises as released (``exercises/*.ipynb``: what a student reads, its own notebook
  included), or another exercise's answer,

verbatim or with names and constants changed; and not as a formula either: every line of
every place is also read without what receives its value, so ``want = expr`` in a check,
``grid = expr`` in a launcher or a lesson's cell, and an answer's ``return expr`` read alike
(a check that computes its reference as the answer does prints the answer; a lesson's
launcher that assigns the formula an answer returns shows it).

The rule. Code is cut into logical lines (a statement continued over several physical lines
is one line; comments and blank lines are dropped) and each line into tokens, normalized so
that a copy with names, constants or parentheses changed reads the same: every number reads
``0``, every string ``''``, a dotted name its last part (``ptx.cp_async_wait_group`` and an
imported ``cp_async_wait_group`` alike), every name but keywords and builtins is a
placeholder, and parentheses are dropped (``(a % b) % c`` reads as ``a % b % c``). A
*match* is a run of consecutive lines of the answer that stands as consecutive lines of
another place, with one consistent renaming of the placeholders over the whole run (``i``
and ``j`` swapped throughout is a match; ``a[i, j]`` against ``a[i, i]`` is not), and of at
least ``FLOOR`` tokens: a trivial line alone (``return x``, ``cuda.syncthreads()``,
``s = kt % STAGES``) is no match. A place (a module, a notebook, another exercise's answer)
*leaks* the answer when its matches cover at least ``COVER`` of the answer's tokens, or
when one of them is ``MIN_TOKENS`` long: a formula that is the whole answer, or most of a
loop body, is a leak; a shared line of set-up (``acc = tl.zeros(...)``) is not.

``KNOWN_LEAKS`` lists the exercises whose answer still leaks, each with where; an entry must
go when its exercise is fixed (the test fails while a listed exercise no longer leaks), and
the list shrinks to empty.

The other half of the guard (an answer that calls the package's own function must fail its
check) is driven by the ``cheat`` entries of ``tests/exercise_mutants.yaml`` and run by
``tests/test_exercise_mutants.py``, which runs every mutant; here, each exercise is required
to have at least one cheat, caught (no ``known_gap``).
"""
from __future__ import annotations

import builtins
import io
import json
import keyword
import re
import textwrap
import tokenize
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
FLOOR = 12          # a run of fewer tokens is no match (a trivial line or two)
COVER = 0.5         # a place whose matches cover this share of the answer's tokens leaks it
MIN_TOKENS = 60     # ... and so does one that holds a run this long, whatever the share

# Exercises whose answer still stands within reach: "exNN-i": where. Remove an entry when
# its exercise is fixed. Lessons 01-05 first, then 06-09.
KNOWN_LEAKS = {
    # lessons 01-05
    # lessons 06-09
}

# Exercises with no cheat entry in tests/exercise_mutants.yaml yet. Lessons 01-05 first.
NO_CHEAT_YET = {
    # lessons 01-05
    # lessons 06-09
}

BEGIN = re.compile(r"^\s*### BEGIN SOLUTION\s*$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
KEEP = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins))


def _src(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _grade(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def _exercise(grade_id):
    """'ex06-1-check' -> 'ex06-1'."""
    return re.match(r"(ex\d\d-\d+)", grade_id).group(1)


# ----------------------------------------------------------------------------- tokens
def _lines(code):
    """The logical lines of ``code``, each a tuple of normalized tokens (a placeholder name
    is ``('N', name)``, every other token a string)."""
    code = "\n".join("" if re.match(r"\s*[%!]", ln) else ln for ln in code.split("\n"))
    code = textwrap.dedent(code)
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(code + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        if "\n" not in code.strip():
            return []
        # tokenize line by line (a fragment that is not a whole program)
        return [ln for part in code.split("\n") for ln in _lines(part.strip())]
    out, cur, depth = [], [], 0
    for tok in toks:
        kind, text = tok.type, tok.string
        if kind in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if cur:
                out.append(tuple(cur))
            cur = []
            continue
        if kind in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT,
                    tokenize.ENCODING):
            continue
        if kind == getattr(tokenize, "FSTRING_START", -1):
            depth += 1
            continue
        if kind == getattr(tokenize, "FSTRING_END", -1):
            depth -= 1
            if depth == 0:
                cur.append("''")
            continue
        if depth:
            continue
        if kind == tokenize.NUMBER:
            cur.append("0")
        elif kind == tokenize.STRING:
            cur.append("''")
        elif text == "." and cur and isinstance(cur[-1], tuple):
            cur.pop()                           # a dotted name reads as its last part
        elif kind == tokenize.NAME and text not in KEEP:
            cur.append(("N", text))
        elif text not in "()":                  # parentheses: (a % b) % c reads a % b % c
            cur.append(text)
    if cur:
        out.append(tuple(cur))
    return out


def _shape(line):
    """A line with its placeholders numbered in order of appearance: the key of the index."""
    seen = {}
    return tuple(seen.setdefault(t[1], f"${len(seen)}") if isinstance(t, tuple) else t
                 for t in line)


def _same_names(run_a, run_b):
    """One consistent renaming maps the placeholders of ``run_a`` onto those of ``run_b``:
    the number of leading lines for which it holds."""
    fwd, back = {}, {}
    for n, (la, lb) in enumerate(zip(run_a, run_b)):
        for ta, tb in zip(la, lb):
            if isinstance(ta, tuple):
                if fwd.setdefault(ta[1], tb[1]) != tb[1] or back.setdefault(tb[1], ta[1]) != ta[1]:
                    return n
    return len(run_a)


# ----------------------------------------------------------------------------- sources
def _markdown_code(text):
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    return blocks + re.findall(r"`([^`\n]+)`", rest)


def _answer_regions(code):
    regions, cur = [], None
    for line in code.split("\n"):
        if BEGIN.match(line):
            cur = []
        elif END.match(line) and cur is not None:
            regions.append("\n".join(cur))
            cur = None
        elif cur is not None:
            cur.append(line)
    return regions


@lru_cache(maxsize=None)
def answers():
    """{exercise: (notebook, [answer region texts])} for every graded exercise."""
    out = {}
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        pending = []
        for cell in nb["cells"]:
            g = _grade(cell)
            if g.get("solution"):
                pending += _answer_regions(_src(cell))
            elif g.get("grade"):
                out[_exercise(g["grade_id"])] = (path.stem, pending)
                pending = []
    return out


@lru_cache(maxsize=None)
def corpus():
    """[(where, [lines])]: the units a student can read, each cut into logical lines."""
    units = []
    for path in sorted((ROOT / "gemm_lessons").rglob("*.py")):
        units.append((str(path.relative_to(ROOT)), _lines(path.read_text())))
    for folder in ("notebooks", "exercises"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            nb = json.loads(path.read_text())
            for i, cell in enumerate(nb["cells"]):
                where = f"{folder}/{path.name} cell {i}"
                if cell["cell_type"] == "code":
                    units.append((where, _lines(_src(cell))))
                elif cell["cell_type"] == "markdown":
                    for block in _markdown_code(_src(cell)):
                        units.append((where, _lines(block)))
    for ex, (_, regions) in answers().items():
        for region in regions:
            units.append((f"the answer of {ex}", _lines(region)))
    return units


@lru_cache(maxsize=None)
def index():
    """{line shape: [(unit, line number)]}."""
    idx = {}
    for u, (_, lines) in enumerate(corpus()):
        for j, line in enumerate(lines):
            idx.setdefault(_shape(line), []).append((u, j))
    return idx


def _formula(line):
    """A line without what receives its value: ``return expr`` and ``name = expr`` read as
    ``expr`` (a check's reference, ``want = ...``, or a launcher's ``grid = ...``, against an
    answer's ``return ...``)."""
    if line and line[0] == "return":
        return line[1:]
    if len(line) > 2 and isinstance(line[0], tuple) and line[1] == "=":
        return line[2:]
    return line


@lru_cache(maxsize=None)
def formulas():
    """(units, index) of every place a student reads (the package, the lessons, the released
    exercises, the other answers), each line read as a formula."""
    units = [(where, [_formula(ln) for ln in lines]) for where, lines in corpus()]
    idx = {}
    for u, (_, lines) in enumerate(units):
        for j, line in enumerate(lines):
            idx.setdefault(_shape(line), []).append((u, j))
    return units, idx


def leaks(ex):
    """[(where, matched answer text)]: the places that hold the answer of ``ex``, its lines
    read as they are and read as formulas, anywhere a student reads."""
    _, regions = answers()[ex]
    lines = [ln for region in regions for ln in _lines(region)]
    found = dict(_matches(ex, lines, corpus(), index()))
    for place, text in _matches(ex, [_formula(ln) for ln in lines], *formulas()):
        found.setdefault(place, text)
    return sorted(found.items())


def _matches(ex, lines, units, idx):
    total = sum(map(len, lines))
    own = f"the answer of {ex}"
    covered, longest = {}, {}       # per place: answer lines matched; its longest run
    for i, line in enumerate(lines):
        for u, j in idx.get(_shape(line), ()):
            where, other = units[u]
            if where == own:
                continue
            place = where.split(" cell ")[0]
            k = 0
            while (i + k < len(lines) and j + k < len(other)
                   and _shape(lines[i + k]) == _shape(other[j + k])):
                k += 1
            k = _same_names(lines[i:i + k], other[j:j + k])
            tokens = sum(map(len, lines[i:i + k]))
            if tokens < FLOOR:
                continue
            covered.setdefault(place, set()).update(range(i, i + k))
            if tokens > longest.get(place, (0, ""))[0]:
                longest[place] = (tokens, _text(lines[i:i + k]))
    found = []
    for place, rows in covered.items():
        share = sum(len(lines[r]) for r in rows)
        if share >= COVER * total or longest[place][0] >= MIN_TOKENS:
            found.append((place, f"{share} of {total} tokens; {longest[place][1]}"))
    return found


def _text(lines):
    return " / ".join(" ".join(t[1] if isinstance(t, tuple) else t for t in ln) for ln in lines)


EXERCISES = sorted(answers())


@pytest.mark.parametrize("ex", EXERCISES)
def test_answer_stands_nowhere_a_student_reads(ex):
    found = leaks(ex)
    if ex in KNOWN_LEAKS:
        assert found, f"{ex} no longer leaks: remove it from KNOWN_LEAKS"
        return
    assert not found, f"{ex}'s answer stands elsewhere:\n" + "\n".join(
        f"  {where}: {text[:300]}" for where, text in found)


def test_known_leaks_name_exercises():
    assert set(KNOWN_LEAKS) <= set(EXERCISES), set(KNOWN_LEAKS) - set(EXERCISES)
    assert set(NO_CHEAT_YET) <= set(EXERCISES), set(NO_CHEAT_YET) - set(EXERCISES)


def test_every_exercise_has_a_cheat_that_is_caught():
    table = yaml.safe_load((ROOT / "tests" / "exercise_mutants.yaml").read_text())
    cheats = {}
    for entry in table:
        ex = _exercise(entry["check"])
        for m in entry["mutants"]:
            if "cheat" in m:
                assert "known_gap" not in m, f"{ex}: the cheat {m['name']!r} passes its check"
                cheats.setdefault(ex, []).append(m["name"])
    for ex in EXERCISES:
        if ex in NO_CHEAT_YET:
            assert ex not in cheats, f"{ex} has a cheat now: remove it from NO_CHEAT_YET"
        else:
            assert ex in cheats, (f"{ex}: no cheat in tests/exercise_mutants.yaml (an answer "
                                  "that calls the package's own function, with `cheat:`)")


def test_a_checks_reference_reads_as_the_answer():
    """A check that computes the expected result as the answer does (``want = formula``
    beside an answer's ``return formula``) holds the answer: read as formulas, the two
    match; a line of set-up alone does not."""
    answer = _lines("per_band = -(-cols // bc)\nreturn (i // br) * per_band + j // bc\n")
    check = _lines("per_row = -(-cols // bc)\nwant = (i // br) * per_row + j // bc\n")
    assert [_shape(a) for a in answer] != [_shape(c) for c in check]
    fa, fc = [_formula(a) for a in answer], [_formula(c) for c in check]
    assert [_shape(a) for a in fa] == [_shape(c) for c in fc] and _same_names(fa, fc) == 2
    assert sum(map(len, fa)) >= FLOOR
    assert _shape(_formula(_lines("x = f(a, 2)")[0])) == _shape(_formula(_lines("return f(b, 3)")[0]))


def test_the_rule_finds_a_renamed_copy_and_ignores_trivial_lines():
    """The matcher on known text: a copy with names and constants changed is found, a
    trivial line is not, and a renaming that is not consistent is not a copy."""
    a = _lines("x = i * 4 + j\nif x < n:\n    out[x] = acc[i, j] * alpha + beta * y[x]\n")
    b = _lines("pos = r * 8 + c\nif pos < M:\n    C[pos] = s[r, c] * alpha + beta * z[pos]\n")
    assert len(a) == len(b) == 3 and all(_shape(p) == _shape(q) for p, q in zip(a, b))
    assert _same_names(a, b) == 3
    c = _lines("pos = r * 8 + c\nif pos < M:\n    C[pos] = s[c, r] * alpha + beta * z[pos]\n")
    assert _same_names(a, c) == 2
    assert sum(map(len, _lines("cuda.syncthreads()"))) < FLOOR
    assert sum(map(len, _lines("return x"))) < FLOOR
    assert sum(map(len, _lines(
        "return stages * (BM * (BK + pad) + BK * (BN + pad)) * 2"))) >= FLOOR
    assert _shape(_lines("ptx.cp_async_wait_group(0)")[0]) == _shape(
        _lines("cp_async_wait_group(1)")[0])
    assert _shape(_lines("p = (a % b) % c")[0]) == _shape(_lines("q = x % y % z")[0])


def test_every_place_is_read_as_formulas():
    """The formula reading covers what the plain one does: the package's modules (kernels
    and labs, not the checks only), the lessons, the released exercises and the answers; a
    launcher's ``grid = expr`` reads as an answer's ``return expr``."""
    units, _ = formulas()
    assert [w for w, _ in units] == [w for w, _ in corpus()]
    wheres = [w for w, _ in units]
    for prefix in ("gemm_lessons/kernels/", "gemm_lessons/labs/", "gemm_lessons/exercise_checks/",
                   "notebooks/", "exercises/", "the answer of "):
        assert any(w.startswith(prefix) for w in wheres), prefix
    launcher = _lines('grid = (cdiv(N, cfg["BN"]), cdiv(M, cfg["BM"]))')
    answer = _lines('return (triton.cdiv(N, meta["BLOCK_SIZE_N"]), '
                    'triton.cdiv(M, meta["BLOCK_SIZE_M"]))')
    assert _shape(launcher[0]) != _shape(answer[0])
    assert _shape(_formula(launcher[0])) == _shape(_formula(answer[0]))
