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


# ----------------------------------------------------------------------------- by behaviour
# The token rule reads lines; a check can compute its reference as the answer does with
# lines shaped otherwise (a nested ``truth(words)`` that groups words by bank, a
# ``_bank_of(..., use_pad=True, ...)`` whose flags off are the answer). So every exercise
# whose answer is a plain host function (called by its check with ints, strings, lists) is
# also probed by behaviour: every function defined in the checks and the instruments
# (``gemm_lessons/exercise_checks/*.py``, ``counters.py``, ``banks.py``), nested ones
# included, is copied as a student would copy it (compiled on its own, run as notebook code)
# and called on the arguments the check gave the answer, with kernel launches, child
# processes and calls into another module of the package refused, as they are in an answer
# (its own module's functions may be called: a student copies those too). One that returns
# what the answer returned, on every call, is the answer within reach. A check that
# measures (launches a kernel under ``counters.trace``) or inverts another module's
# instrument (``occupancy``: calling it is refused in an answer) is not flagged.

PROBED = ["gemm_lessons/exercise_checks/*.py", "gemm_lessons/counters.py", "gemm_lessons/banks.py"]
MAX_CALLS = 64      # the answer's calls kept per exercise (spread over all it made)


class _Refused(BaseException):
    """Raised by a kernel launch or a child process while probing (not an Exception, so
    that a check's ``except Exception`` does not swallow it)."""


def _plain(x):
    if isinstance(x, (bool, int, float, str, type(None))):
        return True
    if isinstance(x, (list, tuple)):
        return all(_plain(v) for v in x)
    return False


def _refusing():
    """A context in which kernel launches (numba's simulator, Triton's interpreter) and
    child processes raise :class:`_Refused`."""
    import contextlib
    import subprocess

    @contextlib.contextmanager
    def ctx():
        from numba.cuda.simulator import kernel as simkernel
        patches = [(simkernel.FakeCUDAKernel, "__call__"), (simkernel.FakeCUDAKernel, "__getitem__"),
                   (subprocess, "run"), (subprocess, "Popen")]
        try:
            from triton.runtime import interpreter
            patches.append((interpreter.GridExecutor, "__call__"))
        except ImportError:       # pragma: no cover
            pass
        saved = [(o, n, getattr(o, n)) for o, n in patches]

        def refuse(*_a, **_k):
            raise _Refused()
        for o, n, _ in saved:
            setattr(o, n, refuse)
        try:
            yield
        finally:
            for o, n, f in saved:
                setattr(o, n, f)
    return ctx()


def _functions_in(source, namespace, where):
    """{qualified name: function} for every ``def`` in ``source`` at any depth, each compiled
    on its own (decorators dropped) in a copy of ``namespace``: a nested function that uses
    its enclosing function's variables fails when called, one that does not runs as it
    stands."""
    import ast
    import copy
    out = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = copy.deepcopy(node)
            fn.decorator_list = []
            mod = ast.Module(body=[fn], type_ignores=[])
            ns = dict(namespace, __name__="__main__")      # as if copied into a notebook
            try:
                exec(compile(ast.fix_missing_locations(mod), f"<copied from {where}>", "exec"),
                     ns)
            except Exception:     # noqa: BLE001  (defaults that need the enclosing scope)
                continue
            out[f"{where}:{node.lineno}:{node.name}"] = ns[node.name]
    return out


def _same_on_every_call(fn, calls, allowed=()):
    import signal
    from gemm_lessons.exercise_checks.refusal import no_package_calls

    def expired(*_):
        raise _Refused()
    old = signal.signal(signal.SIGALRM, expired)
    try:
        for args, result in calls:
            signal.setitimer(signal.ITIMER_REAL, 2.0)
            try:
                with _refusing(), no_package_calls("probed", allowed):
                    got = fn(*json.loads(json.dumps(args)))
            except (Exception, _Refused):     # noqa: BLE001
                return False
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            try:
                if not (type(got) is type(result) and got == result):
                    return False
            except Exception:                 # noqa: BLE001  (an array's ==)
                return False
        return True
    finally:
        signal.signal(signal.SIGALRM, old)


