"""The Colab setup cell (tools/colab.py): a no-op where gemm_lessons imports, an install from
the repository on a Colab runtime that lacks it, and present in every notebook."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import colab  # noqa: E402
import make_exercises  # noqa: E402

# Runs before the cell's code in a child process: every process start (subprocess.Popen,
# which check_call and run use, and os.system) is replaced by a fake that records its
# arguments in $CALLS and succeeds, so a pip call is seen and never made.
PRELUDE = textwrap.dedent("""
    import json, os, subprocess, sys, types
    def _record(args):
        with open(os.environ["CALLS"], "a") as f:
            f.write(json.dumps([str(a) for a in args]) + "\\n")
    class FakePopen:
        def __init__(self, args, *a, **k):
            _record(args if isinstance(args, (list, tuple)) else [args])
            self.args, self.returncode = args, 0
        def communicate(self, *a, **k): return (None, None)
        def wait(self, *a, **k): return 0
        def poll(self): return 0
        def kill(self): pass
        def __enter__(self): return self
        def __exit__(self, *a): return False
    subprocess.Popen = FakePopen
    os.system = lambda cmd: (_record([cmd]), 0)[1]
    if os.environ.get("HIDE_GEMM_LESSONS"):
        sys.modules["gemm_lessons"] = None          # find_spec answers None: not installed
    if os.environ.get("ON_COLAB"):
        sys.modules["google.colab"] = types.ModuleType("google.colab")
    # the GPU driver: $DRIVER_CUDA as cuDriverGetVersion gives it; unset, no driver (no GPU)
    import ctypes
    _real_cdll = ctypes.CDLL
    class _Driver:
        def cuDriverGetVersion(self, ref):
            ref._obj.value = int(os.environ["DRIVER_CUDA"])
            return 0
    def _cdll(name, *a, **k):
        if name == "libcuda.so.1":
            if "DRIVER_CUDA" not in os.environ:
                raise OSError(f"{name}: cannot open shared object file")
            return _Driver()
        return _real_cdll(name, *a, **k)
    ctypes.CDLL = _cdll
    # $UPGRADED: distributions that pip's (recorded) call changes, imported before it
    if os.environ.get("UPGRADED"):
        import importlib.metadata as _md
        _real_version = _md.version
        for _name in os.environ["UPGRADED"].split(","):
            __import__(_name)
        def _version(name):
            changed = os.path.exists(os.environ["CALLS"]) and name in os.environ["UPGRADED"]
            return "99.0" if changed else _real_version(name)
        _md.version = _version
