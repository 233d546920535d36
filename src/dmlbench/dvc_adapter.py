"""Every DVC internal dmlbench uses, behind named functions: one place to check when DVC changes.

Each function names the DVC code it stands for (stage objects, lock-file serialisation, YAML
dumper, ``dvc.yaml`` resolver); ``tests/test_dvc_adapter.py`` checks each against DVC's own
behaviour. Importing this module checks the installed DVC's version (package metadata; DVC itself
is imported only when a function is called: it is slow to import) against :data:`TESTED`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

TESTED = ("3.67.0", "3.68.0")  # installed DVC must satisfy TESTED[0] <= version < TESTED[1]


class DvcFailure(Exception):
    """DVC refused an operation (``dvc.exceptions.DvcException``): a missing dependency or output,
    the cache; its message is DVC's."""


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts)


def check_version(installed: str | None = None) -> None:
    """Raise :class:`RuntimeError` (one line) unless ``installed`` (default: the installed DVC) lies
    in :data:`TESTED`."""
    installed = installed or importlib.metadata.version("dvc")
    low, high = TESTED
    if not _release(low) <= _release(installed) < _release(high):
        raise RuntimeError(
            f"dmlbench's DVC adapter was tested with DVC >= {low}, < {high}; DVC {installed} is installed "
            f"(pip install 'dvc>={low},<{high}', or see the pin in requirements.lock)"
        )


check_version()


@contextlib.contextmanager
def dvc_errors() -> Iterator[None]:
    """DVC's exceptions raised inside as :class:`DvcFailure`."""
    from dvc.exceptions import DvcException

    try:
        yield
    except DvcException as exc:
        raise DvcFailure(str(exc)) from None


def open_repo(root: str | Path) -> Any:
    """``dvc.repo.Repo(root)``: the repository (a context manager; ``.lock`` is its lock)."""
    from dvc.repo import Repo

    return Repo(str(root))


def is_pipeline_stage(stage: Any) -> bool:
    """Whether ``stage`` comes from a ``dvc.yaml`` (``dvc.stage.PipelineStage``), not a ``.dvc`` file."""
    from dvc.stage import PipelineStage

    return isinstance(stage, PipelineStage)


def pipeline_stages(repo: Any) -> dict[str, Any]:
    """The ``dvc.yaml`` stages of ``repo``'s index by name as DVC prints it (``train@a-b``); call it
    with the repository's root as working directory."""
    return {s.addressing: s for s in repo.index.stages if is_pipeline_stage(s)}


def stage_graph(repo: Any) -> Any:
    """``repo.index.graph``: the networkx graph of every stage, edges dependent -> dependency."""
    return repo.index.graph


def stale_stages(repo: Any) -> list[str]:
    """The names ``dvc status`` lists (``repo.status()``: stages and ``.dvc`` files)."""
    return list(repo.status())


def cache_dir(root: str | Path) -> Path:
    """The local cache folder of ``root``'s repository (``cache.dir``, else ``.dvc/cache``)."""
    with open_repo(root) as repo:
        return Path(repo.cache.local_cache_dir).resolve()


def remove_outputs(stage: Any) -> None:
    """Remove ``stage``'s non-persistent outputs, as ``Stage.run`` does before the command
    (``stage.remove_outs(ignore_remove=False, force=False)``); persistent ones are unprotected."""
    stage.remove_outs(ignore_remove=False, force=False)


def hash_dependencies(stage: Any) -> dict[str, dict[str, str]]:
    """Hash ``stage``'s dependencies (``stage.save_deps()``, as ``Stage.run`` does first); each
    dependency's hash as plain JSON (``{"md5": ...}``) by its path as written in ``dvc.yaml``; DVC's
    own exception when one is missing."""
    stage.save_deps()
    return dependency_hashes(stage.deps)


def dependency_hashes(deps: Iterable[Any]) -> dict[str, dict[str, str]]:
    """Each dependency's hash as DVC computed it last, as plain JSON."""
    return {str(dep): dep.hash_info.to_dict() for dep in deps}


def hash_dependency(dep: Any) -> dict[str, str] | None:
    """Hash one dependency now (``dep.save()``); None when DVC cannot (it does not exist)."""
    from dvc.exceptions import DvcException

    try:
        dep.save()
    except DvcException:
        return None
    return dict(dep.hash_info.to_dict())


def run_environment(stage: Any, env: dict[str, str] | None) -> tuple[str, dict[str, str]]:
    """The working directory and environment ``dvc repro`` runs ``stage``'s command with
    (``dvc.stage.run.prepare_kwargs``: ``env`` plus DVC_ROOT, DVC_STAGE)."""
    from dvc.stage.run import prepare_kwargs

    kwargs = prepare_kwargs(stage, run_env=env)
    return str(kwargs["cwd"]), dict(kwargs["env"])


def save_stage(stage: Any) -> None:
    """Hash dependencies and outputs (``stage.save(run_cache=False)``, as ``dvc repro
    --no-run-cache``); :class:`DvcFailure` when an output is missing."""
    with dvc_errors():
        stage.save(run_cache=False)


def commit_stage(stage: Any) -> None:
    """Move ``stage``'s outputs into the cache (``stage.commit()``)."""
    with dvc_errors():
        stage.commit()


def lock_entry(stage: Any) -> dict[str, Any]:
    """``stage``'s ``dvc.lock`` entry, ``{name: {...}}`` (``dvc.stage.serialize.to_lockfile``)."""
    from dvc.stage.serialize import to_lockfile

    return dict(to_lockfile(stage))


def lock_file(stage: Any) -> Path:
    """The lock file next to the ``dvc.yaml`` that defines ``stage``."""
    return Path(stage.dvcfile.path).with_suffix(".lock")


def dump_yaml(data: Any) -> str:
    """YAML as DVC writes ``dvc.lock`` (``dvc.utils.serialize.dumps_yaml``)."""
    from dvc.utils.serialize import dumps_yaml

    return str(dumps_yaml(data))


def parse_yaml(text: str, path: str) -> Any:
    """YAML as DVC reads ``dvc.lock`` (``dvc.utils.serialize.parse_yaml``)."""
    from dvc.utils.serialize import parse_yaml as parse

    return parse(text, path)


DefinitionKind = Literal["entry", "foreach", "matrix"]


def stage_definitions(repo: Any, wdir: str | Path, definition: dict[str, Any]) -> list[tuple[str, DefinitionKind, Any]]:
    """``dvc.yaml``'s entries as DVC's resolver reads them over ``wdir/params.yaml``
    (``dvc.parsing.DataResolver(...).definitions``): ``(name, kind, entry)``, where ``entry`` has
    ``resolve()`` (kind ``entry``) or ``normalized_iterable`` and ``resolve_one(key)`` (``foreach``,
    ``matrix``; ``foreach_data`` / ``matrix_data``: the raw values iterated)."""
    from dvc.parsing import DataResolver, EntryDefinition, ForeachDefinition, MatrixDefinition

    kinds: list[tuple[type, DefinitionKind]] = [
        (EntryDefinition, "entry"), (ForeachDefinition, "foreach"), (MatrixDefinition, "matrix"),
    ]  # fmt: skip
    found = []
    for name, entry in DataResolver(repo, str(wdir), definition).definitions.items():
        kind = next((k for cls, k in kinds if isinstance(entry, cls)), None)
        if kind is None:  # pragma: no cover - a kind of dvc.yaml entry DVC 3.67 does not have
            raise RuntimeError(f"dvc.yaml: {name}: unknown kind of stage {type(entry).__name__}")
        found.append((name, kind, entry))
    return found
