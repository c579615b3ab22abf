"""What a plain `pip install` of this project picks, and whether every lesson runs under it.

pip resolves the project's dependencies against the public index (PyPI) as it would on a
fresh Linux machine with nothing installed, for each Python the course supports, without
installing anything (`pip install --dry-run --report`). The resolved torch / triton / numpy /
numba-cuda set must be one of KNOWN_GOOD below: sets under which every lesson, exercise and
test runs on the simulator and interpreter (and, where said, on a GPU).

Skipped, with the reason, where the index cannot be reached, and where this Python's pip is
older than 23.3 (PIP_NEEDED): pip 23.2, which fresh virtual environments of Python 3.11.7 and
3.12.1 carry, refuses ``--dry-run`` with ``--platform`` ("Can not use any platform or abi
specific options unless installing via '--target'") and cannot resolve the course's
dependencies anyway (torch's exact cuda-toolkit pin against ``cuda-toolkit[nvcc]==13.*``);
the skip says to run ``python -m pip install --upgrade pip``. Results are cached for a day
(GEMM_LESSONS_RESOLVE_CACHE, default ~/.cache/gemm-lessons) so that a second run is instant.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import tomllib
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
INDEX = "https://pypi.org/simple"
PYTHONS = ("3.11", "3.12", "3.13")
# pip takes a --platform as that one tag only: list every tag a glibc-2.28 x86_64 machine
# accepts (nvidia's wheels carry several of them)
PLATFORMS = tuple(f"manylinux_2_{minor}_x86_64" for minor in range(28, 16, -1)) + (
    "manylinux2014_x86_64", "linux_x86_64")
# pip 23.3 is the first that takes --platform/--python-version with --dry-run but without
# --target (pypa/pip#12215), and the first that resolves the course's dependencies
PIP_NEEDED = Version("23.3")
CACHE_SECONDS = 24 * 3600
PIP_TIMEOUT = 900

# Sets under which every lesson runs, and why each limit is there. A resolved set passes
# when it satisfies every specifier of one row.
KNOWN_GOOD = [
    {
        # What CI runs (torch 2.13 CPU, triton 3.9, numpy 2.4.6, numba-cuda 0.30.4 with
        # CUDA 13 NVVM): every unit test, notebook, solution and exercise. Triton from 3.7
        # runs its interpreter with numpy 2.4; numba-cuda 0.30 needs numpy < 2.5
        # (np.row_stack is gone in 2.5); numba-cuda 0.31 and later drop the simulator.
        # torch >= 2.11 is built for CUDA 13, like numba-cuda's cu13 NVVM.
        "why": "triton >= 3.7 with numpy 2.4 (CI's set)",
        "torch": ">=2.11", "triton": ">=3.7", "numpy": ">=2.0,<2.5",
        "numba-cuda": ">=0.30,<0.31", "cuda-bindings": ">=13,<14",
    },
    {
        # The recorded H200 run: torch 2.11 pins triton 3.6.0, whose interpreter fails
        # with numpy 2.4 and newer ("only 0-dimensional arrays can be converted"), so with
        # no GPU (or with exercises that force the interpreter) numpy must stay below 2.4.
        "why": "torch 2.11 / triton 3.6 with numpy < 2.4",
        "torch": ">=2.11,<2.12", "triton": ">=3.6,<3.7", "numpy": ">=2.0,<2.4",
        "numba-cuda": ">=0.30,<0.31", "cuda-bindings": ">=13,<14",
    },
]
WATCHED = ("torch", "triton", "numpy", "numba-cuda", "cuda-bindings")


def requirements():
    """The project's runtime dependencies, as pyproject.toml lists them."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def known_good(resolved: dict) -> dict | None:
    """The first KNOWN_GOOD row that the resolved {name: version} satisfies, else None."""
    for row in KNOWN_GOOD:
        if all(name in resolved and Version(resolved[name]) in SpecifierSet(row[name])
               for name in WATCHED):
            return row
    return None


def pip_env():
    """The environment of a pip that sees only the public index: no local wheel folders,
    no constraint files, no configured mirrors (the user's pip.conf is not read)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def pip_too_old(version: str | None = None) -> str | None:
    """None if this Python's pip (or ``version``) can run the resolution, else why not."""
    if version is None:
        from importlib.metadata import version as dist_version
        version = dist_version("pip")
    if Version(version) >= PIP_NEEDED:
        return None
    return (f"pip {version} is older than {PIP_NEEDED}, which this test and the course's "
            f"install need: run python -m pip install --upgrade pip")


def index_reachable(timeout=10) -> str | None:
    """None if the index answers, else why not."""
    try:
        with urllib.request.urlopen(f"{INDEX}/pip/", timeout=timeout) as r:
            r.read(1)
        return None
    except Exception as e:  # any network failure: no route, DNS, proxy, TLS
        return f"{INDEX} is not reachable from here ({type(e).__name__}: {e})"


