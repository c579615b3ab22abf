"""The engine is decided at import, before numba or triton, and says what it is."""
import pytest

import gemm_lessons as gl
from gemm_lessons import engines

NO_GPU = not __import__("torch").cuda.is_available()


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU path")
def test_import_switches_on_simulator_and_interpreter_and_is_silent(py):
    r = py("import os, sys, gemm_lessons as gl\n"
           "assert 'numba' not in sys.modules and 'triton' not in sys.modules\n"
           "print(gl.backend(), os.environ['NUMBA_ENABLE_CUDASIM'], os.environ['TRITON_INTERPRET'])")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "simulator 1 1"
    assert r.stderr == ""


def test_import_prints_nothing(py):
    r = py("import gemm_lessons")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU path")
def test_numba_imported_first_without_gpu_is_a_clear_error(py):
    r = py("import numba.cuda\nimport gemm_lessons")
    assert r.returncode != 0
    assert "EngineError" in r.stderr and "Import gemm_lessons first" in r.stderr


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU path")
def test_triton_imported_first_without_gpu_is_a_clear_error(py):
    r = py("import triton\nimport gemm_lessons")
    assert r.returncode != 0
    assert "EngineError" in r.stderr and "Import gemm_lessons first" in r.stderr


def test_forced_simulator_and_bad_setting(py):
    r = py("import gemm_lessons as gl; print(gl.engine())", {"GEMM_LESSONS_ENGINE": "simulator"})
    assert r.returncode == 0 and r.stdout.startswith("simulator") and "GEMM_LESSONS_ENGINE" in r.stdout
    r = py("import gemm_lessons", {"GEMM_LESSONS_ENGINE": "tpu"})
    assert r.returncode != 0 and "GEMM_LESSONS_ENGINE='tpu'" in r.stderr


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU path")
def test_engine_describes_itself():
    eng = gl.engine()
    assert gl.backend() == "simulator" and eng.kind == "simulator"
    assert str(eng).startswith("simulator: numba's CUDA simulator and Triton's interpreter (")
    assert str(gl.device()) == "cpu"
    # a lesson needing sm_80 keeps the simulator here
    assert gl.select_engine(min_cc=(8, 0)).kind == "simulator"


def test_low_occupancy_warnings_are_silenced():
    import warnings
    gl.kernels()  # imports numba
    from numba.core.errors import NumbaPerformanceWarning
    with warnings.catch_warnings(record=True) as caught:
        engines._quiet()
        warnings.warn("Grid size 1 will likely result in GPU under-utilization due to low occupancy.",
                      NumbaPerformanceWarning)
    assert caught == []
