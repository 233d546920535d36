"""What each pipeline stage reads, derived from the source: the code files its script runs and the
``params.yaml`` keys that code reads. The validate stage hashes both into the stage's inputs
manifest (:mod:`dmlbench.pipeline.manifests`). Everything is read with :mod:`ast`, nothing is
imported; each file is parsed once.

**Code.** From the stage's script (``stages/<name>.py``) every import is followed through
``src/dmlbench``, module-level and function-level alike (only ``if TYPE_CHECKING:`` blocks are
skipped); importing ``dmlbench.a.b`` runs ``dmlbench/__init__.py`` and ``dmlbench/a/__init__.py``,
so those count too, and so do a module started as ``python -m dmlbench.x`` (a ``"-m"`` followed by
its name in a list) and a data file a module names next to itself (``"literature.csv"``). A
registry package's ``__init__`` (:data:`~dmlbench.params.declared_reads.REGISTRIES`) imports every
member; through it a stage generated per item reaches only the member of its own item of a section
it iterates (``losses/<loss>.py``, the module named as the entry; else the one the registry's
``__missing__`` delegates to, ``timm_<model>`` -> ``models/timm_models.py``), none of a section it
does not iterate; a stage not generated per item (``report``) reaches them all. A member imported
directly is an ordinary import.

**Params.** From each function the script calls with the validated ``Params`` (a parameter
annotated ``Params``), every call that hands it on is followed, and every expression rooted at it is
a read: attribute chains, subscripts with a constant and local aliases, narrowed down to the deepest
key ``params.yaml`` has. Handing ``Params`` where this cannot follow reads the whole file. The
members' own reads, section loaders, guards and narrowed keys are declared in
:mod:`dmlbench.params.declared_reads`.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeGuard

from dmlbench.errors import ConfigError
from dmlbench.params.declared_reads import (
    GUARDS,
    LOADERS,
    MEMBERS,
    NARROWED,
    PLACEHOLDERS,
    REGISTRIES,
    SECTIONS,
)
from dmlbench.stage_inputs import WHOLE_FILE

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


def _module_level(tree: ast.Module) -> Iterator[ast.stmt]:
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
            scope = self.bindings(module, _module_level(tree))
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


@dataclass(frozen=True)
class Registry:
    """A registry package: its members (the modules its dict is built from) and the members its
    ``__missing__`` delegates to."""

    section: str
    package: str
    members: frozenset[str]
    fallback: tuple[str, ...]

    def member_for(self, name: str) -> str:
        """The module of entry ``name``: the member named as it, else the ``__missing__`` fallback."""
        module = f"{self.package}.{name}"
        candidates = [module] if module in self.members else list(self.fallback)
        if len(candidates) != 1:
            raise ConfigError(
                f"{self.section}.{name}: no module {module.replace('.', '/')}.py among the members of {self.package} "
                "(a registry entry lives in the module named as it)"
            )
        return candidates[0]


def load_registry(source: Source, section: str, package: str, variable: str) -> Registry:
    """The members of ``package``'s registry dict ``variable``: the modules whose attributes its
    definition names (``triplet.SPEC``)."""
    tree = source.tree(package)
    bound = {k: v[1] for k, v in source.bindings(package, _module_level(tree)).items() if v[0] == "module"}
    value = None
    for node in _module_level(tree):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == variable for t in targets):
            value = getattr(node, "value", None)
    if value is None:
        raise ConfigError(f"{source.rel(package)} defines no {variable} (the registry of params.yaml's {section})")
    members = {
        bound[node.value.id]
        for node in ast.walk(value)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
        and bound[node.value.id].startswith(package + ".")
    }  # fmt: skip
    fallback: list[str] = []
    for missing in ast.walk(tree):
        if isinstance(missing, ast.FunctionDef) and missing.name == "__missing__":
            for inner in ast.walk(missing):
                if isinstance(inner, ast.Name) and bound.get(inner.id) in members and bound[inner.id] not in fallback:
                    fallback.append(bound[inner.id])
    return Registry(section, package, frozenset(members), tuple(fallback))


def code_closure(stage: StageItems, source: Source, registries: Mapping[str, Registry]) -> dict[str, list[str]]:
    """Every file the stage runs or reads as code (modules and their data files) -> the chain of
    imports that reaches it (the script first)."""
    own = {section: registries[section].member_for(name) for section, name in stage.items.items()}
    by_package = {registry.package: registry for registry in registries.values()}
    parent: dict[str, str | None] = {stage.script: None}
    queue = deque([stage.script])
    while queue:
        module = queue.popleft()
        registry = by_package.get(module)
        for imported in source.imports(module):
            if imported in parent:
                continue
            if registry is not None and stage.per_item and imported in registry.members:
                if own.get(registry.section) != imported:
                    continue  # another item's member, reached only through the registry
            parent[imported] = module
            queue.append(imported)
    files: dict[str, list[str]] = {}
    for module in parent:
        chain = [module]
        while (up := parent[chain[-1]]) is not None:
            chain.append(up)
        chain.reverse()
        files.setdefault(source.rel(module), chain)
        for data_file in source.data_files(module):
            files.setdefault(data_file, chain)
    return files


# --------------------------------------------------------------------------- params


@dataclass(frozen=True)
class Read:
    """One expression rooted at Params: its ``chain`` (``("attr", name)``, ``("key", name)``,
    ``("sub",)``, ``("call"[, key])``; empty: the object itself, handed where this cannot follow),
    the functions it went through (``trail``) and its text."""

    chain: tuple[tuple[str, ...], ...]
    trail: tuple[str, ...]
    expr: str


def _loads(node: ast.AST) -> TypeGuard[ast.Name]:
    return isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)


def _params_arguments(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    found = set()
    for arg in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]:
        ann = arg.annotation
        if (
            (isinstance(ann, ast.Name) and ann.id == "Params")
            or (isinstance(ann, ast.Attribute) and ann.attr == "Params")
            or (isinstance(ann, ast.Constant) and ann.value == "Params")
        ):
            found.add(arg.arg)
    return found


class ParamsFlow:
    """Where the ``Params`` object goes and what is read from it (memoised per function)."""

    def __init__(self, source: Source):
        self.source = source
        self._memo: dict[tuple[str, int, frozenset[str]], list[Read]] = {}
        self._scripts: dict[str, list[Read]] = {}

    def callee(self, module: str, func: ast.AST | None, expr: ast.expr) -> tuple[str, Any] | None:
        """The definition a call's function expression names, if this can tell."""
        dotted: list[str] = []
        while isinstance(expr, ast.Attribute):
            dotted.insert(0, expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        local = self.source.bindings(module, ast.walk(func)) if func is not None else {}
        target = local.get(expr.id) or self.source.scope(module).get(expr.id)
        if target is None:
            return None
        if target[0] == "def":
            return (target[1], target[2]) if not dotted else None
        if target[0] == "symbol":
            found = self.source.resolve(target[1], target[2]) if target[1] in self.source.files else None
            return found if not dotted else None
        current = target[1]
        for i, part in enumerate(dotted):
            if f"{current}.{part}" in self.source.files:
                current = f"{current}.{part}"
            elif i == len(dotted) - 1 and current in self.source.files:
                return self.source.resolve(current, part)
            else:
                return None
        return None

    def reads(self, module: str, func: Any, names: frozenset[str]) -> list[Read]:
        """What ``func`` and the functions it hands Params to read of the Params its arguments
        ``names`` are."""
        key = (module, func.lineno, names)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = []  # recursion
        trail = (f"{module}.{func.name}",)
        parents = {child: node for node in ast.walk(func) for child in ast.iter_child_nodes(node)}
        held = set(names)
        aliases: dict[str, list[tuple[str, ...]]] = {}

        def chain_of(node: ast.Name) -> tuple[list[tuple[str, ...]], ast.expr]:
            chain: list[tuple[str, ...]] = list(aliases.get(node.id, []))
            top: ast.expr = node
            while True:
                up = parents.get(top)
                if isinstance(up, ast.Attribute) and up.value is top:
                    chain.append(("attr", up.attr))
                elif isinstance(up, ast.Subscript) and up.value is top:
                    constant = isinstance(up.slice, ast.Constant) and isinstance(up.slice.value, str)
                    chain.append(("key", up.slice.value) if constant else ("sub",))  # type: ignore[attr-defined]
                elif isinstance(up, ast.Call) and up.func is top:
                    first = up.args[0] if up.args else None
                    constant = isinstance(first, ast.Constant) and isinstance(first.value, str)
                    getter = bool(chain) and chain[-1] == ("attr", "get")
                    chain.append(("call", first.value) if constant and getter else ("call",))  # type: ignore[union-attr]
                else:
                    return chain, top
                top = up

        def alias_target(top: ast.expr) -> str | None:
            up = parents.get(top)
            if isinstance(up, (ast.Assign, ast.AnnAssign)) and up.value is top:
                targets = up.targets if isinstance(up, ast.Assign) else [up.target]
                if len(targets) == 1 and isinstance(targets[0], ast.Name):
                    return targets[0].id
            return None

        for _ in range(3):  # aliases of aliases
            for node in ast.walk(func):
                if _loads(node) and (node.id in held or node.id in aliases):
                    chain, top = chain_of(node)
                    target = alias_target(top)
                    if target and target not in held:
                        if chain:
                            aliases[target] = chain
                        else:
                            held.add(target)
        found: list[Read] = []
        used = {n.id for n in ast.walk(func) if _loads(n)}
        for node in ast.walk(func):
            if not _loads(node) or (node.id not in held and node.id not in aliases):
                continue
            chain, top = chain_of(node)
            if alias_target(top) in used:
                continue  # read where the alias is used
            if chain:
                found.append(Read(tuple(chain), trail, ast.unparse(top)))
                continue
            found.extend(self._handed_on(module, func, node, parents, trail))
        self._memo[key] = found
        return found

    def _handed_on(self, module: str, func: Any, node: ast.Name, parents: dict, trail: tuple[str, ...]) -> list[Read]:
        """The reads of the function Params is handed to as an argument; the whole file when this
        cannot follow it."""
        call = parents.get(node)
        if isinstance(call, ast.keyword):
            call = parents.get(call)
        callee = self.callee(module, func, call.func) if isinstance(call, ast.Call) else None
        if callee is not None and isinstance(call, ast.Call):
            target_module, target = callee
            if isinstance(target, ast.ClassDef):
                init = [n for n in target.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
                target = init[0] if init else None
                arg_names = [a.arg for a in [*target.args.posonlyargs, *target.args.args][1:]] if target else []
            else:
                arg_names = [a.arg for a in [*target.args.posonlyargs, *target.args.args]]
            passed = {arg_names[i] for i, a in enumerate(call.args) if a is node and i < len(arg_names)}
            passed |= {k.arg for k in call.keywords if k.value is node and k.arg}
            if target is not None and passed and not any(isinstance(a, ast.Starred) for a in call.args):
                return [
                    Read(r.chain, (*trail, *r.trail), r.expr)
                    for r in self.reads(target_module, target, frozenset(passed))
                ]
        return [Read((), trail, ast.unparse(parents.get(node, node)))]

    def script_reads(self, script: str) -> list[Read]:
        """Every read of Params by what ``script`` calls with it, and of the section loaders it calls."""
        if script in self._scripts:
            return self._scripts[script]
        reads: list[Read] = []
        seen: set[int] = set()
        for node in ast.walk(self.source.tree(script)):
            if not isinstance(node, ast.Call):
                continue
            found = self.callee(script, None, node.func)
            if not found or not isinstance(found[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            qualified = f"{found[0]}.{found[1].name}"
            if qualified in LOADERS:
                reads.append(Read((("loader", qualified),), (script, qualified), ast.unparse(node)))
            names = _params_arguments(found[1])
            if names and id(found[1]) not in seen:
                seen.add(id(found[1]))
                reads.extend(Read(r.chain, (script, *r.trail), r.expr) for r in self.reads(*found, frozenset(names)))
        self._scripts[script] = reads
        return reads


def _has_key(data: Any, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return False
        data = data[part]
    return True


def _fill(template: str, stage: StageItems, protocol: str) -> str:
    """``losses.{loss}`` -> ``losses.triplet`` for a stage of that loss, else ``losses``."""
    parts = []
    for part in template.split("."):
        if part == "{protocol}":
            parts.append(protocol)
        elif part.startswith("{"):
            section = PLACEHOLDERS[part.strip("{}")]
            if section not in stage.items:
                break
            parts.append(stage.items[section])
        else:
            parts.append(part)
    return ".".join(parts)


def read_keys(read: Read, stage: StageItems, data: Mapping[str, Any]) -> list[str]:
    """The params.yaml keys one read takes (``params.yaml``: all of them)."""
    protocol = str(data.get("protocol"))
    if read.chain and read.chain[0][0] == "loader":
        return [_fill(LOADERS[read.chain[0][1]], stage, protocol)]
    if not read.chain or read.chain[0][0] != "attr":
        return [WHOLE_FILE]
    member, rest = read.chain[0][1], list(read.chain[1:])
    if member in SECTIONS:
        section = SECTIONS[member]
        getter = rest[:1] == [("attr", "get")] and rest[1:2] and rest[1][0] == "call"
        if rest and (rest[0][0] in ("sub", "key") or getter):
            rest = rest[1:] if rest[0][0] in ("sub", "key") else rest[2:]
            placeholder = {v: k for k, v in PLACEHOLDERS.items()}[section]
            keys, base = [], _fill(f"{section}.{{{placeholder}}}", stage, protocol)
        elif not rest or rest[:2] == [("attr", "keys"), ("call",)]:
            return [] if section in stage.items else [section]
        else:
            return [section]
    elif member in MEMBERS:
        templates, returned = MEMBERS[member]
        keys = [_fill(t, stage, protocol) for t in templates]
        if rest[:1] and rest[0][0] == "call":
            rest = rest[1:]
        if returned is None:
            return keys
        base = _fill(returned, stage, protocol)
    else:
        where = " -> ".join(read.trail)
        raise ConfigError(
            f"Params.{member} (read as {read.expr} in {where}) is not declared in "
            "src/dmlbench/params/declared_reads.py: add what it reads of params.yaml"
        )
    while rest:  # attributes, constant keys and .get("key") narrow the key down
        element = rest.pop(0)
        if element == ("attr", "get") and rest and len(rest[0]) == 2 and rest[0][0] == "call":
            element = ("key", rest.pop(0)[1])
        if element[0] not in ("attr", "key") or not _has_key(data, f"{base}.{element[1]}"):
            break
        base = f"{base}.{element[1]}"
    return [*keys, base]


def params_read(stage: StageItems, reads: list[Read], data: Mapping[str, Any]) -> list[str]:
    """The params.yaml keys the stage reads, none covered by another (``params.yaml``: all)."""
    protocol = str(data.get("protocol"))
    narrowed = {_fill(k, stage, protocol): _fill(v, stage, protocol) for k, v in NARROWED.get(stage.script, {}).items()}
    keys: set[str] = set()
    for read in reads:
        if any(callee in GUARDS.get(caller, {}) for caller, callee in zip(read.trail, read.trail[1:], strict=False)):
            continue
        keys.update(narrowed.get(key, key) for key in read_keys(read, stage, data))
    if WHOLE_FILE in keys:
        return [WHOLE_FILE]
    return sorted(k for k in keys if not any(k.startswith(other + ".") for other in keys))


class Derivation:
    """What every stage of one checkout reads (:meth:`code`, :meth:`params`), the source parsed
    once and each stage's import closure computed once per script and own items."""

    def __init__(self, root: Path):
        self.source = Source(root)
        self.registries = {s: load_registry(self.source, s, p, v) for s, (p, v) in REGISTRIES.items()}
        self.flow = ParamsFlow(self.source)
        self._closures: dict[tuple[str, tuple[tuple[str, str], ...], bool], dict[str, list[str]]] = {}

    def closure(self, stage: StageItems) -> dict[str, list[str]]:
        """Each code file the stage reads -> the chain of imports that reaches it."""
        key = (stage.script, tuple(sorted(stage.items.items())), stage.per_item)
        if key not in self._closures:
            if stage.script not in self.source.files and not (self.source.root / stage.script).is_file():
                raise ConfigError(f"stage {stage.name}: its script {stage.script} is missing")
            self._closures[key] = code_closure(stage, self.source, self.registries)
        return self._closures[key]

    def code(self, stage: StageItems) -> list[str]:
        return sorted(self.closure(stage))

    def params(self, stage: StageItems, data: Mapping[str, Any]) -> list[str]:
        return params_read(stage, self.flow.script_reads(stage.script), data)
