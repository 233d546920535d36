"""What a stage's code reads of ``params.yaml``, from the source (:mod:`dmlbench.pipeline.source`).

From each function the stage's script calls with the validated ``Params`` (a parameter annotated
``Params``), every call that hands it on is followed, and every expression rooted at it is a read
(attribute chains, constant subscripts, ``.get("key")``, local aliases), narrowed to the deepest key
``params.yaml`` has; handing it where this cannot follow reads the whole file. Members of ``Params``,
section loaders, guards and narrowed keys are declared in :mod:`dmlbench.params.declared_reads`. In
a section keyed by registry entries, a stage that iterates it reads its own entry; listing the keys
or testing membership reads nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from dmlbench.errors import ConfigError
from dmlbench.params.declared_reads import GUARDS, LOADERS, MEMBERS, NARROWED, PLACEHOLDERS, SECTIONS
from dmlbench.pipeline.source import Source, StageItems
from dmlbench.stage_inputs import WHOLE_FILE


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
