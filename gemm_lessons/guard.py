"""Laptop safety for ``gl.matmul`` and ``gl.gemm`` on the simulator.

With no GPU, a numba kernel runs on numba's CUDA simulator (each CUDA thread a Python
thread) and a Triton kernel on Triton's interpreter (each program a loop of numpy calls). A
size that a GPU finishes in microseconds can take them minutes. Above a work limit (multiply-
adds, M*N*K per batch) this module

* warns, once per call, with a :class:`SimulatorSizeWarning` (one line, naming a size that
  runs in seconds);
* in interactive use (a terminal, or IPython/Jupyter), computes the product in bands of rows
  (or of batches) with a progress bar on stderr. Every kernel handles any M, so a band is an
  ordinary launch on a slice of A, C and the output; each element is computed as in one
  launch. Elsewhere (scripts with stderr redirected, CI) it launches once, as below the limit.

On a GPU, and below the limits, nothing changes. The limits are set so that a call at the
limit takes several seconds on a laptop core (see LIMIT).
"""
from __future__ import annotations

import sys
import warnings

__all__ = ["SimulatorSizeWarning", "LIMIT", "QUICK", "run", "interactive", "check_platform",
           "check_versions"]


class SimulatorSizeWarning(UserWarning):
    """A product large enough that the simulator or interpreter will take a long time."""


# Multiply-adds (B*M*N*K) above which a call warns. Measured on one laptop-class core with
# the default kernels: k01_coalesced (numba, simulator) takes about 2 s at 64x64x64 and 13 s
# at 128x128x128, growing with M*N*K; k07_triton_swizzle (interpreter, float16) about 10 s at
# 128x128x128. At the limit (about 100x100x100) a call takes several seconds.
LIMIT = 2 ** 20
QUICK = 64          # QUICK x QUICK x QUICK: the size to suggest, a second or two
BANDS = 20          # how many bands the progress bar counts (about)


def _simulated():
    from .common import simulated
    return simulated()


def interactive():
    """True in a terminal or an IPython/Jupyter session: where a progress bar is read. False
    where stderr goes to a file or a pipe (logs, CI): no bar is written there."""
    ipython = sys.modules.get("IPython")
    if ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None:
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def too_big(B, M, N, K):
    """True where this product is above the simulator's work limit."""
    return B * M * N * K > LIMIT


def run(entry, caller, B, M, N, K, launch):
    """Compute a product with ``launch(batches, rows)`` (two slices: which batches and which
    rows of the output to compute; a launch with both ``slice(None)`` computes all).

    On the simulator and above the limit: warn, and where a person watches, launch in bands
    of rows (or of batches, when there are several) with a progress bar on stderr."""
    everything = slice(None)
    if not _simulated() or not too_big(B, M, N, K):
        return launch(everything, everything)
    q = QUICK
    shape = f"{M}x{N}x{K}" if B == 1 else f"{B}x{M}x{N}x{K}"
    warnings.warn(f"{caller}: {entry.name} on {shape} runs on the CPU simulator and will take "
                  f"minutes; {q}x{q}x{q} runs in seconds (a GPU runs the large sizes)",
                  SimulatorSizeWarning, stacklevel=3)
    if not interactive():
        return launch(everything, everything)
    from tqdm import tqdm
    along_batch = B > 1
    total = B if along_batch else M
    step = max(1, -(-total // BANDS))
    if not along_batch:
        step = -(-step // 64) * 64      # whole 64-row bands: tile edges stay where they were
    unit = "batch" if along_batch else "row"
    with tqdm(total=total, unit=unit, desc=f"{entry.name} (simulator)", file=sys.stderr,
              leave=False, dynamic_ncols=True) as bar:
        for start in range(0, total, step):
            band = slice(start, min(total, start + step))
            if along_batch:
                launch(band, everything)
            else:
                launch(everything, band)
            bar.update(band.stop - band.start)


# ---- at import: is what the lessons need installed, and usable together? -------------------

HELP_PLATFORM = ("Use a Linux machine (x86_64 or aarch64), WSL2 on Windows, or Google Colab; "
                 "see 'Platforms' in the README")


def _version(dist):
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def missing(platform=None, version=_version):
    """What the lessons need and this Python lacks, as (package, why) pairs. Reads installed
    distributions only: imports neither numba nor triton (the engine is not decided yet)."""
    platform = platform or sys.platform
    out = []
    if version("numba-cuda") is None:
        why = ("numba-cuda has no macOS wheels (after 0.20)" if platform == "darwin" else
               "pip install 'numba-cuda[cu13]>=0.30,<0.31'")
        out.append(("numba-cuda", why))
    if version("triton") is None:
        why = ("Triton ships wheels for Linux only" if platform in ("darwin", "win32") else
               "pip install 'triton>=3.6'")
        out.append(("triton", why))
    return out


def check_platform(platform=None, version=_version):
    """Raise an ImportError that says what is missing and what to do, or return None."""
    platform = platform or sys.platform
    lacking = missing(platform, version)
    if not lacking:
        return None
    names = " and ".join(p for p, _ in lacking)
    reasons = "; ".join(w for _, w in lacking)
    where = {"darwin": "macOS", "win32": "Windows"}.get(platform)
    todo = HELP_PLATFORM if where else "install it (or reinstall: pip install -e .)"
    raise ImportError(f"gemm_lessons needs {names}, not installed here"
                      f"{f' ({where})' if where else ''}: {reasons}. {todo}.")


def _major_minor(v):
    """'3.6.0' -> (3, 6); '2.4.0rc1' -> (2, 4)."""
    import re
    return tuple(int(re.match(r"\d+", x).group()) for x in v.split(".")[:2])


class EnvironmentWarning(UserWarning):
    """Installed versions that are known not to work together on this engine."""


def check_versions(version=_version):
    """Warn where Triton's interpreter will fail: triton < 3.7 with numpy >= 2.4. Only
    meaningful on the simulator (on a GPU, Triton compiles and numpy's version is moot)."""
    triton, numpy = version("triton"), version("numpy")
    if triton and numpy and _major_minor(triton) < (3, 7) and _major_minor(numpy) >= (2, 4):
        warnings.warn(f"triton {triton}'s interpreter fails with numpy {numpy} (the Triton "
                      "lessons with no GPU): pip install 'numpy<2.4', or 'triton>=3.7' with "
                      "a torch that allows it", EnvironmentWarning, stacklevel=3)
