"""Every DVC stage depends on the code it runs and on the params it reads.

A dependency missing lets ``dvc repro`` keep results computed by old code or old settings
(``evaluate/screen.py`` once was missing from ``train``). A stage's code and params are listed in
``stages/reads.yaml`` and hashed by the validate stage into the stage's inputs manifest, its one
DVC dependency for them (:mod:`dmlbench.stage_inputs`; validate itself depends on ``stages/`` and
``src/dmlbench`` whole); the lists count here as the stage's deps. These tests derive
both from the source, for **every** stage DVC generates from ``dvc.yaml``: the stages are
resolved by DVC's own parser (``dvc.parsing.DataResolver``, as ``dvc stage list`` does)
against ``params.yaml``, so each ``foreach``/``matrix`` stage is checked with its own item.

**Code.** From the stage's command script (``stages/<name>.py``) every import is followed
through ``src/dmlbench``: module-level and function-level (lazy) imports alike, read with
``ast`` (nothing is imported); only ``if TYPE_CHECKING:`` blocks, which never run, are
skipped. Importing ``dmlbench.a.b`` runs ``dmlbench/__init__.py`` and ``dmlbench/a/__init__.py``,
so package ``__init__`` files are part of the closure; so are the data files a module names
next to itself (``Path(__file__).with_name("literature.csv")``). Every file reached must be
under a dep of the stage: the file itself or a directory that contains it. A failure names
the stage, the file and the chain of imports that reaches it.

Registry members are the one exception. A registry is the dict that a registry package's
``__init__`` builds (``REGISTRIES``); its *members* are the modules whose attributes that
dict's definition names (``triplet.SPEC`` -> ``losses/triplet.py``), read from the AST of the
``__init__``. The other modules of a registry package (``losses/base.py``,
``models/embedding.py``, ``data/archives.py``) are shared code and need a dep like any other
module. The registry ``__init__`` imports every member; that import alone obliges a stage to
depend on

* its own member only, when the stage iterates the registry's params section
  (``matrix: {loss: ${losses}}``, ``foreach: ${datasets}``): it names it by template
  (``src/dmlbench/losses/${item.loss}.py``), so that editing one loss re-runs only that
  loss's stages. What the own member imports is followed as usual;
* no member, when the stage is generated per item but does not iterate that section
  (``download@glyphs`` reaches the losses only through validating params.yaml, and
  validating every section is the ``validate`` stage's job);
* every member, when the stage is not generated per item (``validate``, ``report``): it
  works on the whole grid.

A member that a module imports directly (not through its registry's ``__init__``) is an
ordinary dependency. The member of an item is the one whose entry has that name (the
literal ``name=`` of the attribute the registry names, e.g. ``SPEC = LossSpec(name=...)``),
else the one the registry's ``__missing__`` delegates to (``timm_<model>`` ->
``models/timm_models.py``).

**Params.** From the functions that the stage script hands the validated ``Params`` to
(parameters annotated ``Params``), every call that passes it on is followed (by position
or keyword; handing it where the check cannot follow, to a call it cannot resolve or into a
data structure, requires the whole params.yaml), and every expression rooted at it is read
as a params.yaml key: attribute chains
(``params.tracking.experiment``) and local aliases (``protocol = params.protocol_for(run)``
then ``protocol.augment.crop_size``), down to the deepest key that params.yaml has (a
method such as ``params.evaluate.recall_ks(...)`` reads its whole section). ``PARAMS_API``
declares what each member of ``params.model.Params`` reads (a test checks that it names every
public field, property and method, so a new one cannot slip through). In the sections keyed
by registry entries (``datasets``, ``backbones``, ``losses``) a stage that iterates the
section reads its own item (``datasets.<dataset>``), and testing membership or listing the
keys reads nothing (DVC generated the stage from those keys); a stage that does not iterate
it reads the whole section. ``{protocol}`` is the active protocol; a key under it also needs
``protocol``, which a ``${protocol}`` in the stage's params template provides. A stage's
params cover a key when they list it, a parent of it, or the whole ``params.yaml``.
``NARROWED`` lists the places where a stage may list less than the check derives, each with
its reason, ``GUARDS`` the calls whose reads only refuse stale inputs, and ``SCHEDULING_ONLY``
the sections that only say how a stage is scheduled.
"""

from __future__ import annotations

import ast
import re
import shutil
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dmlbench"

# params.yaml section -> (registry package, the registry dict its __init__ defines)
REGISTRIES = {
    "datasets": ("dmlbench.data", "DATASETS"),
    "backbones": ("dmlbench.models", "BACKBONES"),
    "losses": ("dmlbench.losses", "LOSSES"),
}
# placeholder in PARAMS_API keys -> the registry section whose item it is
PLACEHOLDERS = {"dataset": "datasets", "backbone": "backbones", "loss": "losses"}

