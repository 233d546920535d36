"""A run's lifecycle, written once: how a tracked run starts or resumes, logs, and ends."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dmlbench.data.prepare import MANIFEST
from dmlbench.grid import RunSpec
from dmlbench.io import md5_file
from dmlbench.tracking.runlog import host, now, read_runlog, write_runlog
from dmlbench.tracking.runs import RunWriter, TrackedRun
from dmlbench.tracking.workspace import workspace_id

if TYPE_CHECKING:  # the tune stage uses ending() alone: no spool code among its dependencies
    from dmlbench.tracking.spooled import SpooledRun, StageTracking


Run = TypeVar("Run", bound=RunWriter)


@contextmanager
def ending(run: Run, on_kill: Mapping[str, str] | None = None) -> Iterator[Run]:
    """Run the body for ``run``: KILLED on ``KeyboardInterrupt`` (``on_kill``: tags set first),
    FAILED with the failure tags on any other error; the error is re-raised. A body that returns
    leaves the run open for the caller to finish."""
    try:
        yield run
    except KeyboardInterrupt:
        if on_kill:
            run.set_tags(on_kill)
        run.finish("KILLED")
        raise
    except BaseException as exc:
        run.fail(exc)
        raise


@dataclass(frozen=True)
class DatasetInput:
    """The dataset a training reads, as its MLflow input: name, digest (the manifest's md5),
    where it is, and its profile (images and classes per split, its fold's on a CV split)."""

    name: str
    digest: str
    source: str
    profile: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, directory: Path, info: Mapping[str, Any], fold: int | None) -> DatasetInput:
        """The prepared dataset in ``directory`` (``info``: its info.json; no image is read)."""
        profile: dict[str, Any] = dict(info.get("splits", {}))
        if fold is not None:
            profile.update(info["folds"][fold], fold=fold)
        manifest = directory / MANIFEST
        digest = md5_file(manifest)[:12] if manifest.exists() else "unknown"
        return cls(name, digest, directory.as_posix(), profile)

    def log_to(self, run: TrackedRun | SpooledRun) -> None:
        run.log_dataset(self.name, self.digest, self.source, self.profile, context="train")


@dataclass
class TrainingRecord:
    """One training's MLflow run (through the stage's spool) and its run log."""

    run: SpooledRun
    log_path: Path
    runlog: dict[str, Any]
    tracking: StageTracking

    @classmethod
    def open(
        cls,
        tracking: StageTracking,
        handle: str,
        spec: RunSpec,
        resolved: Mapping[str, Any],
        config_hash: str,
        experiment: str,
        *,
        fold: int | None,
        parent: SpooledRun | None,
        code: str,
        resumed: Sequence[Mapping[str, Any]] | None,
        tags: Mapping[str, str],
        dataset: DatasetInput,
        log_path: Path,
    ) -> TrainingRecord:
        """Start the training's run, or resume it (``resumed``: the checkpoint's history, sent as
        possibly logged so none is logged twice); tag it, record its dataset, write the run log and
        start the system-metrics monitor."""
        run = tracking.training_run(
            handle, spec, resolved, config_hash, experiment, resume=resumed is not None, fold=fold, parent=parent,
            code=code,
        )  # fmt: skip
        for entry in resumed or ():
            run.log_metrics({k: v for k, v in entry.items() if k not in {"epoch", "stopped_early"}}, entry["epoch"],
                            check=True)  # fmt: skip
        run.set_tags(tags)
        dataset.log_to(run)
        earlier = read_runlog(log_path) or {}
        runlog = {
            "grid_key": spec.grid_key if fold is None else f"{spec.grid_key}/fold{fold}",
            "config_hash": config_hash,
            "mlflow_run_id": earlier.get("mlflow_run_id") if resumed is not None else None,
            "experiment": experiment,
            "device": tags.get("device", "unknown"),
            "host": host(),
            "workspace": workspace_id(),  # which runs this workspace trained (tracking.workspace)
            "started": earlier.get("started")
            if resumed is not None and earlier.get("config_hash") == config_hash and earlier.get("started")
            else now(),
            "state": "running",
        }
        write_runlog(log_path, runlog)
        run.start_system_metrics()
        return cls(run, log_path, runlog, tracking)

    def log_epoch(self, epoch: int, metrics: Mapping[str, float]) -> None:
        self.run.log_metrics(metrics, step=epoch)

    @contextmanager
    def training(self) -> Iterator[TrainingRecord]:
        """The training itself: the run ends KILLED or FAILED (its monitor stopped) if it raises."""
        with ending(self.run):
            yield self

    def complete(
        self,
        metrics: Mapping[str, float],
        tags: Mapping[str, str],
        artifacts: Sequence[Path],
        references: Mapping[str, tuple[Path, str]],
        timings: Sequence[Mapping[str, Any]],
        resumed_from_epoch: int,
    ) -> None:
        """End the run FINISHED with ``metrics``, ``tags``, ``artifacts``, ``references`` (name -> (path,
        md5) of DVC-tracked files) and the timings; flush the spool so the run log names the run's id."""
        self.run.log_metrics(metrics)
        self.run.set_tags(tags)
        for name, (path, md5) in references.items():
            self.run.log_file_reference(name, path, md5)
        for path in artifacts:
            self.run.log_artifact(path)
        self.run.finish("FINISHED")
        self.tracking.flush()
        extra = {"resumed_from_epoch": resumed_from_epoch, "ended": now(), "state": "complete"}
        self.runlog["mlflow_run_id"] = self.run.run_id or self.runlog.get("mlflow_run_id")
        write_runlog(self.log_path, {**self.runlog, **extra, "epochs": list(timings)})
