"""Product checks: :func:`check_product` (the harness's shape suite with an exercise's
diagnosis) and the small pieces every lesson's checks share (a launch on the simulator, a
smaller shape suite, late binding of numba's names)."""
from __future__ import annotations

import contextlib

import torch

from .. import engines, harness
from .guards import ExerciseError, HINTS, run_answer


def _all_zero_hint(out):
    if bool(torch.isfinite(out).all()) and bool((out == 0).all()):
        return HINTS["zero"] + " (is the product added into the accumulator inside the loop?)"
    return None


def check_product(run, name, dtypes=(torch.float32,), cases=None, *, audit=None,
                  threads_per_block=None, seconds=60):
    """:func:`harness.check` with an exercise's diagnosis: an unfinished TODO, a time limit,
    an all-zero result, and (with ``audit``) races or skipped barriers found by the audit,
    which outrank the shape-based guess."""
    cases = harness.shape_suite() if cases is None else cases
    zero = {}

    def run_and_look(a, b, out):
        run(a, b, out)
        zero.setdefault("hint", _all_zero_hint(out.cpu()))

    err = None
    with run_answer(name, seconds):
        try:
            report = harness.check(run_and_look, name, dtypes, cases)
        except harness.CheckError as e:
            err = e
    cause = None
    if audit is not None:
        # a barrier some threads skip comes first: the races it leaves are its consequence
        skipped = audit.epochs.skipped(threads_per_block) if threads_per_block else None
        problem = getattr(audit, "problem", None) or (audit.message() if getattr(audit, "race", None) else None)
        if skipped:
            cause = (f"{HINTS['barrier_skipped']}: in block {skipped[0][:2]} some threads "
                     f"passed {skipped[1]} barriers, others {skipped[2]} (an early return, "
                     "or a syncthreads inside an if: every thread must reach every barrier)")
        elif problem:
            cause = problem
    if err is None and cause is None:
        return report
    if err is not None:
        text = str(err)
        hint = zero.get("hint")
        if cause or hint:
            text = text.split("\nLikely cause:")[0] + "\nLikely cause: " + (cause or hint)
        raise ExerciseError(text)
    raise ExerciseError(f"{name} gives the right numbers here, but: {cause}. On a GPU this "
                        "is a race that gives wrong results some of the time.")


def sim_launch(kernel, grid, block, a, b, c):
    kernel[grid, block](engines.as_numba(a), engines.as_numba(b), engines.as_numba(c))


def ceil_div(a, b):
    return -(-a // b)


# A smaller suite for kernels that run slowly on the simulator: still ragged, 1s and strides.
def small_suite(names=("square", "ragged", "M=1", "K=1", "A transposed")):
    return [c for c in harness.shape_suite(gpu=False) if c.name in names]


def bind_numba(namespace):
    """Bind ``cuda`` and ``float32`` as globals of a checks module (imported late, after the
    engine is chosen): the simulator swaps a kernel's global ``cuda`` for its fake module,
    which a closure variable would escape."""
    import numba
    from numba import cuda as _cuda
    namespace["cuda"] = _cuda
    namespace["float32"] = numba.float32


@contextlib.contextmanager
def launched_kernels():
    """The numba kernels launched inside (simulator): yields a list that each launch
    appends its kernel to (device functions and launches inside a kernel are not counted),
    so that a check handed a launcher can look at the kernel it launched."""
    from numba.cuda.simulator import kernel as simkernel
    real = simkernel.FakeCUDAKernel.__call__
    seen = []

    def call(self, *args):
        if not self._device and not simkernel._kernel_context:
            seen.append(self)
        return real(self, *args)

    simkernel.FakeCUDAKernel.__call__ = call
    try:
        yield seen
    finally:
        simkernel.FakeCUDAKernel.__call__ = real


def launching(launcher, kernel, what="my_launcher"):
    """``run(a, b, c)`` for :func:`check_product`: ``launcher(kernel, a, b, c)``, an
    :class:`ExerciseError` where it did not launch ``kernel`` (an object with a ``launches``
    count: the kernel the exercise hands out) but handed the work to another launcher."""
    from .guards import ExerciseError

    def run(a, b, c):
        before = kernel.launches
        launcher(kernel, a, b, c)
        if kernel.launches == before:
            raise ExerciseError(f"{what} did not launch the kernel it is given "
                                "(kernel[grid, block](...)): the exercise is that launch, "
                                "not another launcher's")
    return run


class LaunchRecorder:
    """Stands for a numba kernel: ``inspect(config, args)`` sees each launch's (grid, block)
    and arguments before it runs (and may raise), then the kernel is launched."""

    def __init__(self, kernel, inspect):
        self.kernel = kernel
        self.inspect = inspect
        self.launches = 0

    def __getitem__(self, config):
        def launch(*args):
            self.inspect(config, args)
            self.launches += 1
            return self.kernel[config](*args)
        return launch


def launch_dims(d):
    """A grid or block as a 3-tuple (an int or a shorter tuple padded with 1s)."""
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))
