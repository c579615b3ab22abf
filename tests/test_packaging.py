"""pyproject, environment.yml, README and CI agree with each other."""
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pins_learned_the_hard_way():
    deps = pyproject()["project"]["dependencies"]
    joined = " ".join(deps)
    assert re.search(r"numba-cuda\[cu1[23]\]>=0\.30,<0\.31", joined)
    assert "numpy<2.5" in joined
    for name in ("torch", "triton", "matplotlib", "tqdm"):
        assert any(d.startswith(name) for d in deps), name
    dev = " ".join(pyproject()["project"]["optional-dependencies"]["dev"])
    for name in ("pytest", "nbval", "jupyterlab", "ipykernel", "pytest-xdist"):
        assert name in dev


def test_environment_yml_installs_the_project_and_pins_nothing_else():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "conda-forge" in env["channels"]
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = [d for d in env["dependencies"] if isinstance(d, dict)][0]["pip"]
    assert "python=3.12" in conda and "pip" in conda
    assert pip == ["-e .[dev]"]
    # any other conda package would be a second list of dependencies that can drift
    assert set(conda) == {"python=3.12", "pip"}


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Install and test", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [l for l in block.strip().splitlines() if l.strip()]
    assert lines[0] == 'pip install -e ".[dev]"'
    assert lines[1].startswith("pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "torch==2.13.0" in ci and "README.md" in ci and "exit 1" in ci


def test_readme_lesson_table_is_generated():
    r = subprocess.run([sys.executable, "tools/update_readme.py", "--check"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
