"""The package's own functions are no answer: :func:`no_package_calls` runs a learner's
function and refuses it when it calls into ``gemm_lessons`` (a finished kernel's helper, a
check's reference), and :func:`refuse_package_kernel` refuses a kernel that is one of the
package's own, and :func:`refuse_package_helpers` a kernel whose source uses the package's
functions (the PTX intrinsics aside). Only calls made by the learner's code count (the
notebook's ``__main__``, or any code neither the package's nor a library's, a string run
with ``exec`` under a module name of its own included): the functions a check hands to the
answer (an ``order``, a helper) are passed as ``allowed``, and what they call in turn is
theirs."""
from __future__ import annotations

import contextlib
import inspect
import os
import sys

from .guards import ExerciseError

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


# the checks' own guards (the time limit's alarm handler runs inside the learner's frame)
_GUARDS = os.path.join(_ROOT, "exercise_checks", "guards.py")


def in_package(code):
    path = os.path.abspath(code.co_filename)
    return path.startswith(_ROOT) and path != _GUARDS


# Where libraries live (the interpreter's prefixes: the standard library, site-packages):
# their frames are nobody's answer. Any other code that is not the package's is the
# learner's, whatever its module's name (a notebook cell, or a string run with exec under a
# name of its own).
_LIBRARIES = tuple(sorted({os.path.abspath(p) + os.sep
                           for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}))


def learners(code):
    """Whether ``code`` is the learner's: neither the package's nor a library's."""
    name = code.co_filename
    if name.startswith("<frozen") or name.startswith("<__array_function__"):
        return False
    path = name if name.startswith("<") else os.path.abspath(name)
    return not path.startswith(_ROOT) and not path.startswith(_LIBRARIES)


def _name(frame):
    code = frame.f_code
    return f"{frame.f_globals.get('__name__', '?')}.{getattr(code, 'co_qualname', code.co_name)}"


@contextlib.contextmanager
def no_package_calls(what, allowed=()):
    """Run the block (a call of the learner's ``what``); if the learner's code called a
    function of the package other than those ``allowed``, raise :class:`ExerciseError` naming
    it. Pure Python answers only (the profiler sees Python calls of this thread)."""
    allowed_codes = set()
    for f in allowed:
        f = inspect.unwrap(f)
        code = getattr(f, "__code__", None)
        if code is not None:
            allowed_codes.add(code)
    found = []

    def refused():
        return ExerciseError(
            f"{what} calls {found[0]}, the package's own function: the package's code is no "
            "answer. Write the computation yourself (that is the exercise)")

    def profile(frame, event, arg):
        if event != "call" or found:
            return
        code = frame.f_code
        caller = frame.f_back
        if (in_package(code) and code not in allowed_codes and code.co_name != "<module>"
                and caller is not None
                and (caller.f_globals.get("__name__") == "__main__" or learners(caller.f_code))):
            found.append(_name(frame))
            raise refused()             # stops the call at once (and unsets the profiler)

    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(old)
    if found:                           # in case the answer swallowed the exception
        raise refused()


def refuse_package_kernel(kernel, what):
    """:class:`ExerciseError` if ``kernel`` (a function, a numba or Triton kernel) was
    defined in the package rather than in the learner's notebook."""
    fn = kernel
    for attr in ("fn", "py_func", "__wrapped__"):
        while hasattr(fn, attr) and getattr(fn, attr) is not fn:
            fn = getattr(fn, attr)
    code = getattr(fn, "__code__", None)
    if code is not None and in_package(code):
        raise ExerciseError(
            f"{what} is the package's own {getattr(fn, '__module__', '')}."
            f"{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}: the package's code "
            "is no answer. Write the kernel yourself (that is the exercise)")


# The intrinsics a kernel is written with (the PTX instructions as functions): never refused.
INTRINSICS = ("gemm_lessons.ptx", "gemm_lessons._ptx_plumbing")


def refuse_package_helpers(kernel, what, allowed=()):
    """:class:`ExerciseError` if the source of ``kernel`` (a Triton or numba kernel, or a
    function) uses a function of the package, by its name or as ``module.name`` of a
    package module, other than the intrinsics (:data:`INTRINSICS`) and those ``allowed``
    (the helpers the exercise hands out). Read
    from the function's source and globals: a kernel is not run as Python on every engine,
    so no call can be watched."""
    import ast
    import textwrap
    import types
    fn = kernel
    for attr in ("fn", "py_func", "__wrapped__"):
        while hasattr(fn, attr) and getattr(fn, attr) is not fn:
            fn = getattr(fn, attr)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return
    glb = dict(getattr(fn, "__globals__", {}))
    try:                       # names the kernel closes over (a kernel made in a function)
        glb.update(inspect.getclosurevars(fn).nonlocals)
    except (TypeError, ValueError):
        pass
    ok = {id(a) for a in allowed} | {id(inspect.unwrap(a)) for a in allowed}

    def own(obj):
        f = obj
        for attr in ("fn", "py_func", "__wrapped__"):
            while hasattr(f, attr) and getattr(f, attr) is not f:
                f = getattr(f, attr)
        c = getattr(f, "__code__", None)
        intrinsic = getattr(f, "__module__", "").startswith(INTRINSICS)
        return (c is not None and in_package(c) and not intrinsic and id(obj) not in ok
                and id(f) not in ok)

    def package_module(obj):
        return isinstance(obj, types.ModuleType) and obj.__name__.startswith("gemm_lessons")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            mod = glb.get(node.value.id)
            if package_module(mod) and own(getattr(mod, node.attr, None)):
                raise ExerciseError(
                    f"{what} uses {mod.__name__}.{node.attr}, the package's own: the "
                    "package's code is no answer. Write it yourself (that is the exercise)")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            obj = glb.get(node.id)
            if obj is not None and obj is not kernel and not package_module(obj) and own(obj):
                raise ExerciseError(
                    f"{what} uses {getattr(obj, '__module__', '?')}.{node.id}, the package's "
                    "own: the package's code is no answer. Write it yourself (that is the "
                    "exercise)")
