"""The package's own import graph, read from the source (every ``import`` and ``from``, at module
level or inside a function), for the architecture tests: import circles and ``_private`` names
imported across modules.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "protomolt_jobs"


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``imported`` (a module of the package) at ``line``; ``names`` are
    the names a ``from`` import takes from it."""

    importer: str
    imported: str
    line: int
    names: tuple[str, ...]


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` (the repository), generated ``pb/`` aside."""
    out: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[1:2] == ["pb"]:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def edges(root: Path) -> list[Edge]:
    """Every import of a package module by a package module (function-level ones included)."""
    mods = modules(root)
    found: list[Edge] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _known(alias.name, mods)
                    if target:
                        found.append(Edge(name, target, node.lineno, ()))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                if not base.startswith(PACKAGE):
                    continue
                taken: list[str] = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in mods:  # "from pkg import module"
                        found.append(Edge(name, sub, node.lineno, ()))
                    else:
                        taken.append(alias.name)
                target = _known(base, mods)
                if taken and target:
                    found.append(Edge(name, target, node.lineno, tuple(taken)))
    return [e for e in found if e.importer != e.imported]


def private_attributes(root: Path) -> list[str]:
    """``importer -> module: name`` for every ``alias._private`` read through a module bound by
    an import (``from protomolt_jobs.workflow import cel as _cel`` then ``_cel._WRAPPERS``)."""
    mods = modules(root)
    out: list[str] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in mods:
                        bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    if sub in mods:
                        bound[alias.asname or alias.name] = sub
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and bound[node.value.id] != name
            ):
                out.append(f"{name} -> {bound[node.value.id]}: {node.attr} (line {node.lineno})")
    return out


def _known(dotted: str, mods: dict[str, Path]) -> str | None:
    while dotted:
        if dotted in mods:
            return dotted
        dotted = dotted.rpartition(".")[0]
    return None


def cycles(graph_edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted.

    A package's ``__init__`` importing its own submodules is not a circle of concern (Python
    loads the package first), so edges from a package to a module inside it are left out.
    """
    graph: dict[str, set[str]] = {}
    for e in graph_edges:
        if e.imported.startswith(e.importer + "."):
            continue
        graph.setdefault(e.importer, set()).add(e.imported)
        graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_imports(graph_edges: list[Edge]) -> list[str]:
    """``importer -> imported: name`` for every ``_private`` name taken from another module
    (dunders such as ``__version__`` aside)."""
    return [
        f"{e.importer} -> {e.imported}: {n} (line {e.line})"
        for e in graph_edges
        for n in e.names
        if n.startswith("_") and not n.startswith("__")
    ]
