"""The ``train@<dataset>-<backbone>-<loss>-<dim>-<seed>`` stage: train, save, track.

Writes ``artifacts/models/<run>/`` (``model.pt`` = weights of the epoch selected on the
validation split, ``history.json``, ``config.yaml``, ``run.json``) and keeps a resumable
checkpoint in ``artifacts/checkpoints/<run>/`` (a ``persist: true`` DVC output) until the run
is complete. A re-run after a crash or a kill resumes from the last checkpoint into the same
MLflow run; every epoch is logged exactly once (epochs checkpointed but not yet logged when the
process died are logged on resume, none twice). A diverged run is marked FAILED in MLflow.
"""

from __future__ import annotations

from typing import Any

import torch
import yaml

from dmlbench import paths
from dmlbench.config import Params, RunSpec, config_hash
from dmlbench.data.cache import PreparedDataset
from dmlbench.io import atomic_dir, md5_file, write_json
from dmlbench.tracking import TrackedRun, start_training_run
from dmlbench.train.checkpoint import clear_checkpoint, code_fingerprint, load_checkpoint
from dmlbench.train.loop import default_device, train

MODEL = "model.pt"
HISTORY = "history.json"
RUN_INFO = "run.json"
CONFIG = "config.yaml"
CHECKPOINT_STATUS = "status.json"
EPOCH_KEY = "train/loss"  # logged at every epoch: tells which epochs MLflow already has


def _log_missing_epochs(tracked: TrackedRun, history: list[dict[str, Any]]) -> int:
    """Log checkpointed epochs that the killed process did not get to log; return how many."""
    logged = tracked.logged_steps(EPOCH_KEY)
    missing = [h for h in history if h["epoch"] not in logged]
    for entry in missing:
        tracked.log_metrics(
            {k: v for k, v in entry.items() if k not in {"epoch", "stopped_early"}}, step=entry["epoch"]
        )
    return len(missing)


def train_stage(params: Params, run: RunSpec, device: torch.device | None = None) -> dict[str, Any]:
    params.check_run(run)
    resolved = params.resolved(run)
    chash = config_hash(resolved)
    device = device or default_device()
    data = PreparedDataset.load(paths.prepared_dir(run.dataset))
    checkpoints = paths.checkpoint_dir(run)
    checkpoints.mkdir(parents=True, exist_ok=True)
    resume = load_checkpoint(checkpoints, chash)
    resume_run_id = resume["extra"].get("mlflow_run_id") if resume else None
    if resume:
        print(f"{run.key}: resuming after epoch {resume['epoch']} from {checkpoints}")

    tracked = start_training_run(run, resolved, chash, params.tracking.experiment, resume_run_id=resume_run_id)
    if resume:  # the same run (or, if it was deleted meanwhile, a new one) gets every epoch once
        _log_missing_epochs(tracked, resume["history"])
    tracked.set_tags({"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"})
    write_json(checkpoints / CHECKPOINT_STATUS, {"state": "running", "mlflow_run_id": tracked.run_id})
    monitor = tracked.start_system_metrics()
    try:
        outcome = train(
            run,
            params,
            data,
            checkpoint_dir=checkpoints,
            resume=resume,
            on_epoch=lambda epoch, metrics: tracked.log_metrics(metrics, step=epoch),
            device=device,
            extra_state={"mlflow_run_id": tracked.run_id},
        )
    except KeyboardInterrupt:
        monitor.finish()
        tracked.finish("KILLED")
        raise
    except BaseException as exc:
        monitor.finish()
        tracked.set_tags({"failure": f"{type(exc).__name__}: {exc}"[:5000]})
        tracked.finish("FAILED")
        raise

    info = {
        "run": run.key,
        "grid_key": run.grid_key,
        "config_hash": chash,
        "code": code_fingerprint(),
        "mlflow_run_id": tracked.run_id,
        "experiment": params.tracking.experiment,
        "selection": outcome.selection,
        "test_feedback": outcome.test_feedback,
        "epochs_trained": outcome.history[-1]["epoch"],
        "stopped_early": outcome.stopped_early,
        "num_train_classes": outcome.num_classes,
        "resumed_from_epoch": outcome.resumed_from_epoch,
    }
    out = paths.model_dir(run)
    with atomic_dir(out) as tmp:
        torch.save(
            {
                "state_dict": outcome.model_state,
                "resolved": resolved,
                "config_hash": chash,
                "selection": outcome.selection,
            },
            tmp / MODEL,
        )
        write_json(tmp / HISTORY, outcome.history)
        write_json(tmp / RUN_INFO, info)
        (tmp / CONFIG).write_text(yaml.safe_dump(resolved, sort_keys=False))

    tracked.log_file_reference("model", out / MODEL, md5_file(out / MODEL))
    summary: dict[str, float] = {"selected_epoch": outcome.selected_epoch}
    if outcome.selection["value"] is not None:
        summary[f"selected/val_{outcome.selection['metric']}"] = outcome.selection["value"]
    feedback = outcome.test_feedback
    if feedback is not None:  # clearly labelled: what test-set model selection would have reported
        summary[f"test_feedback/best_{feedback['metric']}"] = feedback["best_value"]
        summary["test_feedback/best_epoch"] = feedback["best_epoch"]
        if feedback["selected_value"] is not None:
            summary[f"test_feedback/selected_{feedback['metric']}"] = feedback["selected_value"]
    tracked.log_metrics(summary)
    tracked.set_tags(
        {
            "selection": f"{outcome.selection['split'] or 'last epoch'}:{outcome.selection['metric']}",
            "stopped_early": str(outcome.stopped_early).lower(),
        }
    )
    tracked.log_artifact(out / CONFIG)
    tracked.log_artifact(out / HISTORY)
    monitor.finish()
    tracked.finish("FINISHED")
    clear_checkpoint(checkpoints)
    write_json(checkpoints / CHECKPOINT_STATUS, {"state": "complete", "mlflow_run_id": tracked.run_id})
    return info