# Members of params.model.Params that hold a section keyed by registry entries.
SECTIONS = {
    "datasets": "datasets",
    "backbones": "backbones",
    "losses": "losses",
    "loss_values": "losses",  # the keys losses.<name> sets
    "loss_models": "losses",  # the registry's parameter model of each listed loss
}
# Every other member of params.model.Params: (the keys it reads, the key of the value it returns,
# which attributes taken on that value narrow down; None: nothing further to narrow).
PARAMS_API: dict[str, tuple[tuple[str, ...], str | None]] = {
    "dims": ((), "dims"),
    "seeds": ((), "seeds"),
    "protocol_name": ((), "protocol"),
    "protocols": ((), "protocols"),
    "evaluate": ((), "evaluate"),
    "report": ((), "report"),
    "tracking": ((), "tracking"),
    "protocol": (("protocol",), "protocols.{protocol}"),
    "protocol_for": (("protocol",), "protocols.{protocol}"),
    "loss_params": (("protocol", "protocols.{protocol}", "losses.{loss}"), None),
    "loss_values_for": (("protocol", "protocols.{protocol}", "losses.{loss}"), None),
    "loss_source": (("protocol", "protocols.{protocol}", "losses.{loss}"), None),
    "tuning": ((), "tuning"),
    "cluster": ((), "cluster"),
    "combos": (("datasets", "backbones", "losses", "dims"), None),
    "runs": (("datasets", "backbones", "losses", "dims", "seeds"), None),
    # Guards on the stage's own arguments: DVC generates them from these very lists.
    "check_run": ((), None),
    "check_listed": ((), None),
}
WHOLE_FILE = "params.yaml"

# Loaders a stage script calls instead of handing on the whole Params: what they read, as the
# chain of a read on Params (``datasets.<the stage's dataset>``).
SECTION_LOADERS = {
    "dmlbench.params.datasets.load_dataset_params": [("attr", "datasets"), ("sub",)],
}

# stage (the dvc.yaml name) -> {key the check derives: the narrower key the stage lists instead}
NARROWED = {
    # download_stage hands datasets.<dataset> to the dataset's SPEC.fetch, and every fetch
    # (data/glyphs.py, data/archives.py archive_fetcher) reads only its `source`: image_size or
    # split must not re-download a dataset.
    "download": {"datasets.{dataset}": "datasets.{dataset}.source"},
}

# Sections that say how stages are scheduled, never what they compute: no stage lists them
# (changing a Slurm partition or a job's memory must not re-run a training).
SCHEDULING_ONLY = {"cluster": "Slurm resources of each job (--executor slurm, tune's worker array)"}

# Calls that hand Params over only to refuse stale inputs, never to shape a stage's outputs
# beyond what the stage's listed params and deps already fix:
# function -> {function it hands Params to: why what that reads needs no params entry}
GUARDS = {
    "dmlbench.tune.baseline.baseline_stage": {
        "dmlbench.params.tuning.check_baseline": "tuning.baselines and tuning.dim: what baseline@ stages come from",
    },
    "dmlbench.evaluate.embed.embed_stage": {
        # embed: a model trained with other params than params.yaml has now is refused, by the
        # config hash of the run's RunConfig. train depends on every key that hash covers and embed
        # on train's model, so a change re-runs embed through the model; listing the keys would only
        # mark embed stale before train has run (tests/test_pipeline.py: a loss hyperparameter makes
        # only train stale). The model is rebuilt from the same RunConfig (backbone, dim, pooling,
        # frozen_bn: keys dvc.yaml lists for embed, and the hash covers).
        "dmlbench.params.run.run_config": "its config hash is compared with the one saved with the model",
    },
}


