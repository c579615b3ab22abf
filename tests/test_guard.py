"""gemm_lessons.guard: the simulator's size warning and progress bands, and the import-time
checks of what is installed (faked platforms and missing packages)."""
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import gemm_lessons as gl
from gemm_lessons import guard

ROOT = Path(__file__).resolve().parents[1]
SIM = gl.backend() == "simulator"
ENTRY = SimpleNamespace(name="k01_coalesced", language="numba")


def calls_of(monkeypatch, *, simulated=True, interactive=False):
    monkeypatch.setattr(guard, "_simulated", lambda: simulated)
    monkeypatch.setattr(guard, "interactive", lambda: interactive)
    seen = []
    return seen, (lambda batches, rows: seen.append((batches, rows)))


def test_below_the_limit_one_launch_and_no_warning(monkeypatch):
    seen, launch = calls_of(monkeypatch)
    n = guard.QUICK
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guard.run(ENTRY, "gl.matmul", 1, n, n, n, launch)
    assert seen == [(slice(None), slice(None))]
    assert guard.QUICK ** 3 <= guard.LIMIT


def test_above_the_limit_warns_in_one_line_naming_a_quick_size(monkeypatch):
    seen, launch = calls_of(monkeypatch)
    with pytest.warns(guard.SimulatorSizeWarning) as rec:
        guard.run(ENTRY, "gl.matmul", 1, 1000, 300, 700, launch)
    msg = str(rec[0].message)
    assert "\n" not in msg and "1000x300x700" in msg and "64x64x64 runs in seconds" in msg
    assert issubclass(guard.SimulatorSizeWarning, UserWarning)
    assert seen == [(slice(None), slice(None))]   # not interactive: one launch, no bar


def test_on_a_gpu_nothing_changes(monkeypatch):
    seen, launch = calls_of(monkeypatch, simulated=False, interactive=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guard.run(ENTRY, "gl.matmul", 1, 8192, 8192, 8192, launch)
    assert seen == [(slice(None), slice(None))]


def test_interactive_runs_in_bands_that_cover_every_row_once(monkeypatch, capsys):
    seen, launch = calls_of(monkeypatch, interactive=True)
    with pytest.warns(guard.SimulatorSizeWarning):
        guard.run(ENTRY, "gl.matmul", 1, 1000, 300, 700, launch)
    rows = [r for b, r in seen]
    assert all(b == slice(None) for b, _ in seen) and len(rows) > 1
    covered = [i for r in rows for i in range(r.start, r.stop)]
    assert covered == list(range(1000))
    assert all(r.start % 64 == 0 for r in rows)
    out, err = capsys.readouterr()
    assert out == "" and "k01_coalesced (simulator)" in err   # the bar is on stderr only
    # several batches: bands of whole batches
    seen.clear()
    with pytest.warns(guard.SimulatorSizeWarning):
        guard.run(ENTRY, "gl.gemm", 7, 200, 200, 200, launch)
    assert [i for b, _ in seen for i in range(b.start, b.stop)] == list(range(7))
    assert all(r == slice(None) for _, r in seen)


@pytest.mark.skipif(not SIM, reason="the simulator's path")
def test_banded_results_are_the_product(monkeypatch):
    # a real kernel through gl.matmul and gl.gemm, in bands: the same product as one launch
    monkeypatch.setattr(guard, "LIMIT", 100)
    monkeypatch.setattr(guard, "interactive", lambda: True)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(70, 20, generator=gen), torch.randn(20, 30, generator=gen)
    with pytest.warns(guard.SimulatorSizeWarning) as rec:
        c = gl.matmul(a, b, kernel="k01_coalesced")
    assert rec[0].filename == __file__      # points at the line that called gl.matmul
    ref = a.double() @ b.double()
    assert torch.allclose(c.double(), ref, rtol=1e-5, atol=1e-5)
    x = torch.randn(3, 40, 24, generator=gen)
    w = torch.randn(24, 36, generator=gen)
    bias = torch.randn(36, generator=gen)
    with pytest.warns(guard.SimulatorSizeWarning):
        out = gl.gemm(x, w, bias=bias, activation="relu", kernel="k09_fused_epilogue")
    ref = torch.relu(x.double() @ w.double() + bias.double())
    assert torch.allclose(out.double(), ref, rtol=1e-4, atol=1e-4)
    with pytest.warns(guard.SimulatorSizeWarning):
        out = gl.gemm(x[0], w, bias=bias, kernel="k09_fused_epilogue")   # bands of rows
    assert torch.allclose(out.double(), x[0].double() @ w.double() + bias.double(),
                          rtol=1e-4, atol=1e-4)


def test_no_stored_notebook_output_carries_the_warning():
    import json
    for nb in sorted(ROOT.glob("*/[0-9][0-9]_*.ipynb")):
        text = json.dumps(json.loads(nb.read_text())["cells"])
        assert "SimulatorSizeWarning" not in text and "(simulator):" not in text, nb


# ---- at import: what is missing, what to do ---------------------------------------------

def fake_versions(**present):
    return lambda dist: present.get(dist.replace("-", "_"))


def test_platform_messages():
    none = fake_versions()
    with pytest.raises(ImportError) as e:
        guard.check_platform("darwin", none)
    msg = str(e.value)
    assert "needs numba-cuda and triton" in msg and "(macOS)" in msg
    assert "no macOS wheels" in msg and "Linux only" in msg and "Colab" in msg
    with pytest.raises(ImportError) as e:
        guard.check_platform("win32", fake_versions(numba_cuda="0.30.4"))
    msg = str(e.value)
    assert "needs triton" in msg and "numba-cuda" not in msg and "WSL2" in msg
    with pytest.raises(ImportError) as e:
        guard.check_platform("linux", fake_versions(triton="3.9.0"))
    assert "pip install 'numba-cuda[cu13]" in str(e.value)
    assert guard.check_platform("linux", fake_versions(numba_cuda="0.30.4", triton="3.9.0")) is None


def test_import_on_a_faked_platform_says_what_to_do():
    # a fresh process where importlib.metadata finds no triton, on "Windows"
    code = ("import importlib.metadata as m, sys\n"
            "real = m.version\n"
            "def version(d):\n"
            "    if d == 'triton': raise m.PackageNotFoundError(d)\n"
            "    return real(d)\n"
            "m.version = version\n"
            "sys.platform = 'win32'\n"
            "import gemm_lessons\n")
    env = {k: v for k, v in os.environ.items() if k != "GEMM_LESSONS_ENGINE"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: gemm_lessons needs triton, not installed here (Windows)")
    assert "WSL2" in last


def test_triton_36_with_numpy_24_warns():
    with pytest.warns(guard.EnvironmentWarning, match="numpy<2.4"):
        guard.check_versions(fake_versions(triton="3.6.0", numpy="2.4.6"))
    for ok in (dict(triton="3.9.0", numpy="2.4.6"), dict(triton="3.6.0", numpy="2.3.5"),
               dict(triton="3.7.0rc1", numpy="2.4.0")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            guard.check_versions(fake_versions(**ok))
