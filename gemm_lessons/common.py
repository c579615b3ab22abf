"""Small helpers shared by the kernel modules, the instruments and the labs: one copy each.

* :func:`cdiv` - ceiling division (tiles needed to cover a length);
* :func:`grouped_order` - the grouped ("swizzled") tile order of lessons 06-09, in plain
  Python (the Triton and numba kernels carry the same arithmetic in their own language);
* :func:`sm_count` - streaming multiprocessors of the GPU, or :data:`NOMINAL_SMS` off it,
  so that rules which depend on it decide the same way on every engine;
* :func:`wave_fill`, :func:`wave_tile` - how full a persistent grid's waves of tiles are,
  and the largest tile whose waves are full enough (the TMA kernels and ``kernel="auto"``);
* :func:`simulated` - is this process running numba's simulator and Triton's interpreter;
* :func:`dtype_name` - ``"float16"`` for ``torch.float16``: how dtypes are printed;
* :func:`run_on_simulator` - call a function in a child process that runs the simulator,
  so an instrument or a demonstration answers the same on a laptop and on a GPU.

Imports neither numba nor triton, and nothing above :mod:`gemm_lessons.engines`.
"""
from __future__ import annotations

import math

import importlib
import os
import pickle
import subprocess
import sys
from functools import lru_cache

from . import engines

__all__ = ["cdiv", "grouped_order", "NOMINAL_SMS", "sm_count", "smem_optin", "simulated",
           "run_on_simulator", "dtype_name", "geomean", "wave_fill", "wave_tile", "FULL_WAVES"]

NOMINAL_SMS = 132      # an H100/H200 (SXM): the SM count used where there is no GPU


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive integers: how many length-``b`` tiles cover ``a``."""
    return -(-a // b)


def grouped_order(pid: int, num_pid_m: int, num_pid_n: int, group_size_m: int):
    """Program id -> (tile row, tile column) when the tiles run in bands of
    ``group_size_m`` rows, each band walked column by column (the last band may be shorter).
    Blocks that run together then share their rows of A and their columns of B in L2."""
    in_group = group_size_m * num_pid_n            # programs in one band of rows
    first_m = (pid // in_group) * group_size_m     # the band's first tile row
    size_m = min(num_pid_m - first_m, group_size_m)
    return first_m + (pid % in_group) % size_m, (pid % in_group) // size_m


@lru_cache(maxsize=None)
def _device_sms(index: int) -> int:
    import torch
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device=None) -> int:
    """Streaming multiprocessors of the GPU (``device``: a torch device or index; the
    current one by default), or :data:`NOMINAL_SMS` where kernels do not run on a GPU."""
    if not engines.on_gpu():
        return NOMINAL_SMS
    import torch
    if device is None:
        index = torch.cuda.current_device()
    else:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
    return _device_sms(index)


FULL_WAVES = 0.75      # how full, on average, a persistent grid's waves of tiles must be


def wave_fill(tiles, sms):
    """How full the waves of ``tiles`` tiles are on average, one tile per multiprocessor at a
    time (1.0: every wave full; 144 tiles on 132 SMs: two waves, 144 / 264 = 0.55)."""
    return tiles / (cdiv(tiles, sms) * sms) if tiles else 0.0


def wave_tile(M, N, tiles, sms, batch=1):
    """Of the tile shapes ``tiles`` ((BM, BN) pairs, largest first), the first whose waves on
    an M x N output (``batch`` of them) are at least :data:`FULL_WAVES` full, else the one
    whose waves are fullest (the first of equals). A large tile reads less per
    multiply-add, a smaller one leaves fewer multiprocessors idle in the last wave: at
    6128 x 568 on 132 SMs, 128 x 256 tiles make 48 x 3 = 144 tiles (two waves, 55 % full),
    128 x 128 tiles 48 x 5 = 240 (91 % full)."""
    fills = [wave_fill(batch * cdiv(M, bm) * cdiv(N, bn), sms) for bm, bn in tiles]
    for tile, fill in zip(tiles, fills):
        if fill >= FULL_WAVES:
            return tile
    return tiles[fills.index(max(fills))]


@lru_cache(maxsize=None)
def smem_optin(index: int) -> int:
    """The most shared memory one block may ask for on GPU ``index`` (the opt-in limit:
    227 KiB on Hopper, 163 KiB on an A100)."""
    import torch
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def simulated() -> bool:
    """True where numba kernels run on the CUDA simulator and Triton's on its interpreter:
    the one answer to "which engine runs" (decided by :mod:`gemm_lessons.engines`)."""
    return engines.engine().kind == "simulator"


def dtype_name(dtype) -> str:
    """The short name of a torch dtype (``"float16"`` for ``torch.float16``); a string is
    returned as it is, without a ``torch.`` prefix."""
    return str(dtype).replace("torch.", "")


def run_on_simulator(target: str, *args):
    """``module:function(*args)`` on the simulator: here when this process simulates,
    otherwise in a child process with ``GEMM_LESSONS_ENGINE=simulator`` (numba cannot run
    both engines in one process). Arguments and result travel pickled."""
    module, func = target.split(":")
    if simulated():
        return getattr(importlib.import_module(module), func)(*args)
    env = dict(os.environ, GEMM_LESSONS_ENGINE="simulator")
    code = ("import importlib, pickle, sys, gemm_lessons\n"
            f"fn = getattr(importlib.import_module({module!r}), {func!r})\n"
            "args = pickle.loads(sys.stdin.buffer.read())\n"
            "sys.stdout.buffer.write(pickle.dumps(fn(*args)))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, input=pickle.dumps(args),
                          capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError("running {} on the simulator failed:\n{}".format(
            target, proc.stderr.decode(errors="replace")[-3000:]))
    return pickle.loads(proc.stdout)


def geomean(xs):
    """The geometric mean of positive numbers (how the course averages ratios over shapes);
    NaN for none."""
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
