"""Imports run only downward: no circle of modules importing each other (function-level and
type-only imports count too) and no private name (``_name``) imported from another module.

A package ``__init__`` that gathers its own members is fine as long as no member imports the
package back (that would be a circle here too)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path, src: Path = SRC) -> str:
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(src: Path = SRC) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """``module -> modules it imports`` (only modules under ``src``), and every
    ``(importer, module, name)`` that imports a private name from another module."""
    modules = {module_name(p, src): p for p in src.rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in modules}
    private: list[tuple[str, str, str]] = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [(known(alias.name), None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [(known(f"{base}.{alias.name}") or known(base), alias.name) for alias in node.names]
            else:
                continue
            for target, name in targets:
                if target is None or target == module:
                    continue
                edges[module].add(target)
                if name and name.startswith("_") and not name.startswith("__"):
                    private.append((module, target, name))
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_and_no_private_name_across_modules():
    edges, private = import_graph()
    assert "dmlbench.config" in edges and "dmlbench.data" in edges["dmlbench.config"]  # the graph is read
    assert cycles(edges) == []
    assert private == []


def test_the_checks_find_a_circle_and_a_private_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg import a\n")
    (package / "a.py").write_text("def f():\n    from pkg.b import _helper\n")
    (package / "b.py").write_text("from . import a\n_helper = 1\n")
    (package / "c.py").write_text("import pkg.a\n")
    edges, private = import_graph(tmp_path)
    assert cycles(edges) == [["pkg.a", "pkg.b"]]
    assert private == [("pkg.a", "pkg.b", "_helper")]