""")


def run_cell(tmp_path, *, missing=False, on_colab=False, code=None, driver=None,
             upgraded=None):
    calls = tmp_path / "calls.jsonl"
    env = dict(os.environ, CALLS=str(calls), PYTHONPATH=str(ROOT))
    for name in ("HIDE_GEMM_LESSONS", "ON_COLAB", "DRIVER_CUDA", "UPGRADED"):
        env.pop(name, None)
    if missing:
        env["HIDE_GEMM_LESSONS"] = "1"
    if on_colab:
        env["ON_COLAB"] = "1"
    if driver is not None:
        env["DRIVER_CUDA"] = str(driver)
    if upgraded:
        env["UPGRADED"] = upgraded
    script = tmp_path / "cell.py"
    script.write_text(PRELUDE + "\n" + (code or colab.cell_source()) + "\n")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    recorded = [json.loads(l) for l in calls.read_text().splitlines()] if calls.exists() else []
    return r, recorded


def test_the_recorder_sees_a_pip_call(tmp_path):
    # the guard itself: a cell that does call pip is caught
    r, calls = run_cell(tmp_path, code="import subprocess, sys\n"
                        "subprocess.check_call([sys.executable, '-m', 'pip', 'list'])")
    assert r.returncode == 0, r.stderr
    assert calls == [[sys.executable, "-m", "pip", "list"]]


def test_no_op_where_gemm_lessons_is_installed(tmp_path):
    r, calls = run_cell(tmp_path)
    assert r.returncode == 0, r.stderr
    assert (r.stdout, r.stderr) == ("", ""), "the setup cell must print nothing"
    assert calls == [], f"the setup cell started a process: {calls}"


def test_no_op_on_colab_once_installed(tmp_path):
    r, calls = run_cell(tmp_path, on_colab=True)
    assert r.returncode == 0 and (r.stdout, r.stderr) == ("", "") and calls == []


def test_does_not_import_gemm_lessons_numba_or_triton(tmp_path):
    code = colab.cell_source() + "\nprint(sorted(m for m in ('gemm_lessons', 'numba', " \
                                 "'triton', 'torch') if sys.modules.get(m) is not None))"
    r, _ = run_cell(tmp_path, code=code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", "the next cell imports gemm_lessons first: it picks the engine"


COURSE = f"gemm_lessons @ git+{colab.REPO_URL}@{colab.BRANCH}"


@pytest.mark.parametrize("driver", [13000, 13020])
def test_installs_from_the_repository_on_colab(tmp_path, driver):
    # a driver that runs CUDA 13: pip installs the course with its dependencies, torch's
    # CUDA 13 build among them
    r, calls = run_cell(tmp_path, missing=True, on_colab=True, driver=driver)
    assert r.returncode == 0, r.stderr
    assert len(calls) == 1, calls
    argv = calls[0]
    assert argv[:4] == [sys.executable, "-m", "pip", "install"]
    assert COURSE in argv and "--no-deps" not in argv
    assert r.stdout.startswith("installing the course and torch's CUDA 13 build")
    assert "restart" not in r.stdout


@pytest.mark.parametrize("driver, says", [(12040, "CUDA 12.4"), (12080, "CUDA 12.8"),
                                          (None, "no GPU")])
def test_an_older_driver_keeps_colabs_torch(tmp_path, driver, says):
    r, calls = run_cell(tmp_path, missing=True, on_colab=True, driver=driver)
    assert r.returncode == 0, r.stderr
    assert len(calls) == 2, calls
    course, deps = calls
    assert course[:4] == [sys.executable, "-m", "pip", "install"] and COURSE in course
    assert "--no-deps" in course, "without --no-deps pip replaces Colab's torch"
    assert deps[:4] == [sys.executable, "-m", "pip", "install"]
    assert deps[deps.index("-q") + 1:] == list(colab.KEEP_TORCH_DEPS)
    assert not any(a.split("[")[0].split(">")[0].split("=")[0].split("<")[0]
                   in ("torch", "triton") for a in course + deps), calls
    assert "numba-cuda[cu12]" in deps[-3], "CUDA 12 bindings, those of Colab's torch"
    from importlib.metadata import version
    assert r.stdout.startswith(f"installing the course beside Colab's torch {version('torch')}")
    assert f"(this runtime's driver: {says}; pip's torch needs CUDA 13)" in r.stdout


@pytest.mark.parametrize("driver", [12040, 13000])
def test_says_to_restart_where_pip_changed_an_imported_package(tmp_path, driver):
    r, _ = run_cell(tmp_path, missing=True, on_colab=True, driver=driver, upgraded="numpy")
    assert r.returncode == 0, r.stderr
    assert "pip changed numpy, already imported: restart the runtime" in r.stdout
    # nothing imported that pip changed: no restart
    (tmp_path / "again").mkdir()
    r, _ = run_cell(tmp_path / "again", missing=True, on_colab=True, driver=driver)
    assert r.returncode == 0 and "restart" not in r.stdout, r.stdout


def test_missing_elsewhere_says_how_to_install(tmp_path):
    r, calls = run_cell(tmp_path, missing=True)
    assert r.returncode != 0 and calls == []
    assert "ModuleNotFoundError: gemm_lessons is not installed: run pip install -e ." in r.stderr


def test_colab_links_point_at_the_repository():
    url = colab.colab_url("notebooks/01_naive.ipynb")
    owner_repo = colab.REPO_URL.removeprefix("https://github.com/")
    assert url == ("https://colab.research.google.com/github/"
                   f"{owner_repo}/blob/{colab.BRANCH}/notebooks/01_naive.ipynb")


@pytest.fixture
def tree(tmp_path):
    for folder in colab.FOLDERS:
        shutil.copytree(ROOT / folder, tmp_path / folder)
    return tmp_path


def _code(cells):
    return [c for c in cells if c["cell_type"] == "code"]


def test_tool_writes_a_tree_that_passes_its_check(tree, capsys):
    before = {p: json.loads(p.read_text()) for p in colab.notebooks(tree)}
    assert colab.main(["--root", str(tree)]) == 0
    assert colab.main(["--check", "--root", str(tree)]) == 0
    texts = {p: p.read_text() for p in colab.notebooks(tree)}
    assert colab.main(["--root", str(tree)]) == 0                       # idempotent
    assert {p: p.read_text() for p in colab.notebooks(tree)} == texts
    for path, old in before.items():
        new = json.loads(texts[path])
        setup = [c for c in new["cells"] if c.get("id") == colab.CELL_ID]
        assert len(setup) == 1 and _code(new["cells"])[0] is setup[0], path
        assert setup[0]["metadata"]["tags"] == [colab.TAG] and setup[0]["outputs"] == []
        others = [c for c in new["cells"] if c.get("id") != colab.CELL_ID]
        assert others == [c for c in old["cells"] if c.get("id") != colab.CELL_ID], \
            f"{path}: the tool changed another cell"


def test_tool_agrees_with_the_exercise_generator(tree):
    colab.main(["--root", str(tree)])
    for sol in sorted((tree / "solutions").glob("*.ipynb")):
        wanted = make_exercises.render(make_exercises.make_exercise(json.loads(sol.read_text())))
        assert (tree / "exercises" / sol.name).read_text() == wanted, sol.name


def test_check_fails_on_a_missing_changed_or_misplaced_cell(tree):
    colab.main(["--root", str(tree)])
    paths = [sorted((tree / f).glob("*.ipynb"))[1] for f in ("notebooks", "solutions", "exercises")]

    def edit(path, fn):
        nb = json.loads(path.read_text())
        fn(nb["cells"])
        path.write_text(colab.render(nb))

    def drop(cells):
        cells[:] = [c for c in cells if c.get("id") != colab.CELL_ID]

    def change(cells):
        cell = next(c for c in cells if c.get("id") == colab.CELL_ID)
        cell["source"] = "".join(cell["source"]).replace("pip", "pip3")

    def move(cells):
        i = next(i for i, c in enumerate(cells) if c.get("id") == colab.CELL_ID)
        cells.append(cells.pop(i))

    for path, fn in zip(paths, (drop, change, move)):
        good = path.read_text()
        edit(path, fn)
        assert colab.main(["--check", "--root", str(tree)]) == 1, fn.__name__
        assert colab.main(["--root", str(tree)]) == 0
        assert path.read_text() == good, f"{fn.__name__}: the tool did not restore the cell"
    assert colab.main(["--check", "--root", str(tree)]) == 0


def test_every_notebook_in_the_repository_has_the_setup_cell():
    assert colab.main(["--check"]) == 0, "run: python tools/colab.py"
