"""What each pipeline stage reads, derived from the source with :mod:`ast` (nothing imported, each
file parsed once: :mod:`dmlbench.pipeline.source`): the code files its script runs, and the
``params.yaml`` keys that code reads (:mod:`dmlbench.pipeline.params_flow`); the validate stage
hashes both into the stage's inputs manifest (:mod:`dmlbench.pipeline.manifests`).

**Code.** Every import from ``stages/<name>.py`` followed through ``src/dmlbench`` (not ``if
TYPE_CHECKING:`` blocks), with the package ``__init__`` files an import runs, modules started as
``python -m dmlbench.x`` and data files a module names next to itself. Through a registry package
(:data:`~dmlbench.params.declared_reads.REGISTRIES`) a stage generated per item reaches only the
member of its own item (the entry's module, else the one ``__missing__`` delegates to), and none of
a section it does not iterate; ``report`` reaches them all. Details: docs/pipeline.md.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlbench.errors import ConfigError
from dmlbench.params.declared_reads import REGISTRIES
from dmlbench.pipeline.params_flow import ParamsFlow, params_read
from dmlbench.pipeline.source import Source, StageItems, module_level


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
    bound = {k: v[1] for k, v in source.bindings(package, module_level(tree)).items() if v[0] == "module"}
    value = None
    for node in module_level(tree):
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


def code_closure(stage: StageItems, source: Source, registries: Mapping[str, Registry]) -> list[str]:
    """Every file the stage runs or reads as code (modules and their data files), sorted."""
    own = {section: registries[section].member_for(name) for section, name in stage.items.items()}
    by_package = {registry.package: registry for registry in registries.values()}
    reached, queue = {stage.script}, deque([stage.script])
    while queue:
        module = queue.popleft()
        registry = by_package.get(module)
        for imported in source.imports(module):
            if imported in reached:
                continue
            if registry is not None and stage.per_item and imported in registry.members:
                if own.get(registry.section) != imported:
                    continue  # another item's member, reached only through the registry
            reached.add(imported)
            queue.append(imported)
    return sorted({source.rel(m) for m in reached} | {f for m in reached for f in source.data_files(m)})


class Derivation:
    """What every stage of one checkout reads (:meth:`code`, :meth:`params`), the source parsed
    once and each stage's import closure computed once per script and own items."""

    def __init__(self, root: Path):
        self.source = Source(root)
        self.registries = {s: load_registry(self.source, s, p, v) for s, (p, v) in REGISTRIES.items()}
        self.flow = ParamsFlow(self.source)
        self._closures: dict[tuple[str, tuple[tuple[str, str], ...], bool], list[str]] = {}

    def code(self, stage: StageItems) -> list[str]:
        """The code files the stage reads (computed once per script and own items)."""
        key = (stage.script, tuple(sorted(stage.items.items())), stage.per_item)
        if key not in self._closures:
            if stage.script not in self.source.files and not (self.source.root / stage.script).is_file():
                raise ConfigError(f"stage {stage.name}: its script {stage.script} is missing")
            self._closures[key] = code_closure(stage, self.source, self.registries)
        return self._closures[key]

    def projections(self, stage: StageItems) -> dict[str, dict[str, Any]]:
        """For a stage generated per item, each registry ``__init__`` it reads -> how its manifest
        hashes it: projected onto the members the stage reaches plus the ``__missing__`` fallback
        (:func:`dmlbench.stage_inputs.registry_projection`), so that another item's registry line
        is not part of the stage's inputs; a stage not per item (``report``) reads the whole file."""
        if not stage.per_item:
            return {}
        code = set(self.code(stage))
        found = {}
        for section, registry in self.registries.items():
            init = self.source.rel(registry.package)
            if init in code:
                reached = {m for m in registry.members if self.source.rel(m) in code} | set(registry.fallback)
                keep = sorted(m.rpartition(".")[2] for m in reached)
                found[init] = {"registry": REGISTRIES[section][1], "keep": keep}
        return found

    def params(self, stage: StageItems, data: Mapping[str, Any]) -> list[str]:
        """The params.yaml keys the stage reads (``params.yaml``: all of them)."""
        return params_read(stage, self.flow.script_reads(stage.script), data)
