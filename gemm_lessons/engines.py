"""Which engine runs the kernels here: a CUDA GPU, or numba's simulator plus Triton's interpreter.

The decision is taken once, when ``gemm_lessons`` is imported, before numba or triton is
imported, because both read their switches (``NUMBA_ENABLE_CUDASIM``, ``TRITON_INTERPRET``)
at import time:

* a CUDA GPU that torch can see -> numba kernels and Triton kernels run on it;
* no GPU (a laptop, CI)         -> numba's CUDA simulator and Triton's interpreter, on CPU
  tensors and tiny shapes.

``GEMM_LESSONS_ENGINE=simulator`` forces the simulator on a GPU machine (for instance to
run a lesson whose instructions the GPU lacks); a user who set ``NUMBA_ENABLE_CUDASIM=1``
gets the simulator too. :func:`select_engine` re-decides, for a lesson with a minimum
compute capability, as long as numba and triton have not been imported yet.

This module also holds the one adapter from torch tensors to what numba takes on each
engine (:func:`as_numba`), so kernel launchers never repeat it.
"""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass

__all__ = ["Engine", "engine", "backend", "device", "select_engine", "as_numba",
           "numba_stream", "EngineError", "on_gpu"]


class EngineError(RuntimeError):
    """The engine cannot be set up as asked; the message says what to do."""


@dataclass(frozen=True)
class Engine:
    """What runs the kernels in this process."""
    kind: str                      # 'cuda', 'simulator' (or 'compile': PTX only, no launches)
    device_name: str | None = None # e.g. 'NVIDIA H200'
    capability: tuple | None = None  # e.g. (9, 0)
    reason: str = ""               # why the simulator, when it is

    def __str__(self):
        if self.kind == "cuda":
            cc = ".".join(map(str, self.capability))
            return f"cuda: {self.device_name} (compute capability {cc})"
        return f"simulator: numba's CUDA simulator and Triton's interpreter ({self.reason})"


_ENGINE: Engine | None = None
_SET_BY_US = False   # True once this module switched the simulator on itself