def computes_the_answer(calls, units):
    """The functions of ``units`` ([(where, source, namespace)]) that return what the answer
    returned on every one of ``calls`` ([(args, result)]), when the answer's results are not
    all one value."""
    if len(calls) < 1 or len({json.dumps(r, sort_keys=True) for _, r in calls}) < 2 and len(calls) > 1:
        return []
    found = []
    short = _short_helpers()
    for where, source, namespace in units:
        # the module's own functions may be called (a student copies them too), and so may
        # a short helper of another module; a call into any other code of the package is
        # refused, as it is in an answer
        own = [f for f in namespace.values() if callable(f)
               and getattr(f, "__module__", None) == namespace.get("__name__")]
        for name, fn in _functions_in(source, namespace, where).items():
            if _same_on_every_call(fn, calls, own + short):
                found.append(name)
    return found


SHORT = 3       # statements: a helper this short is copied along with what calls it


@lru_cache(maxsize=None)
def _short_helpers():
    """The package's plain functions of at most ``SHORT`` statements (a docstring aside)
    that call nothing: ``ptx_hopper.swizzled_offset``'s one XOR, not ``occupancy``."""
    import ast
    import importlib
    import inspect
    import gemm_lessons as gl  # noqa: F401
    out = []
    for path in sorted((ROOT / "gemm_lessons").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        try:
            mod = importlib.import_module(name)
        except Exception:             # noqa: BLE001  (a GPU-only module)
            continue
        for f in vars(mod).values():
            if not (inspect.isfunction(f) and f.__module__ == name):
                continue
            try:
                node = ast.parse(textwrap.dedent(inspect.getsource(f))).body[0]
            except (OSError, TypeError, SyntaxError, IndexError):
                continue
            body = [st for st in node.body if not (isinstance(st, ast.Expr) and
                                                   isinstance(st.value, ast.Constant))]
            if (len(body) <= SHORT and not node.decorator_list
                    and not any(isinstance(n, ast.Call) for st in body for n in ast.walk(st))):
                out.append(f)
    return out


@lru_cache(maxsize=None)
def _probed_units():
    import importlib
    import gemm_lessons as gl  # noqa: F401  (picks the engine first)
    units = []
    for pattern in PROBED:
        for path in sorted(ROOT.glob(pattern)):
            rel = path.relative_to(ROOT)
            mod = importlib.import_module(".".join(rel.with_suffix("").parts))
            units.append((str(rel), path.read_text(), vars(mod)))
    return units


@lru_cache(maxsize=None)
def answer_calls():
    """{exercise: [(args, result)]}: the calls each check made to its answer, where the
    answer is a plain host function (plain arguments and result), the checks run with
    kernel launches refused (a check stops at its first launch; its calls so far are kept)."""
    import gemm_lessons as gl  # noqa: F401
    out = {}
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        ns = {"__name__": "__main__"}
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            src, g = _src(cell), _grade(cell)
            if not g.get("grade"):
                try:
                    with _refusing():
                        exec(compile(src, f"<{path.stem}>", "exec"), ns)
                except (Exception, _Refused):     # noqa: BLE001
                    pass
                continue
            m = re.search(r"checks\.ex\w+\((\w+)", src)
            fn = ns.get(m.group(1)) if m else None
            if not (callable(fn) and type(fn).__name__ == "function"):
                continue
            calls = []

            def recorder(*args, _fn=fn, _calls=calls, **kw):
                result = _fn(*args, **kw)
                if not kw and _plain(args) and _plain(result):
                    _calls.append((json.loads(json.dumps(args)), json.loads(json.dumps(result))))
                return result
            ns[m.group(1)] = recorder
            try:
                with _refusing():
                    exec(compile(src, f"<{path.stem} check>", "exec"), dict(ns))
            except (Exception, _Refused):         # noqa: BLE001
                pass
            ns[m.group(1)] = fn
            if calls:
                step = max(1, len(calls) // MAX_CALLS)
                out[_exercise(g["grade_id"])] = calls[::step][:MAX_CALLS]
    return out


def test_the_behaviour_probe_reaches_the_plain_answers():
    calls = answer_calls()
    for ex in ("ex01-4", "ex03-1", "ex03-3", "ex04-3", "ex05-2"):
        assert ex in calls, (ex, sorted(calls))


# Exercises whose check (or an instrument) the probe finds computing the answer: "exNN-i":
# why it is still open. Remove an entry when its exercise is fixed.
KNOWN_COMPUTED = {}


@pytest.mark.parametrize("ex", sorted(answer_calls()))
def test_no_check_or_instrument_computes_the_answer(ex):
    found = computes_the_answer(answer_calls()[ex], _probed_units())
    if ex in KNOWN_COMPUTED:
        assert found, f"{ex} is no longer computed by the package: remove it from KNOWN_COMPUTED"
        return
    assert not found, (f"{ex}: these functions return what the answer returns, on every call "
                       f"its check made, without measuring: {found}")


OLD_EX03 = '''
from collections import defaultdict

def ex03_ways(ways):
    def truth(words, nbanks=32, distinct=True):
        banks = defaultdict(list)
        for w in words:
            if not distinct or w not in banks[w % nbanks]:
                banks[w % nbanks].append(w)
        return max(len(s) for s in banks.values())
    return truth

def _bank_of(i, k, width, pad, elem_bytes, *, use_pad=True, use_bytes=True, nbanks=32,
             transposed=False, words=True):
    row = width + pad if use_pad else width
    e = elem_bytes if use_bytes else 4
    off = (k * row + i) if transposed else (i * row + k)
    if not words:
        return (off * e) % nbanks
    if not use_bytes:
        return off % nbanks
    return (off * e // 4) % nbanks
'''


def test_the_probe_finds_the_references_that_were_answers():
    """What closed 03-1's and 03-3's leaks: their checks' ``truth`` (nested) and
    ``_bank_of`` (flags off) returned the answers of the exercises as they were; the token
    rule did not see them, the probe does; a measuring function is not flagged."""
    def ways(words):
        per_bank = {}
        for w in words:
            per_bank.setdefault(w % 32, set()).add(w)
        return max(len(s) for s in per_bank.values())

    def bank(i, k, width, pad, elem_bytes):
        return ((i * (width + pad) + k) * elem_bytes // 4) % 32

    import random
    rng = random.Random(0)
    words = [[rng.randrange(256) for _ in range(32)] for _ in range(6)] + [[7] * 32]
    ways_calls = [((w,), ways(w)) for w in words]
    bank_calls = [((i, k, w, p, e), bank(i, k, w, p, e)) for e in (4, 2, 1) for w in (8, 32)
                  for p in (0, 1) for i in (0, 5, 31) for k in (0, 1, w - 1)]
    from collections import defaultdict
    unit = [("old ex03", OLD_EX03, {"defaultdict": defaultdict, "__name__": "old_ex03"})]
    assert [n.split(":")[-1] for n in computes_the_answer(ways_calls, unit)] == ["truth"]
    assert [n.split(":")[-1] for n in computes_the_answer(bank_calls, unit)] == ["_bank_of"]
    measuring = [("a check that measures", "def _bank(i, k, width, pad, elem_bytes):\n"
                  "    from numba.cuda.simulator import kernel\n"
                  "    kernel.FakeCUDAKernel(lambda: None, device=False)[1, 32]()\n"
                  "    return 0\n", {})]
    assert computes_the_answer(bank_calls, measuring) == []
