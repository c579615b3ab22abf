"""The generic guards of every check: the hint words (:data:`HINTS`), :class:`ExerciseError`,
a time limit, and :func:`run_answer`, which turns an unfinished TODO, an undefined name or a
launch error into a message that says so."""
from __future__ import annotations

import contextlib
import signal
import threading

from .. import harness


# The words a hint uses for each cause (tests/exercise_mutants.yaml refers to these keys).
HINTS = {
    "todo": "the TODO is not done yet",
    "barrier": "a missing barrier (cuda.syncthreads())",
    "barrier_skipped": "a barrier that some threads skip",
    "wait": "a wait count: cp_async_wait_group(N) leaves a copy of the tile in flight",
    "overlap": "no copy in flight while the tensor cores compute",
    "grid": "the grid is too small",
    "mask": "a missing mask",
    "other": "a masked load without other=",
    "zero": "C is all zero: the K loop accumulates nothing",
    "order": "the tile order",
    "accumulator": "the accumulator type",
    "timeout": "took longer than",
}


class ExerciseError(AssertionError):
    """An exercise's answer is wrong; the message says where and the likely cause."""


@contextlib.contextmanager
def time_limit(seconds, what="the check"):
    """Raise :class:`ExerciseError` if the block runs longer than ``seconds`` (main thread
    only, through SIGALRM; elsewhere the block simply runs)."""
    usable = (threading.current_thread() is threading.main_thread()
              and hasattr(signal, "setitimer"))
    if not usable:
        yield
        return

    def expired(signum, frame):
        raise ExerciseError(f"{what} took longer than {seconds} s: an endless loop, or far "
                            "more work than the exercise needs (a right answer takes a "
                            "fraction of that)")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def run_answer(what, seconds=60):
    """Run a learner's answer: unfinished TODOs, undefined names and launch errors become an
    :class:`ExerciseError` that says so; the whole block has a time limit."""
    with time_limit(seconds, what):
        try:
            yield
        except ExerciseError:
            raise
        except harness.CheckError:
            raise
        except NotImplementedError:
            raise ExerciseError(f"{what}: {HINTS['todo']} (replace `raise "
                                "NotImplementedError()` under the TODO with your code)") from None
        except Exception as e:                                  # noqa: BLE001
            text = f"{type(e).__name__}: {e}"
            if "NotImplementedError" in text:
                raise ExerciseError(f"{what}: {HINTS['todo']} (replace `raise "
                                    "NotImplementedError()` under the TODO with your code)") from None
            if isinstance(e, IndexError) or "IndexError" in text:
                line = learner_line(e)
                at = f" at `{line}`" if line else ""
                raise ExerciseError(
                    f"{what}: an index outside an array{at} ({shorten(text, 160)}): "
                    f"{HINTS['mask']} (a bounds check) for threads or elements past the edge "
                    "of A, B or C, or an index past the dimension of the array it indexes: "
                    "its indices swapped (a shared tile's [k, m] read as [m, k]?), M, N and K "
                    "mixed up, or a loop that runs past its dimension") from None
            if "NameError" in text or isinstance(e, (NameError, UnboundLocalError)):
                raise ExerciseError(
                    f"{what}: a name is used before your code defines it ({shorten(text)}): "
                    f"{HINTS['todo']}, or it does not define every name the code after it "
                    "uses.") from None
            if "make_shape_compatible" in text or "incompatible dimensions" in text:
                raise ExerciseError(
                    f"{what}: two blocks whose shapes do not broadcast ({shorten(text, 160)}): "
                    "a reduction along the wrong axis (tl.sum(x, axis=...) keeps the other "
                    "axes), or a [:, None] / [None, :] in the wrong place") from None
            raise ExerciseError(f"{what} raised {shorten(text)}") from None


@contextlib.contextmanager
def hidden(*caches):
    """Empty the check's caches of its own results (dicts) while a learner's answer runs, and
    put them back after: an answer that reads the check's truth from them finds nothing."""
    saved = [dict(c) for c in caches]
    for c in caches:
        c.clear()
    try:
        yield
    finally:
        for c, old in zip(caches, saved):
            c.update(old)


def learner_line(exc):
    """The source line of the learner's code (a notebook's ``__main__``) where ``exc`` was
    raised: the last such frame of its traceback, or None."""
    import linecache
    line = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_globals.get("__name__") == "__main__":
            text = linecache.getline(frame.f_code.co_filename, tb.tb_lineno).strip()
            line = text or line
        tb = tb.tb_next
    return line


def shorten(text, n=300):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."
