"""The package's import graph: layers that only import downwards, and no circle.

Every module of ``gemm_lessons`` is parsed (not imported) and every ``import`` statement in
it is read, at module level or inside a function, absolute or relative. Then:

* no circle: a module never reaches itself through the imports of others;
* a kernel module (``gemm_lessons/kernels/*``) imports neither ``gemm_lessons.api`` nor
  ``gemm_lessons.harness`` nor ``gemm_lessons.labs``: kernels sit below the API, the harness
  and the labs that measure them;
* no module takes another module's private names (``from x import _y``, or ``x._y`` on a
  module it imported). Private *modules* (``_ptx_plumbing``) are the package's shared
  plumbing and may be imported; their public names are what they offer.

Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` too; those implicit edges are
left out (the package's ``__init__`` imports the API, so every module would otherwise sit on
a circle through it), and explicit imports of a package are kept.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = "gemm_lessons"
UPWARD_FOR_KERNELS = ("gemm_lessons.api", "gemm_lessons.harness", "gemm_lessons.labs")


def _modules():
    """{dotted module name: path} for every .py file of the package."""
    out = {}
    for path in sorted((ROOT / PKG).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name):
    return MODULES.get(name, Path()).name == "__init__.py"


def _resolve(module, node):
    """The absolute module a ``from ... import`` names (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module):
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module):
    """[(imported module, names taken from it, line)] and {local name: module} of ``module``."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    found, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PKG:
                    found.append((alias.name, (), node.lineno))
                    if alias.asname:
                        bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if target.split(".")[0] != PKG:
                continue
            names = []
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES:                     # `from pkg import submodule`
                    found.append((sub, (), node.lineno))
                    bound[alias.asname or alias.name] = sub
                else:
                    names.append(alias.name)
            if names:
                found.append((target, tuple(names), node.lineno))
    return tree, found, bound


GRAPH = {m: _imports(m) for m in MODULES}


def _edges():
    return {m: {t for t, _, _ in found if t in MODULES and t != m}
            for m, (_, found, _) in GRAPH.items()}


def _cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _path(edges, comp):
    """One circle inside a strongly connected component, for the message."""
    start = comp[0]
    seen, trail = set(), [start]

    def walk(v):
        for w in sorted(edges[v]):
            if w == start:
                return trail + [start]
            if w in comp and w not in seen:
                seen.add(w)
                trail.append(w)
                got = walk(w)
                if got:
                    return got
                trail.pop()
        return None
    return " -> ".join(walk(start) or comp)


def test_the_walk_sees_every_kind_of_import():
    # the parser finds relative, absolute and function-level imports (guards the test itself)
    _, found, _ = GRAPH["gemm_lessons.registry"]
    assert ("gemm_lessons.engines", (), ) == next((t, n) for t, n, _ in found
                                                  if t == "gemm_lessons.engines")
    assert any(t == "gemm_lessons.kernels" for t, _, _ in found)
    assert len(MODULES) > 20


def test_no_import_circle():
    edges = _edges()
    circles = [_path(edges, c) for c in _cycles(edges)]
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith(PKG + ".kernels.")])
def test_kernel_modules_import_nothing_above_them(module):
    _, found, _ = GRAPH[module]
    bad = [f"line {line}: {t}" for t, _, line in found
           if any(t == u or t.startswith(u + ".") for u in UPWARD_FOR_KERNELS)]
    assert not bad, f"{module} imports the layers above the kernels: {bad}"


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_takes_another_modules_private_names(module):
    tree, found, bound = GRAPH[module]
    bad = [f"line {line}: from {t} import {n}" for t, names, line in found if t != module
           for n in names if _private(n)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in bound and _private(node.attr) \
                and f"{bound[node.value.id]}.{node.attr}" not in MODULES:
            bad.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    assert not bad, f"{module} uses private names of other modules: {bad}"
