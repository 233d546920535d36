"""Imports run only downward: no circle of modules importing each other (function-level and
type-only imports count too), no private name (``_name``) imported from another module, and no
import from a folder (or top-level module) on a lower layer of :data:`LAYERS` to one on a higher
layer.

A package ``__init__`` that gathers its own members is fine as long as no member imports the
package back (that would be a circle here too)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# The house's layers, top first: a unit (a sub-package, or a top-level module) imports only units
# on lower layers (and itself). Registries and leaves at the bottom, the schema above them, the
# concerns that use it above that, the tuning stage and the cost model (over training's FLOP count) near
# the top with the merge of several labs' results (over the analysis), the runner (which prices its
# grid with the cost model) on top.
LAYERS: list[set[str]] = [
    {"dmlbench.pipeline"},
    {"dmlbench.tune", "dmlbench.cost", "dmlbench.results"},
    {"dmlbench.train", "dmlbench.analysis"},
    {"dmlbench.evaluate"},
    {"dmlbench.tracking", "dmlbench.launch"},
    {"dmlbench.params"},
    {"dmlbench.data"},
    {"dmlbench.models", "dmlbench.losses", "dmlbench.paths", "dmlbench.cli"},
    {"dmlbench.safe_load", "dmlbench.devices", "dmlbench.stage_inputs", "dmlbench.dvc_adapter"},
    {"dmlbench.weights_lock"},  # the pins every inputs manifest holds, below the models that load them
    {"dmlbench.schema", "dmlbench.io", "dmlbench.errors", "dmlbench.grid", "dmlbench.messages", "dmlbench.gres"},
]


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


def unit_of(module: str, layers: list[set[str]]) -> str | None:
    """The unit of :data:`LAYERS` a module belongs to (the longest unit that prefixes it)."""
    units = sorted((u for layer in layers for u in layer), key=len, reverse=True)
    return next((u for u in units if module == u or module.startswith(u + ".")), None)


def upward_imports(edges: dict[str, set[str]], layers: list[set[str]], root: str) -> list[str]:
    """Every import from a unit to another on the same or a higher layer, and every module under
    ``root`` that no layer names."""
    level = {unit: depth for depth, layer in enumerate(layers) for unit in layer}
    problems = []
    for module, targets in sorted(edges.items()):
        unit = unit_of(module, layers)
        if unit is None:
            if module != root:
                problems.append(f"{module}: in no layer of LAYERS")
            continue
        for target in sorted(targets):
            other = unit_of(target, layers)
            if other is not None and other != unit and level[other] <= level[unit]:
                problems.append(
                    f"{module} -> {target}: {unit} (layer {level[unit]}) imports {other} (layer {level[other]})"
                )
    return problems


def test_no_import_circle_and_no_private_name_across_modules():
    edges, private = import_graph()
    assert "dmlbench.params.load" in edges and "dmlbench.data" in edges["dmlbench.params.load"]  # the graph is read
    assert cycles(edges) == []
    assert private == []


def test_imports_run_down_the_folder_layers():
    edges, _ = import_graph()
    assert upward_imports(edges, LAYERS, "dmlbench") == []
    registries = {"dmlbench.data", "dmlbench.losses", "dmlbench.models"}
    assert not [
        (m, t)
        for m, ts in edges.items()
        for t in ts
        if unit_of(m, LAYERS) in registries and t.startswith("dmlbench.params")
    ]


def test_the_layer_check_finds_an_upward_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "low").mkdir(parents=True)
    (package / "high").mkdir()
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "high" / "__init__.py").write_text("")
    (package / "high" / "a.py").write_text("from pkg.low import b\n")
    (package / "low" / "b.py").write_text("def f():\n    from pkg.high.a import g\n")  # planted: runs back up
    (package / "loose.py").write_text("")
    edges, _ = import_graph(tmp_path)
    layers = [{"pkg.high"}, {"pkg.low"}]
    assert upward_imports(edges, layers, "pkg") == [
        "pkg.loose: in no layer of LAYERS",
        "pkg.low.b -> pkg.high.a: pkg.low (layer 1) imports pkg.high (layer 0)",
    ]
    (package / "low" / "b.py").write_text("")
    (package / "loose.py").unlink()
    edges, _ = import_graph(tmp_path)
    assert upward_imports(edges, layers, "pkg") == []


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
