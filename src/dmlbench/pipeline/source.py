"""The ``dmlbench`` package's source and the stage scripts as the derivation of what each stage reads
sees them (:mod:`dmlbench.pipeline.reads`): parsed with :mod:`ast`, never imported, each file once
per process (keyed on its modification time and size), with the imports and strings each module's
runtime code holds (``if TYPE_CHECKING:`` blocks left out).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from dmlbench.errors import ConfigError

PACKAGE = "dmlbench"
Binding = tuple[Any, ...]  # ("module", name) | ("symbol", module, name) | ("def", module, node)


@dataclass(frozen=True)
class StageItems:
    """One stage as DVC generates it: its ``name``, the ``script`` its command runs, its own entry of
    each registry section it iterates (``items``), and whether it is generated per item."""

    name: str
    script: str
    items: Mapping[str, str] = field(default_factory=dict)
    per_item: bool = False


@lru_cache(maxsize=1024)
def _parsed(path: str, mtime_ns: int, size: int) -> ast.Module:
    """The syntax tree of the file at ``path`` as it is now (``mtime_ns``, ``size``): parsed once
    per process, however many derivations read it."""
    return ast.parse(Path(path).read_text(), filename=path)


def _import_base(package: str, node: ast.ImportFrom) -> str:
    """The module an ``import from`` in ``package`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    return ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))


@lru_cache(maxsize=1024)
def _scanned(path: str, mtime_ns: int, size: int, package: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """One walk of a file's runtime code: the modules it imports or starts with ``-m`` (each import
    also as ``base.name``, which may be a module) and the strings it holds."""
    names: list[str] = []
    strings: set[str] = set()
    for node in _runtime_nodes(_parsed(path, mtime_ns, size)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _import_base(package, node)
            names += [*(f"{base}.{alias.name}" for alias in node.names), base]
        elif isinstance(node, (ast.List, ast.Tuple)):
            values = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            names += [str(name) for flag, name in zip(values, values[1:], strict=False) if flag == "-m"]
    return tuple(names), frozenset(strings)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` except the bodies of ``if TYPE_CHECKING:``."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        if isinstance(child, ast.If) and _type_checking(child.test):
            todo.extend(child.orelse)
            continue
        yield child
        todo.extend(ast.iter_child_nodes(child))


def module_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Module-level statements (inside if/try/with blocks too), not those inside definitions."""
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.If) and _type_checking(node.test):
            todo[:0] = node.orelse
            continue
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo[:0] = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]


class Source:
    """The ``dmlbench`` modules under ``root/src`` (by dotted name; a package by its ``__init__``)
    and the stage scripts (by path, ``stages/train.py``), each parsed once."""

    def __init__(self, root: Path):
        self.root = root
        self.files: dict[str, Path] = {}
        src = root / "src"
        for path in sorted((src / PACKAGE).rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            self.files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
        self._trees: dict[str, ast.Module] = {}
        self._imports: dict[str, list[str]] = {}
        self._scopes: dict[str, dict[str, Binding]] = {}
        self._data_files: dict[str, list[str]] = {}

    def path(self, module: str) -> Path:
        return self.files[module] if module in self.files else self.root / module

    def rel(self, module: str) -> str:
        return self.path(module).relative_to(self.root).as_posix()

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            path = self.path(module)
            try:
                stat = path.stat()
                self._trees[module] = _parsed(str(path), stat.st_mtime_ns, stat.st_size)
            except (OSError, SyntaxError) as exc:
                raise ConfigError(f"{self.rel(module)}: cannot read the code a stage runs: {exc}") from None
        return self._trees[module]

    def import_base(self, module: str, node: ast.ImportFrom) -> str:
        package = module if module in self.files and self.files[module].name == "__init__.py" else ""
        if module in self.files and not package:
            package = module.rpartition(".")[0]
        return _import_base(package, node)

    def imports(self, module: str) -> list[str]:
        """The package's modules that running ``module`` imports or starts (``-m``), each before
        the packages whose ``__init__`` importing it runs."""
        if module not in self._imports:
            self._scan(module)
        return self._imports[module]

    def data_files(self, module: str) -> list[str]:
        """Files next to ``module`` that it names in a string (``Path(__file__).with_name("x.csv")``)."""
        if module not in self._data_files:
            self._scan(module)
        return self._data_files[module]

    def _scan(self, module: str) -> None:
        found: list[str] = []
        path = self.path(module)
        stat = path.stat()
        package = module if path.name == "__init__.py" else module.rpartition(".")[0] if module in self.files else ""
        names, strings = _scanned(str(path), stat.st_mtime_ns, stat.st_size, package)
        for name in names:
            parts = name.split(".")
            for candidate in (".".join(parts[:i]) for i in range(len(parts), 0, -1)):
                if candidate in self.files and candidate not in found:
                    found.append(candidate)
        self._imports[module] = found
        self._data_files[module] = sorted(
            (path.parent / name).relative_to(self.root).as_posix()
            for name in strings
            if module in self.files and re.fullmatch(r"[\w-]+\.[\w.-]+", name) and not name.endswith(".py")
            and (path.parent / name).is_file()
        )  # fmt: skip

    def bindings(self, module: str, nodes: Iterator[ast.AST]) -> dict[str, Binding]:
        """The names the import statements among ``nodes`` bind."""
        bound: dict[str, Binding] = {}
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.name if alias.asname else alias.name.split(".")[0]
                    bound[alias.asname or name] = ("module", name)
            elif isinstance(node, ast.ImportFrom):
                base = self.import_base(module, node)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    bound[alias.asname or alias.name] = (
                        ("module", full) if full in self.files else ("symbol", base, alias.name)
                    )
        return bound

    def scope(self, module: str) -> dict[str, Binding]:
        """Module-level names: imports and top-level definitions."""
        if module not in self._scopes:
            tree = self.tree(module)
            scope = self.bindings(module, module_level(tree))
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    scope[node.name] = ("def", module, node)
            self._scopes[module] = scope
        return self._scopes[module]

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, Any] | None:
        """The definition that ``name`` in ``module`` is, following re-exports."""
        target = self.scope(module).get(name)
        if target is None or depth > 8:
            return None
        if target[0] == "def":
            return target[1], target[2]
        if target[0] == "symbol" and target[1] in self.files:
            return self.resolve(target[1], target[2], depth + 1)
        return None