# --------------------------------------------------------------------------- the source, by AST


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` except the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield child
        yield from _runtime_nodes(child)


def _module_level(tree: ast.Module) -> Iterator[ast.AST]:
    """Module-level statements, including those inside if/try/with blocks, not inside defs."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo[:0] = node.orelse
            continue
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo[:0] = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]


class Source:
    """The ``dmlbench`` modules under ``root/src`` and the stage scripts under ``root``.

    Modules are named by their dotted name (``dmlbench.train.loop``; a package by its
    ``__init__``), a stage script by its path (``stages/train.py``)."""

    def __init__(self, root: Path):
        self.root = root
        self.files: dict[str, Path] = {}
        src = root / "src"
        for path in sorted((src / PACKAGE).rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            self.files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
        self._trees: dict[str, ast.Module] = {}
        self._scopes: dict[str, dict[str, tuple[Any, ...]]] = {}
        self._imports: dict[str, list[str]] = {}
        self._data_files: dict[str, list[str]] = {}

    def path(self, module: str) -> Path:
        return self.files[module] if module in self.files else self.root / module

    def rel(self, module: str) -> str:
        return self.path(module).relative_to(self.root).as_posix()

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            self._trees[module] = ast.parse(self.path(module).read_text(), filename=str(self.path(module)))
        return self._trees[module]

    def package_of(self, module: str) -> str:
        if module not in self.files:  # a script
            return ""
        return module if self.files[module].name == "__init__.py" else module.rpartition(".")[0]

    def import_base(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = self.package_of(module).split(".")
        anchor = parts[: len(parts) - node.level + 1]
        return ".".join(anchor + ([node.module] if node.module else []))

    @staticmethod
    def _with_packages(name: str) -> list[str]:
        parts = name.split(".")
        return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]

    def imports(self, module: str) -> list[str]:
        """The dmlbench modules that running ``module`` imports (any function's imports too),
        each named module before the packages whose ``__init__`` importing it runs."""
        if module in self._imports:
            return self._imports[module]
        found: list[str] = self._imports.setdefault(module, [])
        for node in _runtime_nodes(self.tree(module)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = self.import_base(module, node)
                names = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in self.files] + [base]
            for name in names:
                for candidate in self._with_packages(name):
                    if candidate in self.files and candidate not in found:
                        found.append(candidate)
        return found

    def data_files(self, module: str) -> list[str]:
        """Files next to a module that it names in a string (``Path(__file__).with_name("x.csv")``)."""
        if module not in self._data_files:
            self._data_files[module] = self._find_data_files(module) if module in self.files else []
        return self._data_files[module]

    def _find_data_files(self, module: str) -> list[str]:
        folder = self.files[module].parent
        tree = self.tree(module)
        names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        return sorted(
            (folder / name).relative_to(self.root).as_posix()
            for name in names
            if re.fullmatch(r"[\w-]+\.[\w.-]+", name) and not name.endswith(".py") and (folder / name).is_file()
        )

    def bindings(self, module: str, nodes: Iterator[ast.AST]) -> dict[str, tuple[str, ...]]:
        """Names the import statements among ``nodes`` bind: ``("module", m)`` or ``("symbol", m, name)``."""
        bound: dict[str, tuple[str, ...]] = {}
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        bound[alias.asname] = ("module", alias.name)
                    else:
                        head = alias.name.split(".")[0]
                        bound[head] = ("module", head)
            elif isinstance(node, ast.ImportFrom):
                base = self.import_base(module, node)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    target = ("module", full) if full in self.files else ("symbol", base, alias.name)
                    bound[alias.asname or alias.name] = target
        return bound

    def scope(self, module: str) -> dict[str, tuple[str, ...]]:
        """Module-level names: imports and top-level definitions."""
        if module not in self._scopes:
            tree = self.tree(module)
            scope = self.bindings(module, _module_level(tree))
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    scope[node.name] = ("def", module, node)
            self._scopes[module] = scope
        return self._scopes[module]

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """The definition that ``name`` in ``module`` is, following re-exports."""
        target = self.scope(module).get(name)
        if target is None or depth > 8:
            return None
        if target[0] == "def":
            return target[1], target[2]
        if target[0] == "symbol" and target[1] in self.files:
            return self.resolve(target[1], target[2], depth + 1)
        return None


# --------------------------------------------------------------------------- registries


@dataclass
class Registry:
    section: str
    package: str
    members: dict[str, str | None]  # member module -> the name of its entry (None: not a literal)
    fallback: list[str]  # the members the registry's __missing__ delegates to

    def member_for(self, name: str) -> str:
        named = [member for member, entry in self.members.items() if entry == name]
        candidates = named or self.fallback
        if len(candidates) != 1:
            raise AssertionError(
                f"{self.section}.{name}: cannot tell which module of {self.package} defines it "
                f"(entry names: {sorted(v for v in self.members.values() if v)}; __missing__ -> {self.fallback})"
            )
        return candidates[0]


def load_registry(source: Source, section: str, package: str, variable: str) -> Registry:
    tree = source.tree(package)
    bound = {k: v[1] for k, v in source.bindings(package, _module_level(tree)).items() if v[0] == "module"}
    value = None
    for node in _module_level(tree):
        targets = getattr(node, "targets", None) or ([node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == variable for t in targets):
            value = node.value
    assert value is not None, f"{source.rel(package)} defines no {variable}"
    attributes: dict[str, str] = {}
    for node in ast.walk(value):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            member = bound[node.value.id]
            if member.startswith(package + ".") and member != package:
                attributes[member] = node.attr
    members: dict[str, str | None] = {}
    for member, attribute in attributes.items():
        members[member] = None
        for node in _module_level(source.tree(member)):
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == attribute for t in node.targets)
                and isinstance(node.value, ast.Call)
            ):
                for keyword in node.value.keywords:
                    if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                        members[member] = keyword.value.value
    fallback: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "__missing__":
            for inner in ast.walk(node):
                if isinstance(inner, ast.Name) and bound.get(inner.id) in members and bound[inner.id] not in fallback:
                    fallback.append(bound[inner.id])
    return Registry(section, package, members, fallback)


# --------------------------------------------------------------------------- the stages, by DVC


@dataclass
class Stage:
    name: str  # e.g. train@glyphs-tiny_cnn-triplet-32-0
    group: str  # its dvc.yaml entry, e.g. train
    script: str  # e.g. stages/train.py
    deps: list[str]
    params: list[str] | None  # params.yaml keys; None: the whole file
    params_template: list[str]  # the unresolved params entries
    items: dict[str, str]  # registry section -> this stage's entry, for the sections it iterates
    per_item: bool  # generated by foreach/matrix


def _section_of(raw: Any) -> str | None:
    match = re.fullmatch(r"\$\{\s*([\w-]+)\s*\}", raw) if isinstance(raw, str) else None
    return match.group(1) if match and match.group(1) in REGISTRIES else None


def _params_entries(entries: list[Any] | None) -> tuple[list[str] | None, list[str]]:
    keys: list[str] = []
    raw: list[str] = []
    for entry in entries or []:
        if isinstance(entry, str):
            keys.append(entry)
            raw.append(entry)
        else:
            for file, names in entry.items():
                raw.append(f"{file}: {names}")
                if file == WHOLE_FILE and not names:
                    return None, raw
                if file == WHOLE_FILE:
                    keys.extend(names)
    return keys, raw


def _reads(stage: dict[str, Any]) -> dict[str, Any]:
    """What a stage declares it reads (``meta.reads``: its stages/reads.yaml entry, hashed into its
    inputs manifest by the validate stage, :mod:`dmlbench.stage_inputs`); {} when it lists them as
    DVC deps (validate)."""
    return dict((stage.get("meta") or {}).get("reads") or {})


def dvc_stages(dvc_yaml: dict[str, Any], root: Path = ROOT) -> list[Stage]:
    """Every stage DVC generates from ``dvc_yaml`` (with ``root``'s params.yaml), resolved."""
    from dvc.parsing import DataResolver, EntryDefinition, ForeachDefinition, MatrixDefinition
    from dvc.repo import Repo

    stages: list[Stage] = []
    with Repo(str(root)) as repo:
        resolver = DataResolver(repo, str(root), dvc_yaml)
        for group, definition in resolver.definitions.items():
            generated: list[tuple[dict[str, Any], dict[str, str]]] = []
            if isinstance(definition, EntryDefinition):
                template = definition.definition
                generated.append((definition.resolve(), {}))
            elif isinstance(definition, ForeachDefinition):
                template = definition.template
                section = _section_of(definition.foreach_data)
                for key in definition.normalized_iterable:
                    generated.append((definition.resolve_one(key), {section: key} if section else {}))
            elif isinstance(definition, MatrixDefinition):
                template = definition.template
                sections = {k: _section_of(v) for k, v in definition.matrix_data.items()}
                for key, item in definition.normalized_iterable.items():
                    items = {s: str(item[k]) for k, s in sections.items() if s}
                    generated.append((definition.resolve_one(key), items))
            else:  # pragma: no cover - a new kind of dvc.yaml entry
                raise AssertionError(f"{group}: unknown kind of stage definition {type(definition).__name__}")
            _, raw_params = _params_entries(_reads(template).get("params", template.get("params")))
            for resolved, items in generated:
                ((name, stage),) = resolved.items()
                match = re.search(r"\bpython\s+(\S+\.py)\b", stage["cmd"])
                assert match, f"{name}: cannot tell which script `{stage['cmd']}` runs"
                reads = _reads(stage)
                params, _ = _params_entries(reads.get("params", stage.get("params")))
                declared = [*reads.get("code", []), *stage.get("deps", [])]
                stages.append(
                    Stage(
                        name=name,
                        group=group,
                        script=match.group(1),
                        deps=[str(d).rstrip("/") for d in declared],
                        params=params,
                        params_template=raw_params,
                        items=items,
                        per_item=not isinstance(definition, EntryDefinition),
                    )
                )
    return stages


def covered(path: str, deps: list[str]) -> bool:
    return any(path == dep or path.startswith(dep + "/") for dep in deps)


# --------------------------------------------------------------------------- code: import closure


def code_problems(stage: Stage, source: Source, registries: dict[str, Registry]) -> list[str]:
    """One line per module the stage runs that no dep covers, with the imports that reach it."""
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
            if registry is not None and imported in registry.members and stage.per_item:
                if own.get(registry.section) != imported:
                    continue  # another item's member, reached only through the registry
            parent[imported] = module
            queue.append(imported)
    problems = []
    for module in parent:
        chain = [module]
        while parent[chain[-1]] is not None:
            chain.append(parent[chain[-1]])
        reached = " -> ".join(reversed(chain))
        if not covered(source.rel(module), stage.deps):
            problems.append(f"{stage.name}: {source.rel(module)} not in deps ({reached})")
        for data_file in source.data_files(module):
            if not covered(data_file, stage.deps):
                problems.append(f"{stage.name}: {data_file} not in deps ({reached}, which reads it)")
    return problems


# --------------------------------------------------------------------------- params: what the code reads


@dataclass
class Read:
    chain: list[tuple[str, ...]]  # ("attr", name) | ("key", name) | ("sub",) | ("call"[, key]); []: the whole file
    trail: tuple[str, ...]  # the functions the Params object went through
    expr: str


def _loads(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)


def _annotated_params(func: ast.AST) -> set[str]:
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
    """Where the ``Params`` object goes and what is read from it, from the source."""

    def __init__(self, source: Source):
        self.source = source
        self._memo: dict[tuple[str, int, frozenset[str]], list[Read]] = {}

    def callee(self, module: str, func: ast.AST, expr: ast.expr) -> tuple[str, ast.AST] | None:
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

    def entries(self, script: str) -> Iterator[tuple[str, ast.AST, frozenset[str]]]:
        """The functions the script calls that take the validated ``Params``."""
        seen = set()
        for node in ast.walk(self.source.tree(script)):
            if isinstance(node, ast.Call):
                found = self.callee(script, None, node.func)
                if found and isinstance(found[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = _annotated_params(found[1])
                    if names and id(found[1]) not in seen:
                        seen.add(id(found[1]))
                        yield found[0], found[1], frozenset(names)

    def reads(self, module: str, func: ast.AST, names: frozenset[str]) -> list[Read]:
        """What ``func`` (and what it hands the Params object to) reads from the Params object
        that its arguments ``names`` are; each read's trail starts at ``func``."""
        key = (module, func.lineno, names)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = []  # recursion
        trail = (f"{module}.{func.name}",)
        parents = {child: node for node in ast.walk(func) for child in ast.iter_child_nodes(node)}
        names = set(names)
        aliases: dict[str, list[tuple[str, ...]]] = {}

        def chain_of(node: ast.Name) -> tuple[list[tuple[str, ...]], ast.expr]:
            chain: list[tuple[str, ...]] = list(aliases.get(node.id, []))
            top: ast.expr = node
            while True:
                up = parents.get(top)
                if isinstance(up, ast.Attribute) and up.value is top:
                    chain.append(("attr", up.attr))
                elif isinstance(up, ast.Subscript) and up.value is top:
                    key = up.slice
                    constant = isinstance(key, ast.Constant) and isinstance(key.value, str)
                    chain.append(("key", key.value) if constant else ("sub",))
                elif isinstance(up, ast.Call) and up.func is top:
                    first = up.args[0] if up.args else None
                    constant = isinstance(first, ast.Constant) and isinstance(first.value, str)
                    getter = bool(chain) and chain[-1] == ("attr", "get")
                    chain.append(("call", first.value) if constant and getter else ("call",))
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
                if _loads(node) and (node.id in names or node.id in aliases):
                    chain, top = chain_of(node)
                    target = alias_target(top)
                    if target and target not in names:
                        if chain:
                            aliases[target] = chain
                        else:
                            names.add(target)

        found: list[Read] = []
        used = {n.id for n in ast.walk(func) if _loads(n)}
        for node in ast.walk(func):
            if not _loads(node) or (node.id not in names and node.id not in aliases):
                continue
            chain, top = chain_of(node)
            if alias_target(top) in used:
                continue  # read where the alias is used
            if chain:
                found.append(Read(chain, trail, ast.unparse(top)))
                continue
            # the Params object itself, handed on
            call = parents.get(node)
            if isinstance(call, ast.keyword):
                call = parents.get(call)
            callee = self.callee(module, func, call.func) if isinstance(call, ast.Call) else None
            if callee is not None:
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
                    for read in self.reads(target_module, target, frozenset(passed)):
                        found.append(Read(read.chain, (*trail, *read.trail), read.expr))
                    continue
            found.append(Read([], trail, ast.unparse(parents.get(node, node))))
        self._memo[key] = found
        return found

    def stage_reads(self, script: str) -> list[Read]:
        reads: list[Read] = []
        for module, func, names in self.entries(script):
            reads.extend(Read(r.chain, (script, *r.trail), r.expr) for r in self.reads(module, func, names))
        for node in ast.walk(self.source.tree(script)):  # loaders that read one section, not Params
            if isinstance(node, ast.Call):
                found = self.callee(script, None, node.func)
                name = f"{found[0]}.{getattr(found[1], 'name', '')}" if found else ""
                if name in SECTION_LOADERS:
                    reads.append(Read(SECTION_LOADERS[name], (script, name), ast.unparse(node)))
        return reads


def _has_key(data: Any, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def _fill(template: str, stage: Stage, active_protocol: str) -> str:
    """``losses.{loss}`` -> ``losses.triplet`` for a stage of that loss, else ``losses``."""
    parts = []
    for part in template.split("."):
        if part == "{protocol}":
            parts.append(active_protocol)
        elif part.startswith("{"):
            section = PLACEHOLDERS[part.strip("{}")]
            if section not in stage.items:
                break
            parts.append(stage.items[section])
        else:
            parts.append(part)
    return ".".join(parts)


def read_keys(read: Read, stage: Stage, data: dict[str, Any]) -> list[str]:
    """The params.yaml keys one expression reads (``params.yaml`` itself: all of them)."""
    if not read.chain or read.chain[0][0] != "attr":
        return [WHOLE_FILE]
    member, rest = read.chain[0][1], list(read.chain[1:])
    active = str(data.get("protocol"))
    if member in SECTIONS:
        section = SECTIONS[member]
        if rest and (
            rest[0][0] in ("sub", "key") or (rest[0] == ("attr", "get") and rest[1:2] and rest[1][0] == "call")
        ):
            rest = rest[1:] if rest[0][0] in ("sub", "key") else rest[2:]
            placeholder = {v: k for k, v in PLACEHOLDERS.items()}[section]
            keys, base = [], _fill(f"{section}.{{{placeholder}}}", stage, active)
        elif not rest or rest[:2] == [("attr", "keys"), ("call",)]:
            return [] if section in stage.items else [section]
        else:
            return [section]
    elif member in PARAMS_API:
        templates, returned = PARAMS_API[member]
        keys = [_fill(t, stage, active) for t in templates]
        if rest[:1] and rest[0][0] == "call":
            rest = rest[1:]
        if returned is None:
            return keys
        base = _fill(returned, stage, active)
    else:
        raise AssertionError(f"Params.{member} (read as {read.expr}) is not in PARAMS_API: add what it reads")
    steps = list(rest)
    while steps:  # attributes, constant keys and .get("key") narrow the key down
        element = steps.pop(0)
        if element == ("attr", "get") and steps and len(steps[0]) == 2 and steps[0][0] == "call":
            element = ("key", steps.pop(0)[1])
        if element[0] not in ("attr", "key") or not _has_key(data, f"{base}.{element[1]}"):
            break
        base = f"{base}.{element[1]}"
    return [*keys, base]


def params_problems(stage: Stage, reads: list[Read], data: dict[str, Any]) -> list[str]:
    """One line per params.yaml key the stage's code reads that its ``params:`` do not cover."""
    if stage.params is None:
        return []
    active = str(data.get("protocol"))
    narrowed = {_fill(k, stage, active): _fill(v, stage, active) for k, v in NARROWED.get(stage.group, {}).items()}
    problems: dict[str, str] = {}
    for read in reads:
        if any(callee in GUARDS.get(caller, {}) for caller, callee in zip(read.trail, read.trail[1:], strict=False)):
            continue
        for key in read_keys(read, stage, data):
            if key.split(".")[0] in SCHEDULING_ONLY:
                continue
            listed = stage.params
            ok = any(key == p or key.startswith(p + ".") for p in listed)
            if key == "protocol" and any("${protocol}" in entry for entry in stage.params_template):
                ok = True  # the stage's params keys move with the protocol's name
            if key in narrowed and any(narrowed[key] == p or narrowed[key].startswith(p + ".") for p in listed):
                ok = True
            if not ok and key not in problems:
                what = repr(key) if key != WHOLE_FILE else "all of params.yaml (Params goes where this cannot follow)"
                problems[key] = f"{stage.name}: params {what} not in params ({' -> '.join(read.trail)}: {read.expr})"
    return list(problems.values())


# --------------------------------------------------------------------------- fixtures


def _read_dvc_yaml(root: Path = ROOT) -> dict[str, Any]:
    """dvc.yaml with each entry's stages/reads.yaml lists as its ``meta.reads`` (what the validate
    stage hashes into the stage's inputs manifest)."""
    from dmlbench.pipeline.manifests import pipeline_definition

    return pipeline_definition(root)


@pytest.fixture(scope="module")
def source() -> Source:
    return Source(ROOT)


@pytest.fixture(scope="module")
def registries(source: Source) -> dict[str, Registry]:
    return {section: load_registry(source, section, package, name) for section, (package, name) in REGISTRIES.items()}


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return dvc_stages(_read_dvc_yaml())


@pytest.fixture(scope="module")
def params_data() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _all_problems(stages: list[Stage], source: Source, registries, params_data) -> list[str]:
    flow = ParamsFlow(source)
    problems = []
    for stage in stages:
        problems += code_problems(stage, source, registries)
        problems += params_problems(stage, flow.stage_reads(stage.script), params_data)
    return problems


@pytest.fixture(scope="module")
def baseline(stages, source, registries, params_data) -> set[str]:
    """The problems of the real dvc.yaml (none when it is right): a test that breaks something
    on purpose looks at what that adds."""
    return set(_all_problems(stages, source, registries, params_data))


# --------------------------------------------------------------------------- the checks


def test_every_stage_is_checked(stages):
    groups = set(_read_dvc_yaml()["stages"])
    assert {stage.group for stage in stages} == groups
    assert all((ROOT / stage.script).is_file() for stage in stages)


def test_every_stage_depends_on_the_code_it_runs(stages, source, registries):
    problems = [p for stage in stages for p in code_problems(stage, source, registries)]
    assert not problems, "stages/reads.yaml: add these code files (or the folder holding them):\n" + "\n".join(problems)


def test_every_stage_depends_on_the_params_it_reads(stages, source, params_data):
    flow = ParamsFlow(source)
    problems = [p for stage in stages for p in params_problems(stage, flow.stage_reads(stage.script), params_data)]
    assert not problems, "stages/reads.yaml: add these params:\n" + "\n".join(problems)


def test_editing_one_member_reruns_only_its_own_items_stages(stages, source, registries):
    """A stage generated per item covers no other item's member (nor, where it does not
    iterate the registry, any member), unless a module imports that member directly. The
    backbones are the exception: a ``timm_<model>`` key has no module of its own name, so no
    DVC template can name its member, and stages that iterate the backbones depend on
    ``src/dmlbench/models`` as a whole."""
    coarse = {"backbones"}
    packages = {registry.package for registry in registries.values()}
    imported_directly = {m for module in source.files if module not in packages for m in source.imports(module)}
    problems = []
    for stage in stages:
        if not stage.per_item:
            continue
        for section, registry in registries.items():
            if section in coarse and section in stage.items:
                continue
            own = registry.member_for(stage.items[section]) if section in stage.items else None
            for member in registry.members:
                if member != own and member not in imported_directly and covered(source.rel(member), stage.deps):
                    problems.append(f"{stage.name}: depends on {source.rel(member)}, another {section} item's member")
    assert not problems, "\n".join(problems)


def test_member_templates_name_the_member_of_every_registered_entry(source, registries):
    """A dep templated by item (``src/dmlbench/losses/${item.loss}.py``) names the member of
    every entry of the registry, not only of those params.yaml lists now."""
    problems = []
    for group, definition in _read_dvc_yaml()["stages"].items():
        if "matrix" in definition:
            placeholders = {f"${{item.{k}}}": _section_of(v) for k, v in definition["matrix"].items()}
            template = definition
        elif "foreach" in definition:
            placeholders = {"${key}": _section_of(definition["foreach"])}
            template = definition["do"]
        else:
            continue
        for dep in [*_reads(template).get("code", []), *template.get("deps", [])]:
            for placeholder, section in placeholders.items():
                if section is None or placeholder not in dep or not dep.startswith("src/"):
                    continue
                for member, name in registries[section].members.items():
                    if name is None:
                        continue
                    path = dep.replace(placeholder, name)
                    if not covered(source.rel(registries[section].member_for(name)), [path]):
                        problems.append(f"{group}: dep {dep} is {path} for {section}.{name}, not {source.rel(member)}")
    assert not problems, "\n".join(problems)


def test_registry_members_are_found(registries, source):
    assert {"dmlbench.losses.triplet", "dmlbench.losses.contrastive"} <= set(registries["losses"].members)
    assert "dmlbench.losses.base" not in registries["losses"].members
    assert {"dmlbench.data.glyphs", "dmlbench.data.cub200"} <= set(registries["datasets"].members)
    assert {"dmlbench.data.base", "dmlbench.data.archives"}.isdisjoint(registries["datasets"].members)
    assert "dmlbench.models.embedding" not in registries["backbones"].members
    assert registries["losses"].member_for("triplet") == "dmlbench.losses.triplet"
    assert registries["backbones"].member_for("tiny_cnn") == "dmlbench.models.tiny_cnn"
    assert registries["backbones"].member_for("timm_convnext_tiny.fb_in1k") == "dmlbench.models.timm_models"
    for registry in registries.values():  # every member's entry name is found
        assert None not in registry.members.values(), registry


def test_params_api_names_every_member_of_params(source):
    tree = source.tree("dmlbench.params.model")
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Params"]
    members = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            members.add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            members.add(node.name)
    missing = sorted(members - set(PARAMS_API) - set(SECTIONS))
    assert not missing, f"add what params.model.Params.{missing[0]} reads from params.yaml to PARAMS_API"


def test_the_import_chain_names_how_a_module_is_reached(stages, source, registries):
    train = next(s for s in stages if s.group == "train")
    without = Stage(**{**train.__dict__, "deps": [d for d in train.deps if d != "src/dmlbench/evaluate/screen.py"]})
    (problem,) = [p for p in code_problems(without, source, registries) if "screen.py" in p]
    assert problem.startswith(f"{train.name}: src/dmlbench/evaluate/screen.py not in deps (stages/train.py -> ")
    assert problem.endswith(" -> dmlbench.evaluate.screen)")


# --------------------------------------------------------------------------- the checks fail


def _train_group(dvc_yaml: dict[str, Any]) -> dict[str, Any]:
    return dvc_yaml["stages"]["train"]


def test_a_missing_dep_fails(source, registries, params_data, baseline):
    dvc_yaml = _read_dvc_yaml()
    _train_group(dvc_yaml)["meta"]["reads"]["code"].remove("src/dmlbench/evaluate/screen.py")
    problems = set(_all_problems(dvc_stages(dvc_yaml), source, registries, params_data)) - baseline
    assert problems and all("src/dmlbench/evaluate/screen.py not in deps" in p for p in problems)
    assert {p.split(":")[0].split("@")[0] for p in problems} == {"train"}


def test_a_missing_member_template_fails(source, registries, params_data, baseline):
    dvc_yaml = _read_dvc_yaml()
    _train_group(dvc_yaml)["meta"]["reads"]["code"].remove("src/dmlbench/losses/${item.loss}.py")
    problems = set(_all_problems(dvc_stages(dvc_yaml), source, registries, params_data)) - baseline
    losses = {s.items["losses"] for s in dvc_stages(dvc_yaml) if s.group == "train"}
    assert {re.search(r"(src/dmlbench/losses/\w+\.py) not in deps", p).group(1) for p in problems} == {
        f"src/dmlbench/losses/{name}.py" for name in losses
    }


def test_a_missing_params_key_fails(source, registries, params_data, baseline):
    dvc_yaml = _read_dvc_yaml()
    _train_group(dvc_yaml)["meta"]["reads"]["params"].remove("evaluate")
    problems = set(_all_problems(dvc_stages(dvc_yaml), source, registries, params_data)) - baseline
    assert problems
    expected = r"train@\S+: params 'evaluate' not in params \(stages/train.py -> .*: params\.evaluate"
    assert all(re.match(expected, p) for p in problems), problems


def test_a_new_import_without_its_dep_fails(tmp_path, params_data):
    """A copy of the source where the training loop lazily imports one more module."""
    for name in ("src", "stages"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    loop = tmp_path / "src" / PACKAGE / "train" / "loop.py"
    loop.write_text(loop.read_text() + "\n\ndef _added():\n    from dmlbench.analysis import statistics\n")
    copied = Source(tmp_path)
    registries = {s: load_registry(copied, s, p, n) for s, (p, n) in REGISTRIES.items()}
    stages = [s for s in dvc_stages(_read_dvc_yaml()) if s.group == "train"]
    problems = [p for stage in stages for p in code_problems(stage, copied, registries)]
    chain = "stages/train.py -> dmlbench.train.stage -> dmlbench.train.loop -> dmlbench.analysis.statistics"
    assert any(p.endswith(f"src/dmlbench/analysis/statistics.py not in deps ({chain})") for p in problems), problems


def test_a_new_params_read_fails(tmp_path, params_data):
    """A copy of the source where the training loop also reads ``params.report``."""
    for name in ("src", "stages"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    stage_py = tmp_path / "src" / PACKAGE / "train" / "stage.py"
    text = stage_py.read_text()
    line = "    config = run_config(params, run)\n"
    assert line in text
    text = text.replace(line, f"{line}    print(params.report.title)\n", 1)
    stage_py.write_text(text)
    flow = ParamsFlow(Source(tmp_path))
    stages = [s for s in dvc_stages(_read_dvc_yaml()) if s.group == "train"]
    problems = [p for stage in stages for p in params_problems(stage, flow.stage_reads(stage.script), params_data)]
    assert problems and any(
        re.match(
            r"train@\S+: params 'report.title' not in params "
            r"\(stages/train.py -> dmlbench.train.stage.train_stage: params.report.title\)",
            p,
        )
        for p in problems
    ), problems


def test_reads_are_derived_through_calls_and_aliases(source, stages, params_data):
    """What the derivation finds for a few stages, by hand."""
    flow = ParamsFlow(source)

    def keys(group: str) -> set[str]:
        stage = next(s for s in stages if s.group == group)
        return {k for r in flow.stage_reads(stage.script) for k in read_keys(r, stage, params_data)}

    active = params_data["protocol"]
    train = keys("train")
    assert {"evaluate", "tracking.experiment", "protocol", f"protocols.{active}"} <= train
    pretrained = keys("embed_pretrained")
    assert f"protocols.{active}.augment" in pretrained and f"protocols.{active}.pooling" in pretrained
    assert f"protocols.{active}" not in pretrained and not any(k.startswith("losses") for k in pretrained)
    assert keys("report") >= {"report", "evaluate.confidence", "datasets", "losses", WHOLE_FILE}
