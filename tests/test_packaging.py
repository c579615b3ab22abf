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
    # cu13: NVVM of the CUDA that torch >= 2.11 is built for (cu12 forces an old torch)
    assert re.search(r"numba-cuda\[cu13\]>=0\.30,<0\.31", joined)
    assert "numpy<2.5" in joined
    assert "torch>=2.11" in joined
    for name in ("torch", "triton", "matplotlib", "tqdm"):
        assert any(d.startswith(name) for d in deps), name
    dev = " ".join(pyproject()["project"]["optional-dependencies"]["dev"])
    for name in ("pytest", "nbval", "jupyterlab", "ipykernel", "pytest-xdist"):
        assert name in dev


def test_environment_yml_installs_the_project_with_cpu_torch_and_pins_nothing_else():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "conda-forge" in env["channels"]
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = [d for d in env["dependencies"] if isinstance(d, dict)][0]["pip"]
    # the project itself, and PyTorch's CPU wheel index beside PyPI: pip takes torch's CPU
    # build (2.x.y+cpu sorts above PyPI's 2.x.y), everything else as pyproject.toml says
    assert pip == ["--extra-index-url https://download.pytorch.org/whl/cpu", "-e .[dev]"]
    # any other conda package would be a second list of dependencies that can drift
    assert set(conda) == {"python=3.12", "pip"}


def test_readme_quick_start_runs_here_without_a_size_warning():
    # the README's Python example, as written, on this engine: no SimulatorSizeWarning
    import warnings
    from gemm_lessons.guard import SimulatorSizeWarning
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Run", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert "gl.matmul(" in block
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorSizeWarning)
        namespace = {}
        exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["c"].shape == (namespace["M"], namespace["N"])


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Install and test", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [l for l in block.strip().splitlines() if l.strip()]
    assert lines[0] == "python -m pip install --upgrade pip"   # pip 23.2 cannot resolve it
    assert lines[1] == 'pip install -e ".[dev]"'
    assert lines[2].startswith("pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "torch==2.13.0" in ci and "README.md" in ci and "exit 1" in ci
    assert "torch.version.cuda is None" in ci       # "CPU build first" is checked, not assumed


def test_readme_lesson_table_is_generated():
    r = subprocess.run([sys.executable, "tools/update_readme.py", "--check"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
