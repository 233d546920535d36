"""The ``cluster:`` section of ``params.yaml``: what each stage kind asks Slurm for.

Read through :func:`cluster_settings` by the Slurm executor, the tune workers and ``validate``.
Values are ``sbatch`` options (https://slurm.schedmd.com/sbatch.html); ``stages.<kind>`` overrides
``default`` key by key; GPU grids give :data:`GPU_KINDS` ``gpus: 1`` unless set. The rest: docs/cluster.md."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationError, field_validator

from dmlbench.errors import ConfigError
from dmlbench.messages import one_line
from dmlbench.params.device import needs_gpu
from dmlbench.params.model import Params
from dmlbench.schema import StrictModel

# the stage kinds of dvc.yaml (tests/test_cluster.py checks the list against it)
STAGE_KINDS = (
    "validate", "download", "prepare", "tune", "baseline", "train", "evaluate",
    "embed_pretrained", "evaluate_pretrained", "report",
)  # fmt: skip
GPU_KINDS = ("tune", "baseline", "train", "embed_pretrained")  # gpus: 1 when the grid needs a GPU
_MEMORY = re.compile(r"^\d+[KMGT]?$")
_TIME = re.compile(r"^(\d+|\d+:\d{2}(:\d{2})?|\d+-\d{1,2}(:\d{2}(:\d{2})?)?)$")


class StageResources(StrictModel):
    """What one job asks for; None = the ``default``'s value."""

    cpus: PositiveInt | None = None
    gpus: NonNegativeInt | None = None
    mem: str | None = None
    time: str | None = None
    partition: str | None = Field(None, min_length=1, pattern=r"^\S+$")
    account: str | None = Field(None, min_length=1, pattern=r"^\S+$")
    qos: str | None = Field(None, min_length=1, pattern=r"^\S+$")

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


DEFAULT_MAX_JOBS = 50  # queued or running at once when neither cluster.max_jobs nor sacctmgr says


class ClusterConfig(StrictModel):
    partition: str | None = Field(None, min_length=1, pattern=r"^\S+$")
    account: str | None = Field(None, min_length=1, pattern=r"^\S+$")
    qos: str | None = Field(None, min_length=1, pattern=r"^\S+$")
    gres: str = "gpu"  # the generic resource name of a GPU on this cluster (--gres=gpu:1)
    signal_seconds: PositiveInt = 120
    requeue: bool = True
    extra_args: list[str] = Field(default_factory=list)
    max_jobs: PositiveInt | None = None  # None: what sacctmgr allows this user, else DEFAULT_MAX_JOBS
    max_retries: NonNegativeInt = 3  # a job PREEMPTED, NODE_FAILed or BOOT_FAILed: submitted again this often
    # several small stages on one GPU: a 1-GPU job asks for 1 of gpu_slots shares through Slurm's
    # sharding or MPS (https://slurm.schedmd.com/gres.html#Sharding, #MPS_Management)
    gpu_slots: PositiveInt = 1
    shared_gres: Literal["shard", "mps"] = "shard"
    # the site's count of that gres per GPU (None: read from sinfo); a job asks for count // gpu_slots
    shares_per_gpu: PositiveInt | None = None
    poll_seconds: tuple[PositiveFloat, PositiveFloat] = (5.0, 60.0)
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

    @field_validator("poll_seconds")
    @classmethod
    def _poll(cls, value: tuple[float, float]) -> tuple[float, float]:
        if value[0] > value[1]:
            raise ValueError("expected [first, longest] seconds between polls, first <= longest")
        return value

    def resources(self, stage: str) -> StageResources:
        """The resources of DVC stage ``stage`` (``train@glyphs-...``): its kind's, over the default,
        over the top-level partition, account and QOS."""
        kind = stage.split("@", 1)[0]
        own = self.stages.get(kind)
        merged = {
            **DEFAULT.model_dump(), "partition": self.partition, "account": self.account, "qos": self.qos,
            **self.default.model_dump(exclude_none=True),
        }  # fmt: skip
        if own is not None:
            merged.update(own.model_dump(exclude_none=True))
        return StageResources(**merged)


# options the executor sets from the settings above or needs for itself
_MANAGED = {
    "--dependency", "--job-name", "--output", "--error", "--parsable", "--chdir", "--signal", "--requeue",
    "--no-requeue", "--kill-on-invalid-dep", "--cpus-per-task", "--gres", "--mem", "--time", "--partition",
    "--account", "--qos", "--open-mode", "--array", "--wrap",
}  # fmt: skip


def cluster_settings(params: Params, source: str = "params.yaml") -> ClusterConfig:
    """The validated ``cluster:`` section, with the GPU defaults of :func:`with_gpu_defaults`;
    :class:`ConfigError` in one line naming the key."""
    try:
        config = ClusterConfig.model_validate(dict(params.cluster))
    except ValidationError as exc:
        raise ConfigError(one_line(exc, source, prefix="cluster", model=ClusterConfig)) from None
    return with_gpu_defaults(config) if needs_gpu(params) else config


def with_gpu_defaults(config: ClusterConfig) -> ClusterConfig:
    """``gpus: 1`` for every kind of :data:`GPU_KINDS` whose ``gpus`` neither ``default`` nor its
    own entry sets (a grid that needs a GPU; ``gpus: 0`` written there keeps a kind on CPUs)."""
    if "default" in config.model_fields_set and config.default.gpus is not None:
        return config
    stages = dict(config.stages)
    for kind in GPU_KINDS:
        own = stages.get(kind, StageResources())
        if own.gpus is None:
            stages[kind] = own.model_copy(update={"gpus": 1})
    return config.model_copy(update={"stages": stages})