def _gpu_info():
    """(name, capability) of GPU 0 as torch sees it, or None. Imports neither numba nor triton."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0))


def _decide(min_cc=None) -> Engine:
    forced = os.environ.get("GEMM_LESSONS_ENGINE", "").strip().lower()
    if forced not in ("", "auto", "cuda", "simulator", "compile"):
        raise EngineError(f"GEMM_LESSONS_ENGINE={forced!r}: use 'cuda', 'simulator' or 'auto'")
    if forced == "compile":
        # numba's real CUDA target with no GPU: kernels compile to PTX but cannot launch
        # (used by gemm_lessons.compiled in a subprocess)
        return Engine("compile", reason="compiling only")
    user_sim = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0") and not _SET_BY_US
    if user_sim and forced != "cuda":
        return Engine("simulator", reason="NUMBA_ENABLE_CUDASIM=1 was set")
    if forced == "simulator":
        return Engine("simulator", reason="GEMM_LESSONS_ENGINE=simulator was set")
    info = _gpu_info()
    if info is None:
        if forced == "cuda":
            raise EngineError("GEMM_LESSONS_ENGINE=cuda, but torch sees no CUDA GPU")
        return Engine("simulator", reason="no CUDA GPU found")
    name, cc = info
    if min_cc is not None and tuple(cc) < tuple(min_cc):
        need = ".".join(map(str, min_cc))
        have = ".".join(map(str, cc))
        return Engine("simulator", reason=f"{name} has compute capability {have}; "
                                          f"this lesson needs {need}")
    return Engine("cuda", name, tuple(cc))


def _apply(eng: Engine):
    """Set numba's and triton's switches for ``eng``; refuse if they were already read."""
    global _ENGINE, _SET_BY_US
    want_sim = eng.kind == "simulator"
    numba_in = "numba.cuda" in sys.modules
    if numba_in:
        from numba import config
        if bool(config.ENABLE_CUDASIM) != want_sim:
            if want_sim:
                raise EngineError(
                    "numba's CUDA target was imported before gemm_lessons and there is no "
                    "usable GPU, so kernels cannot run. Import gemm_lessons first (it switches "
                    "on numba's simulator), or set NUMBA_ENABLE_CUDASIM=1 and "
                    "TRITON_INTERPRET=1 before starting Python; in Jupyter, restart the kernel.")
            raise EngineError(
                "numba's CUDA simulator is already on in this process, so the GPU cannot be "
                "used: unset NUMBA_ENABLE_CUDASIM and restart Python (or the Jupyter kernel).")
    if want_sim and "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise EngineError(
            "triton was imported before gemm_lessons with no usable GPU, so Triton kernels "
            "cannot run (its interpreter is switched on at import). Import gemm_lessons first, "
            "or set TRITON_INTERPRET=1 before starting Python; in Jupyter, restart the kernel.")
    if want_sim:
        _SET_BY_US = _SET_BY_US or os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0")
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        os.environ["TRITON_INTERPRET"] = "1"
    elif "triton" not in sys.modules:
        # a GPU run: make sure a simulator setting from an earlier decision does not linger
        if os.environ.get("TRITON_INTERPRET") == "1" and _ENGINE is not None \
                and _ENGINE.kind == "simulator":
            os.environ.pop("TRITON_INTERPRET")
    _ENGINE = eng
    _quiet()
    if want_sim:
        from . import sim_scheduler
        sim_scheduler.install()
    return eng


def _quiet():
    """Silence warnings that would print to stderr in every lesson (and fail nbval)."""
    warnings.filterwarnings("ignore", message=".*[Gg]rid size .* will likely result in GPU under-utilization.*")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"numba\.cuda.*")
    try:
        if "numba" in sys.modules:
            from numba.core.errors import NumbaPerformanceWarning
            warnings.simplefilter("ignore", NumbaPerformanceWarning)
    except ImportError:  # pragma: no cover
        pass
    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")


def engine() -> Engine:
    """The engine in use (decided at import of ``gemm_lessons``)."""
    global _ENGINE
    if _ENGINE is None:
        _apply(_decide())
    return _ENGINE


def backend() -> str:
    """``'cuda'`` or ``'simulator'``; ``str(engine())`` adds the device and capability."""
    return engine().kind


def on_gpu() -> bool:
    return engine().kind == "cuda"


def device():
    """The torch device that kernels take their tensors on: ``cuda`` or ``cpu``."""
    import torch
    return torch.device("cuda" if on_gpu() else "cpu")


def select_engine(min_cc=None, *, simulator=False) -> Engine:
    """Re-decide the engine, first thing in a notebook, before any kernel is used.

    * ``min_cc=(8, 0)``: a lesson that needs that compute capability; on an older GPU it
      switches to the simulator and says why (``str(gl.engine())``).
    * ``simulator=True``: the simulator everywhere, GPU or not (the exercises use it: tiny
      shapes, immediate feedback, countable memory accesses).
    Works as long as numba and triton have not been imported yet in this process.
    """
    if simulator:
        eng = Engine("simulator", reason="chosen for this notebook")
    else:
        eng = _decide(min_cc)
    if eng.kind == engine().kind:
        return engine()
    if "numba.cuda" in sys.modules or "triton" in sys.modules:
        raise EngineError(f"cannot switch to the {eng.kind} engine ({eng.reason}): numba or "
                          "triton was already imported. Restart Python (or the Jupyter kernel) "
                          "and call gl.select_engine(...) right after importing gemm_lessons.")
    return _apply(eng)


def numba_support():
    """Called by launchers once numba is imported: re-applies the warning filters."""
    _quiet()


# ---------------------------------------------------------------- torch -> numba, one place
_VIEWS: "OrderedDict" = None
_STREAMS: dict = {}


def as_numba(t):
    """A zero-copy numba view of the torch tensor ``t`` on the current engine.

    On a GPU: a numba device array sharing ``t``'s memory (``__cuda_array_interface__``),
    strides kept. In the simulator: a simulated device array over ``t.numpy()``, strides
    kept, writes land in ``t``. bfloat16, which numba has no type for, is passed as its raw
    16 bits (``int16``); kernels that take bf16 decode it.

    On a GPU the views are cached by (device, address, shape, strides, dtype): building one
    costs tens of microseconds of Python, as much as a small kernel runs. A view holds no
    reference to its tensor (it is an address and a shape), so the cache keeps no memory
    alive, and a view of the same address and shape is the same view whichever tensor owns
    the memory now. The caller keeps ``t`` alive until the launch is queued (a launcher's
    local variable does; ``as_numba(x.contiguous())`` inline does not: the copy could be
    freed, and its memory handed to the next tensor, before the launch). After that torch's
    allocator, ordered by the stream the kernel runs on, may reuse the memory safely.
    """
    import torch
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    if on_gpu():
        global _VIEWS
        if _VIEWS is None:
            from collections import OrderedDict
            _VIEWS = OrderedDict()
        key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device.index)
        view = _VIEWS.get(key)
        if view is not None:
            _VIEWS.move_to_end(key)            # least recently used goes first
        else:
            from numba import cuda
            desc = t.detach().__cuda_array_interface__
            view = cuda.from_cuda_array_interface(desc, owner=None, sync=False)
            _VIEWS[key] = view
            if len(_VIEWS) > 256:
                _VIEWS.popitem(last=False)
        return view
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    return FakeCUDAArray(t.detach().numpy())


def numba_stream():
    """The numba stream to launch on: torch's current stream on a GPU (so torch and numba
    work stay ordered), the default stream in the simulator."""
    from numba import cuda
    if on_gpu():
        import torch
        current = torch.cuda.current_stream()
        key = (current.device_index, current.cuda_stream)
        stream = _STREAMS.get(key)
        if stream is None:
            if len(_STREAMS) > 64:
                _STREAMS.clear()
            stream = _STREAMS[key] = cuda.external_stream(current.cuda_stream)
        return stream
    return 0
