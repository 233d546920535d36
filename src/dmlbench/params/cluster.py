"""The ``cluster:`` section of ``params.yaml``: what each stage kind asks Slurm for.

Read only by the Slurm executor, the tune stage's worker array and the ``validate`` stage, each
through :func:`cluster_settings`, so no other stage depends on this code. Values are ``sbatch``
options (https://slurm.schedmd.com/sbatch.html): ``cpus`` -> ``--cpus-per-task``, ``gpus`` ->
``--gres=<gres>:<n>``, ``mem`` -> ``--mem`` (e.g. ``16G``), ``time`` -> ``--time``
(``minutes``, ``H:MM:SS`` or ``D-HH:MM:SS``); ``partition``, ``account`` and ``extra_args``
(further options, each starting with ``--``) apply to every job. ``stages.<kind>`` overrides
``default`` key by key for the stages of one kind (``train`` = every ``train@...``).
``signal_seconds``: Slurm sends ``USR1`` that long before a job's time limit
(``--signal=B:USR1@<s>``); the job wrapper passes it to the stage, which stops after its last
checkpoint, and requeues the job (``--requeue``), which resumes from that checkpoint.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, NonNegativeInt, PositiveInt, ValidationError, field_validator

from dmlbench.errors import ConfigError
from dmlbench.messages import one_line
from dmlbench.params.model import Params
from dmlbench.schema import StrictModel

# the stage kinds of dvc.yaml (tests/test_cluster.py checks the list against it)
STAGE_KINDS = (
    "validate", "download", "prepare", "tune", "baseline", "train", "evaluate",
    "embed_pretrained", "evaluate_pretrained", "report",
)  # fmt: skip
_MEMORY = re.compile(r"^\d+[KMGT]?$")
_TIME = re.compile(r"^(\d+|\d+:\d{2}(:\d{2})?|\d+-\d{1,2}(:\d{2}(:\d{2})?)?)$")


class StageResources(StrictModel):
    """What one job asks for; None = the ``default``'s value."""

    cpus: PositiveInt | None = None
    gpus: NonNegativeInt | None = None
    mem: str | None = None
    time: str | None = None

    @field_validator("mem")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        if value is not None and not _MEMORY.match(value):
            raise ValueError("expected a number with an optional K, M, G or T suffix (sbatch --mem), e.g. 16G")
        return value

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not _TIME.match(value):
            raise ValueError("expected minutes, H:MM:SS or D-HH:MM:SS (sbatch --time)")
        return value


DEFAULT = StageResources(cpus=2, gpus=0, mem="8G", time="4:00:00")


class ClusterConfig(StrictModel):
    partition: str | None = None
    account: str | None = None
    gres: str = "gpu"  # the generic resource name of a GPU on this cluster (--gres=gpu:1)
    signal_seconds: PositiveInt = 120
    requeue: bool = True
    extra_args: list[str] = Field(default_factory=list)
    default: StageResources = DEFAULT
    stages: dict[str, StageResources] = Field(default_factory=dict)

    @field_validator("extra_args")
    @classmethod
    def _options(cls, values: list[str]) -> list[str]:
        for value in values:
            if not value.startswith("--") or any(ch.isspace() for ch in value) or value.split("=")[0] in _MANAGED:
                raise ValueError(
                    f"extra_args {value!r}: each entry is one long sbatch option (--name=value, no spaces), "
                    f"not one dmlbench sets itself ({', '.join(sorted(_MANAGED))})"
                )
        return values

    @field_validator("stages")
    @classmethod
    def _kinds(cls, stages: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(stages) - set(STAGE_KINDS))
        if unknown:
            raise ValueError(f"stages.{unknown[0]}: not a stage kind of dvc.yaml; kinds: {', '.join(STAGE_KINDS)}")
        return stages

    def resources(self, stage: str) -> StageResources:
        """The resources of DVC stage ``stage`` (``train@glyphs-...``): its kind's, over the default."""
        kind = stage.split("@", 1)[0]
        own = self.stages.get(kind)
        merged = {**DEFAULT.model_dump(), **self.default.model_dump(exclude_none=True)}
        if own is not None:
            merged.update(own.model_dump(exclude_none=True))
        return StageResources(**merged)


# options the executor sets from the settings above or needs for itself
_MANAGED = {
    "--dependency", "--job-name", "--output", "--error", "--parsable", "--chdir", "--signal", "--requeue",
    "--no-requeue", "--kill-on-invalid-dep", "--cpus-per-task", "--gres", "--mem", "--time", "--partition",
    "--account", "--open-mode", "--array", "--wrap",
}  # fmt: skip


def cluster_settings(params: Params, source: str = "params.yaml") -> ClusterConfig:
    """The validated ``cluster:`` section; :class:`ConfigError` in one line naming the key."""
    try:
        return ClusterConfig.model_validate(dict(params.cluster))
    except ValidationError as exc:
        raise ConfigError(one_line(exc, source, prefix="cluster", model=ClusterConfig)) from None
