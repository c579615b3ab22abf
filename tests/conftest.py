import os
import subprocess
import sys
from pathlib import Path

import pytest

import gemm_lessons  # noqa: F401  (first: it picks the engine before numba/triton load)

ROOT = Path(__file__).resolve().parents[1]


def run_python(code, env_extra=None, args=None, timeout=600):
    """Run ``python -c code`` (or ``python -m ...`` with args) in a fresh process."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "TRITON_INTERPRET", "GEMM_LESSONS_ENGINE")}
    env.update(env_extra or {})
    cmd = [sys.executable] + (args if args is not None else ["-c", code])
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def py():
    return run_python


def load_module(name, path):
    """The Python file at ``path`` imported as a module called ``name``."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def tool():
    """``tool("launch_cost")``: tools/launch_cost.py imported as a module."""
    return lambda name: load_module(name, ROOT / "tools" / f"{name}.py")
