"""A training stage's runs, written through its spool (:mod:`dmlbench.tracking.spool`).

:class:`StageTracking` opens a stage's cell, training, seed and fold runs as :class:`SpooledRun` objects:
:class:`~dmlbench.tracking.runs.TrackedRun`'s calls, returning at once (``run_id`` once sent). The
system-metrics monitor starts when a run opens, and again after an outage stopped it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench.grid import Combo, RunSpec
from dmlbench.tracking.cells import cell_config, cell_run_name, cell_tags
from dmlbench.tracking.runs import RunWriter, start_system_metrics, training_run_request
from dmlbench.tracking.spool import Spool, flush_seconds

INTERRUPTED_FLUSH_SECONDS = 30.0  # the flush of a training stopped by an interrupt
MONITOR_STOP_SECONDS = 10.0  # how long a training waits for MLflow's monitor to stop (it may be in a request)


def _json(value: Any) -> Any:
    """``value`` as it will be read back from the spool: refused at once when JSON changes it."""
    copy = json.loads(json.dumps(value))
    if copy != value:
        raise TypeError(f"not JSON-safe for the tracking spool: {value!r}"[:300])
    return copy


class SpooledRun(RunWriter):
    """One run of a stage's spool, named by ``handle``; every call appends a record."""

    def __init__(self, spool: Spool, handle: str):
        self.spool, self.handle = spool, handle
        self.monitor: Any = None
        self.monitoring = False  # the training wants system metrics (between open and its end)
        self.guard = threading.Lock()

    @property
    def run_id(self) -> str | None:
        """The MLflow run id, once the opening record was sent (None before)."""
        return self.spool.runs.get(self.handle)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None, check: bool = False) -> None:
        """Metrics at ``step`` (0 when None); ``check``: they may be on the server already (a resumed
        training's epochs), so those it holds are left out."""
        values = {key: float(value) for key, value in metrics.items()}
        if values:
            stamp = int(time.time() * 1000)
            self.spool.append("metrics", run=self.handle, metrics=values, step=step or 0, timestamp=stamp, check=check)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.spool.append("tags", run=self.handle, tags={key: str(value) for key, value in tags.items()})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """A copy of the file goes into the spool now (the file may be gone before it is sent)."""
        self.spool.append("artifact", run=self.handle, file=self.spool.keep_file(Path(path)),
                          artifact_path=artifact_path)  # fmt: skip

    def log_dataset(self, name: str, digest: str, source: str, profile: Mapping[str, Any], context: str) -> None:
        self.spool.append("dataset", run=self.handle, name=name, digest=digest, source=source,
                          profile=_json(dict(profile)), context=context)  # fmt: skip

    def finish(self, status: str = "FINISHED") -> None:
        self.stop_system_metrics()
        self.spool.append("terminate", run=self.handle, status=status, end=int(time.time() * 1000))

    def start_system_metrics(self) -> None:
        """MLflow's system metrics for this run while it trains: started once its run is open (by
        the sender), restarted when the store answers again after an outage stopped it."""
        self.monitoring = True
        self.spool.on_open[self.handle] = lambda run_id: self._start_monitor(run_id)
        self.spool.on_answer.append(self._restart_monitor)

    def _start_monitor(self, run_id: str) -> None:
        with self.guard:
            if not self.monitoring:
                return
            try:
                self.monitor = start_system_metrics(run_id)
            except Exception as exc:  # system metrics are a nicety: never a reason to stop
                print(f"tracking: system metrics not recorded ({type(exc).__name__}: {exc})", flush=True)

    def _restart_monitor(self) -> None:
        thread = getattr(self.monitor, "_process", None)
        if self.monitoring and self.run_id is not None and (thread is None or not thread.is_alive()):
            self._start_monitor(self.run_id)

    def stop_system_metrics(self) -> None:
        """Stop the monitor, waiting at most :data:`MONITOR_STOP_SECONDS` (it may be in a request)."""
        with self.guard:
            self.monitoring = False
            monitor, self.monitor = self.monitor, None
        self.spool.on_open.pop(self.handle, None)
        if self.spool.on_answer and self._restart_monitor in self.spool.on_answer:
            self.spool.on_answer.remove(self._restart_monitor)
        if monitor is not None:
            stopper = threading.Thread(target=monitor.finish, daemon=True)
            stopper.start()
            stopper.join(MONITOR_STOP_SECONDS)


class StageTracking:
    """The spool of one training stage (:func:`dmlbench.paths.spool_dir`), a context manager."""

    def __init__(self, directory: Path, wait_seconds: float | None = None):
        self.spool = Spool(directory)
        self.flush_seconds = flush_seconds() if wait_seconds is None else wait_seconds

    def __enter__(self) -> StageTracking:
        self.spool.open()
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        # stopped by an interrupt (Slurm's warning signal leaves signal_seconds, 120 by default, for
        # the checkpoint, this wait and the requeue): a shorter wait
        interrupted = kind is not None and issubclass(kind, KeyboardInterrupt)
        self.spool.close(min(self.flush_seconds, INTERRUPTED_FLUSH_SECONDS) if interrupted else self.flush_seconds)

    def flush(self) -> bool:
        return self.spool.flush(self.flush_seconds)

    def cell_run(self, experiment: str, combo: Combo, resolved: Mapping[str, Any],
                 several: tuple[bool, bool] = (False, False)) -> SpooledRun:  # fmt: skip
        """The grid cell's run, named ``[dataset] [backbone] <loss> d<dim> (cell)`` (dataset, backbone
        where ``several`` says the grid has more than one), with the cell's part of ``resolved``."""
        shown = zip((combo.dataset, combo.backbone), several, strict=True)
        prefix = "".join(f"{part} " for part, show in shown if show)
        self.spool.append(
            "open_cell", run="cell", experiment=experiment, key=combo.key, tags=cell_tags(combo),
            name=cell_run_name(combo.loss_level, combo.dim, prefix), params=_json(cell_config(resolved)),
        )  # fmt: skip
        return SpooledRun(self.spool, "cell")

    def training_run(
        self,
        handle: str,
        run: RunSpec,
        resolved: Mapping[str, Any],
        config_hash: str,
        experiment: str,
        *,
        resume: bool,
        fold: int | None = None,
        parent: SpooledRun | None = None,
        code: str | None = None,
    ) -> SpooledRun:
        """A training's run (``fold``: a fold model's), nested under ``parent``; resumed or created
        as :func:`dmlbench.tracking.runs.open_training_run` says, once the record is sent."""
        request = training_run_request(run, resolved, config_hash, experiment, resume, fold, code)
        self.spool.append("open_run", run=handle, request=_json(request), key=uuid.uuid4().hex,
                          parent=parent.handle if parent is not None else None)  # fmt: skip
        return SpooledRun(self.spool, handle)

    def adopt(self, grid_key: str, config_hash: str, experiment: str, parent: SpooledRun) -> None:
        """Nest the training run of this identity (trained before its parent existed) under ``parent``."""
        self.spool.append("adopt", grid_key=grid_key, config_hash=config_hash, experiment=experiment,
                          parent=parent.handle)  # fmt: skip
