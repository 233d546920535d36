"""``make plan`` and the runner's ETA: the grid's stages priced for the way it will run.

Locally ``--jobs`` slots (one per GPU slot, else per core), CPU stages with ``cpu_count // jobs``
threads; on Slurm ``cluster.max_jobs`` at once (else :data:`dmlbench.params.cluster.DEFAULT_MAX_JOBS`)
with each kind's ``cpus`` and ``gpus``. A ``cuda`` grid planned locally without GPUs is refused.
"""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dmlbench.cost.model import Eta, StageEstimate
from dmlbench.cost.price import PlanSettings, Pricer
from dmlbench.cost.rates import DEFAULT_EFFICIENCY, THROUGHPUT_TABLE, read_table
from dmlbench.cost.render import render_plan
from dmlbench.cost.stages import PlannedStage, expand_stages
from dmlbench.errors import ConfigError
from dmlbench.params.cluster import DEFAULT_MAX_JOBS, cluster_settings
from dmlbench.params.model import Params
from dmlbench.params.presets import Preset, params_text


@dataclass(frozen=True)
class RunShape:
    """Parallel slots and per-stage settings of a run, and a line saying so."""

    workers: int
    settings: PlanSettings
    description: str


def run_shape(
    params: Params,
    *,
    executor: str = "local",
    gpus: Sequence[str] = (),
    gpu_slots: int = 1,
    jobs: int | None = None,
    device: str | None = None,
    cpu_count: int | None = None,
    stages: int = 1,
    efficiency: float = DEFAULT_EFFICIENCY,
) -> RunShape:
    """How a grid of ``stages`` stages runs with these options; a one-line :class:`ConfigError` if refused."""
    device = device or params.protocol.device
    cores = cpu_count or os.cpu_count() or 1
    if gpu_slots < 1 or (gpu_slots > 1 and not gpus):
        raise ConfigError(f"GPU_SLOTS {gpu_slots}: needs GPUS and a positive count")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"JOBS {jobs}: must be a positive number of parallel stages")
    if executor == "slurm":
        cluster = cluster_settings(params)
        train = cluster.resources("train")
        gpu = device != "cpu" and (train.gpus or 0) > 0
        if device == "cuda" and not gpu:
            raise ConfigError(
                f"protocol {params.protocol_name!r} trains on cuda but cluster.stages.train asks no GPU (gpus: 0)"
            )
        workers = min(cluster.max_jobs or DEFAULT_MAX_JOBS, stages)
        limit = (
            f"cluster.max_jobs {cluster.max_jobs}"
            if cluster.max_jobs
            else f"{DEFAULT_MAX_JOBS} jobs at once (no cluster.max_jobs; the run takes what sacctmgr allows, else that)"
        )
        shape = f"Slurm: {limit}, train jobs with {train.cpus} CPU(s) and {train.gpus or 0} GPU(s)"
        return RunShape(workers, PlanSettings(gpu, 1, train.cpus or 1, efficiency), shape)
    if device == "cuda" and not gpus:
        raise ConfigError(
            f"protocol {params.protocol_name!r} trains on cuda: give the GPUs to plan for (GPUS=0,1 / --gpus 0,1), "
            "EXECUTOR=slurm, or DEVICE=cpu"
        )
    gpu = bool(gpus) and device != "cpu"
    workers = jobs or len(gpus) * gpu_slots or cores
    if gpus and workers > len(gpus) * gpu_slots:
        raise ConfigError(f"JOBS {workers} exceeds the {len(gpus)} GPU(s) x {gpu_slots} slot(s) given")
    where = f"GPUs {','.join(gpus)} x {gpu_slots} slot(s)" if gpu else f"CPU ({cores} cores)"
    settings = PlanSettings(gpu, gpu_slots if gpu else 1, max(1, cores // workers), efficiency)
    return RunShape(workers, settings, f"local: {workers} stage(s) at a time on {where}")


def grid_estimates(
    root: Path,
    params: Params,
    shape: RunShape,
    params_text: str | None = None,
    table: Path | None = None,
    stages: Sequence[PlannedStage] | None = None,
) -> tuple[list[StageEstimate], list[str]]:
    """Every stage of the grid (DVC's expansion over ``root``'s params, or ``params_text``) priced,
    and the notes on its rates (one per backbone, and the caps)."""
    rows = read_table(table if table is not None else root / THROUGHPUT_TABLE)
    stages = expand_stages(root, params_text) if stages is None else stages
    pricer = Pricer(params, shape.settings, rows)
    estimates = [pricer.estimate(stage) for stage in stages]
    notes = [f"{backbone}: {note}" for backbone, note in sorted(pricer.notes.items())]
    protocol = params.protocol
    patience = protocol.early_stopping.patience
    notes.append(
        f"trainings: {protocol.epochs} epochs each (protocol {params.protocol_name!r}), an upper bound"
        + (f" where early stopping (patience {patience}) ends runs sooner" if patience else "")
        + (
            f"; tune: {dict(params.tuning).get('trials', 50)} trials x folds each"
            if protocol.hyperparameters == "tuned"
            else ""
        )
    )
    return estimates, notes


class RunnerEta:
    """The ETA of a running plan for the local runner's progress bar: called with each stage as it
    ends (``seconds`` None: skipped), and once with ``None`` at the start; returns the bar's postfix."""

    def __init__(self, eta: Eta):
        self.eta = eta

    def __call__(self, stage: str | None, seconds: float | None) -> str:
        if stage is not None:
            self.eta.done(stage, seconds)
        return self.eta.line()


def runner_eta(root: Path, params: Params, order: Sequence[str], shape: RunShape) -> RunnerEta:
    """The ETA of the stages in ``order`` (the runner's plan), from the same estimates as ``make plan``."""
    estimates, _ = grid_estimates(root, params, shape)
    planned = set(order)
    return RunnerEta(Eta({e.name: e for e in estimates if e.name in planned}, shape.workers))


def show_plan(root: Path, params: Params, preset: Preset | None, options: Namespace) -> str:
    """The whole plan (``make plan``) for the runner's command-line ``options`` (``--executor``, ``--gpus``,
    ``--gpu-slots``, ``--jobs``, ``--device``) of ``params``, or of ``preset`` (priced over its own params)."""
    gpus = [g.strip() for g in options.gpus.split(",") if g.strip()]
    text = params_text(preset) if preset is not None else None
    stages = expand_stages(root, text)
    shape = run_shape(
        params, executor=options.executor, gpus=gpus, gpu_slots=options.gpu_slots, jobs=options.jobs,
        device=options.device, stages=len(stages),
    )  # fmt: skip
    title = f"preset {preset.name!r} ({preset.description})" if preset is not None else f"{root / 'params.yaml'}"
    estimates, notes = grid_estimates(root, params, shape, text, stages=stages)
    return render_plan(estimates, shape.workers, f"Plan: {title}; {shape.description}", notes)


def plan_eta(params: Params, order: Sequence[str], options: Namespace, jobs: int) -> RunnerEta | None:
    """The runner's ETA for its ``order`` with its command-line ``options`` and ``jobs`` slots; None
    (and a warning line) when the grid cannot be priced: the run goes on with a plain progress bar."""
    gpus = [g.strip() for g in options.gpus.split(",") if g.strip()]
    try:
        shape = run_shape(params, gpus=gpus, gpu_slots=options.gpu_slots, jobs=jobs, device=options.device)
        return runner_eta(Path("."), params, order, shape)
    except Exception as exc:  # an estimate must never stop a run
        print(f"warning: no ETA ({type(exc).__name__}: {exc})")
        return None
