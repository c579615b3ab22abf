"""gemm_lessons: the kernels, the check-and-benchmark harness and the plots of the lessons.

    import gemm_lessons as gl
    gl.backend()                                   # 'cuda' or 'simulator'
    gl.kernels()                                   # the registered kernels
    c = gl.matmul(a, b, kernel="k01_coalesced")    # a @ b with that kernel
    c = gl.scaled_matmul(a8, b8, sa, sb, kernel="k11_fp8_rowwise")   # FP8 with scales
    p = gl.prepare("k07_triton_swizzle", a, b)     # the same, resolved once: c = p()
    print(gl.check("k01_coalesced"))               # the shape suite, on this engine
    print(gl.bench("k01_coalesced", 4096))         # against cuBLAS, on a GPU

Importing the package decides the engine (GPU, or numba's simulator and Triton's
interpreter when there is no GPU) before numba or triton is imported; it prints nothing and
launches nothing.
"""
from . import guard as _guard

_guard.check_platform()   # numba-cuda and triton installed? If not: what is missing, what to do

from . import engines as _engines  # noqa: E402
from .engines import EngineError, device, engine, select_engine
from .api import (ACTIVATIONS, Prepared, UnsupportedDevice, auto_kernel, bench, check, check_anywhere, gemm,
                  kernels, matmul, prepare, runs_here, scaled_matmul, show_diff, show_source)
from .harness import CheckError

__version__ = "0.1.0"

__all__ = ["backend", "engine", "device", "select_engine", "kernels", "auto_kernel", "matmul",
           "scaled_matmul",
           "prepare",
           "Prepared", "gemm",
           "check", "check_anywhere", "runs_here", "bench", "show_source", "show_diff", "CheckError", "EngineError", "UnsupportedDevice",
           "ACTIVATIONS"]


def backend() -> str:
    """``'cuda'`` or ``'simulator'``; ``gl.engine()`` adds the device and capability."""
    return _engines.backend()


_engines.engine()
if _engines.engine().kind == "simulator":
    _guard.check_versions()   # triton < 3.7 with numpy >= 2.4 breaks Triton's interpreter
