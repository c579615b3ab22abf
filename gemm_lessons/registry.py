"""The one list of kernels: collected from ``KERNELS`` in each ``gemm_lessons.kernels``
module, in lesson order (and within a lesson, in the order of its steps). Tests, the CLI, the plots and the README table loop over it."""
from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from .kernels import Kernel

__all__ = ["entries", "get", "names"]


@lru_cache(maxsize=None)
def _load():
    from . import engines
    engines.engine()
    # the subpackage, not gl.kernels (the function of the same name on the package)
    kernels = importlib.import_module(__package__ + ".kernels")
    found = []
    for mod in sorted(m.name for m in pkgutil.iter_modules(kernels.__path__)):
        if not (mod.startswith("k") and mod[1:3].isdigit()):
            continue
        module = importlib.import_module(f"{kernels.__name__}.{mod}")
        found.extend(getattr(module, "KERNELS", []))
    engines.numba_support()
    seen = set()
    for k in found:
        if k.name in seen:
            raise RuntimeError(f"two kernels are registered as {k.name!r}")
        seen.add(k.name)
    return tuple(sorted(found, key=lambda k: (k.lesson, k.step)))   # stable: module order within a step


def entries():
    """Every registered kernel, in lesson order."""
    return list(_load())


def names():
    return [k.name for k in _load()]


def get(name) -> Kernel:
    """The kernel called ``name``; a ValueError listing the known names otherwise."""
    if isinstance(name, Kernel):
        return name
    if not isinstance(name, str):
        raise TypeError(f"kernel must be a name (str), got {type(name).__name__}")
    for k in _load():
        if k.name == name:
            return k
    raise ValueError(f"unknown kernel {name!r}; known kernels: {', '.join(names())}")