def resolve(python: str, reqs: list[str], cache_dir: Path) -> dict:
    """{name: version} that pip would install for ``reqs`` on Linux x86_64 with ``python``."""
    key = hashlib.sha256(json.dumps([python, reqs, PLATFORMS]).encode()).hexdigest()[:16]
    cached = cache_dir / f"resolve-{python}-{key}.json"
    if cached.exists() and time.time() - cached.stat().st_mtime < CACHE_SECONDS:
        report = json.loads(cached.read_text())
    else:
        cache_dir.mkdir(parents=True, exist_ok=True)
        out = cache_dir / f"report-{python}-{key}-{os.getpid()}.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--quiet", "--index-url", INDEX, "--python-version", python,
               "--only-binary=:all:", "--report", str(out),
               # read each wheel's metadata with HTTP range requests instead of downloading
               # it (torch's CUDA libraries alone are GBs)
               "--use-feature=fast-deps"]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        proc = subprocess.run(cmd + reqs, env=pip_env(), capture_output=True, text=True,
                              timeout=PIP_TIMEOUT)
        if proc.returncode != 0:
            raise AssertionError(f"pip could not resolve the dependencies for Python {python}:"
                                 f"\n{proc.stderr[-3000:]}")
        report = json.loads(out.read_text())
        out.replace(cached)
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
            for item in report["install"]}


@pytest.fixture(scope="module")
def resolutions():
    why = pip_too_old() or index_reachable()
    if why:
        pytest.skip(why)
    cache_dir = Path(os.environ.get("GEMM_LESSONS_RESOLVE_CACHE",
                                    Path.home() / ".cache" / "gemm-lessons"))
    reqs = requirements()
    with ThreadPoolExecutor(len(PYTHONS)) as pool:    # network-bound: all three at once
        found = list(pool.map(lambda v: resolve(v, reqs, cache_dir), PYTHONS))
    return dict(zip(PYTHONS, found))


@pytest.mark.parametrize("python", PYTHONS)
def test_default_install_is_a_known_good_set(resolutions, python):
    got = resolutions[python]
    picked = {name: got.get(name, "missing") for name in WATCHED}
    row = known_good(got)
    assert row is not None, (
        f"pip install on Linux with Python {python} picks {picked}, which is not a set under "
        f"which every lesson runs; known good: {[r['why'] for r in KNOWN_GOOD]}")
    # numba-cuda's NVVM (the cu13 extra) and a ptxas of the same CUDA release came along:
    # PTX and its register report with no GPU
    nvvm, nvcc = got.get("nvidia-nvvm"), got.get("nvidia-cuda-nvcc")
    assert nvvm and nvcc and nvvm.split(".")[:2] == nvcc.split(".")[:2], (nvvm, nvcc)


def test_the_table_rejects_the_sets_that_broke():
    # the sets seen failing, so that the table above cannot quietly accept everything
    broken = [
        # numba-cuda[cu12]: pip fell back to torch 2.10 and triton 3.6, with numpy 2.4.6
        {"torch": "2.10.0", "triton": "3.6.0", "numpy": "2.4.6", "numba-cuda": "0.30.4",
         "cuda-bindings": "12.9.10"},
        # the H200's own set: fine on the GPU, but the interpreter fails with numpy 2.4
        {"torch": "2.11.0", "triton": "3.6.0", "numpy": "2.4.6", "numba-cuda": "0.30.4",
         "cuda-bindings": "13.0.3"},
        # numpy 2.5 removes np.row_stack, which numba-cuda 0.30 calls
        {"torch": "2.15.0", "triton": "3.9.0", "numpy": "2.5.0", "numba-cuda": "0.30.4",
         "cuda-bindings": "13.2.0"},
        # numba-cuda 0.31: no simulator
        {"torch": "2.15.0", "triton": "3.9.0", "numpy": "2.4.6", "numba-cuda": "0.31.0",
         "cuda-bindings": "13.2.0"},
    ]
    for s in broken:
        assert known_good(s) is None, s
    ok = {"torch": "2.13.0", "triton": "3.9.0", "numpy": "2.4.6", "numba-cuda": "0.30.4",
          "cuda-bindings": "13.2.0"}
    assert known_good(ok) is KNOWN_GOOD[0]
    assert known_good({**ok, "torch": "2.11.0", "triton": "3.6.0", "numpy": "2.3.5"}) \
        is KNOWN_GOOD[1]


def test_an_old_pip_is_named_with_the_command_that_upgrades_it():
    assert pip_too_old("23.3") is None and pip_too_old("26.3") is None
    why = pip_too_old("23.2.1")
    assert why is not None and "pip 23.2.1 is older than 23.3" in why
    assert "python -m pip install --upgrade pip" in why


def test_platform_markers_leave_macos_and_windows_installable():
    # triton has Linux wheels only and numba-cuda none for macOS: their markers let pip
    # install the rest there, and gemm_lessons then says what is missing (gemm_lessons.guard)
    from packaging.requirements import Requirement
    reqs = {Requirement(r).name: Requirement(r) for r in requirements()}
    for plat, absent in (("darwin", {"triton", "numba-cuda", "cuda-toolkit"}),
                         ("win32", {"triton"}),
                         ("linux", set())):
        env = {"sys_platform": plat, "platform_system": {"darwin": "Darwin", "win32": "Windows",
                                                         "linux": "Linux"}[plat]}
        skipped = {n for n, r in reqs.items() if r.marker and not r.marker.evaluate(env)}
        assert skipped == absent, (plat, skipped)
