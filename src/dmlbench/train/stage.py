"""The ``train@<dataset>-<backbone>-<loss>-<dim>-<seed>`` stage: train, save, track.

Writes ``artifacts/models/<run>/`` (``model.pt`` = weights of the epoch selected on the
validation split, ``history.json``, ``config.yaml``, ``run.json``) and keeps a resumable
checkpoint in ``artifacts/checkpoints/<run>/`` (a ``persist: true`` DVC output) until the run
is complete. On a cross-validation split (``rc_cv``, ``kfold``) the run is one model per fold,
each trained on the other folds' classes and selected on its own validation classes, each its
own MLflow run (tag ``fold``), stored in ``fold<f>/`` sub-directories; together they are one
reproduction of the whole cross-validation (the Reality Check's unit of repetition). A re-run after a crash or a kill resumes from the last checkpoint into the same
MLflow run; every epoch is logged exactly once (epochs checkpointed but not yet logged when the
process died are logged on resume, none twice). A diverged run is marked FAILED in MLflow.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import yaml

from dmlbench import paths
from dmlbench.config import Params
from dmlbench.data.cache import PreparedDataset
from dmlbench.devices import default_device
from dmlbench.grid import RunSpec
from dmlbench.io import atomic_dir, md5_file, read_json, write_json
from dmlbench.run_config import RunConfig, run_config
from dmlbench.tracking import TrackedRun, start_training_run
from dmlbench.train.checkpoint import clear_checkpoint, code_fingerprint, load_checkpoint
from dmlbench.train.loop import train
from dmlbench.train.progress import EpochLine

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


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _staged(run: RunSpec, fold: int | None) -> Path:
    """Where a finished member's outputs wait (in the persistent checkpoint dir) until the run
    is assembled: a killed cross-validation stage keeps its finished folds."""
    return paths.checkpoint_dir(run, fold) / "final"


def _finished(staged: Path, chash: str) -> dict[str, Any] | None:
    """The staged member's run.json if it was trained with this config and code, else None."""
    if not (staged / RUN_INFO).exists():
        return None
    info = read_json(staged / RUN_INFO)
    return info if info.get("config_hash") == chash and info.get("code") == code_fingerprint() else None


def train_stage(params: Params, run: RunSpec, device: torch.device | None = None) -> dict[str, Any]:
    """Train the run (one model, or one model per fold of a cross-validation split), then write
    ``artifacts/models/<run>/`` (``fold<f>/`` sub-directories for fold models) in one step."""
    config = run_config(params, run)
    device = device or default_device()
    data = PreparedDataset.load(paths.prepared_dir(run.dataset))
    folds: list[int | None] = list(range(data.num_folds)) or [None]
    experiment = params.tracking.experiment
    infos = [train_member(config, experiment, data, fold, device) for fold in folds]
    with atomic_dir(paths.model_dir(run)) as tmp:
        for fold in folds:
            shutil.copytree(_staged(run, fold), tmp if fold is None else tmp / f"fold{fold}", dirs_exist_ok=True)
    for fold in folds:
        shutil.rmtree(_staged(run, fold))
    return infos[0] if len(infos) == 1 else {"run": run.key, "folds": infos}


def train_member(
    config: RunConfig, experiment: str, data: PreparedDataset, fold: int | None, device: torch.device
) -> dict[str, Any]:
    """Train one model of the run (``fold``: one fold model) into its staging directory, with
    its own MLflow run in ``experiment``; resume it from its checkpoint, or skip it if it already finished."""
    run, resolved, chash = config.run, config.resolved, config.config_hash
    name = run.key if fold is None else f"{run.key} fold {fold}"
    checkpoints = paths.checkpoint_dir(run, fold)
    checkpoints.mkdir(parents=True, exist_ok=True)
    staged = _staged(run, fold)
    done = _finished(staged, chash)
    if done is not None:
        print(f"{name}: already trained (kept from an interrupted stage)")
        return done
    resume = load_checkpoint(checkpoints, chash)
    resume_run_id = resume.extra.get("mlflow_run_id") if resume else None
    if resume:
        print(f"{name}: resuming after epoch {resume.epoch} from {checkpoints}")

    tracked = start_training_run(run, resolved, chash, experiment, resume_run_id=resume_run_id, fold=fold)
    if resume:  # the same run (or, if it was deleted meanwhile, a new one) gets every epoch once
        _log_missing_epochs(tracked, resume.history)
    tracked.set_tags({"device": _device_name(device)})
    write_json(checkpoints / CHECKPOINT_STATUS, {"state": "running", "mlflow_run_id": tracked.run_id})
    monitor = tracked.start_system_metrics()
    line = EpochLine(name, config.protocol.epochs, config.protocol.selection_metric, resume.history if resume else ())

    def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
        tracked.log_metrics(metrics, step=epoch)
        line(epoch, metrics)

    try:
        outcome = train(
            config,
            data,
            checkpoint_dir=checkpoints,
            resume=resume,
            on_epoch=on_epoch,
            device=device,
            extra_state={"mlflow_run_id": tracked.run_id},
            fold=fold,
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
        "grid_key": run.grid_key if fold is None else f"{run.grid_key}/fold{fold}",
        "fold": fold,
        "config_hash": chash,
        "code": code_fingerprint(),
        "mlflow_run_id": tracked.run_id,
        "experiment": experiment,
        "device": _device_name(device),
        "selection": outcome.selection,
        "test_feedback": outcome.test_feedback,
        "epochs_trained": outcome.history[-1]["epoch"],
        "stopped_early": outcome.stopped_early,
        "num_train_classes": outcome.num_classes,
        "resumed_from_epoch": outcome.resumed_from_epoch,
    }
    with atomic_dir(staged) as tmp:
        torch.save(
            {
                "state_dict": outcome.model_state,
                "resolved": resolved,
                "config_hash": chash,
                "selection": outcome.selection,
                "fold": fold,
            },
            tmp / MODEL,
        )
        write_json(tmp / HISTORY, outcome.history)
        write_json(tmp / RUN_INFO, info)
        (tmp / CONFIG).write_text(yaml.safe_dump(resolved, sort_keys=False))

    # The model's final place (the stage copies the staged files there) and its md5.
    tracked.log_file_reference("model", paths.model_dir(run, fold) / MODEL, md5_file(staged / MODEL))
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
    tracked.log_artifact(staged / CONFIG)
    tracked.log_artifact(staged / HISTORY)
    monitor.finish()
    tracked.finish("FINISHED")
    clear_checkpoint(checkpoints)
    write_json(checkpoints / CHECKPOINT_STATUS, {"state": "complete", "mlflow_run_id": tracked.run_id})
    return info
