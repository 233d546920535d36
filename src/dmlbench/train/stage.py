"""The ``train@<dataset>-<backbone>-<loss>-<dim>-<seed>`` stage: train, save, track.

Writes ``artifacts/models/<run>/`` (``model.pt`` = weights of the epoch selected on the
validation split, ``history.json``, ``config.yaml``, ``run.json``) and keeps a resumable
checkpoint in ``artifacts/checkpoints/<run>/`` (a ``persist: true`` DVC output) until the run
is complete. These outputs hold no MLflow run id and no wall-clock timing, so the same training
gives byte-identical files on every clone; the timings, device, host and MLflow run id go to
the run log ``artifacts/runlog/`` (:mod:`dmlbench.tracking.runlog`) and to MLflow. On a cross-validation split (``rc_cv``, ``kfold``) the run is one model per fold,
each trained on the other folds' classes and selected on its own validation classes, each its
own MLflow run (tag ``fold``, nested under the seed's run), stored in ``fold<f>/``
sub-directories; together they are one reproduction of the whole cross-validation (the Reality
Check's unit of repetition). Every seed's run nests under its grid cell's run
(:mod:`dmlbench.tracking.cells`), which the first training of the cell creates. A re-run after
a crash or a kill resumes from the last checkpoint into the same MLflow run (found by its
identity, :func:`dmlbench.tracking.runs.start_training_run`); every epoch is logged exactly
once (epochs checkpointed but not yet logged when the process died are logged on resume, none
twice). A diverged run (:mod:`dmlbench.train.divergence`) stops in one line naming the run, fold,
epoch, batch and what went non-finite; its MLflow run (and, on a cross-validation split, the
seed's run above its fold runs) ends FAILED with tags ``failure``, ``failure_cause=diverged`` and
``diverged`` (:func:`dmlbench.tracking.runs.failure_tags`), and nothing is written to
``artifacts/models/`` (DVC then leaves ``dvc.lock`` as it was).
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
from dmlbench.tracking.cells import cell_config, cell_run_name, cell_tags, ensure_cell_run
from dmlbench.tracking.runlog import host, now, read_runlog, split_timings, write_runlog
from dmlbench.tracking.runs import PARENT_TAG, find_training_run
from dmlbench.tracking.store import client as make_client
from dmlbench.train.checkpoint import LAST, clear_checkpoint, code_fingerprint, load_checkpoint
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


def _cell_prefix(params: Params, run: RunSpec) -> str:
    """The cell run's name leads with dataset / backbone only where the grid has several."""
    parts = [run.dataset] * (len(params.datasets) > 1) + [run.backbone] * (len(params.backbones) > 1)
    return "".join(f"{part} " for part in parts)


def train_stage(params: Params, run: RunSpec, device: torch.device | None = None) -> dict[str, Any]:
    """Train the run (one model, or one model per fold of a cross-validation split), then write
    ``artifacts/models/<run>/`` (``fold<f>/`` sub-directories for fold models) in one step."""
    config = run_config(params, run)
    device = device or default_device()
    data = PreparedDataset.load(paths.prepared_dir(run.dataset))
    folds: list[int | None] = list(range(data.num_folds)) or [None]
    experiment = params.tracking.experiment
    cell_id = ensure_cell_run(
        make_client(),
        experiment,
        run.combo.key,
        cell_tags(run.combo),
        cell_run_name(run.combo.loss_level, run.dim, _cell_prefix(params, run)),
        params=cell_config(config.resolved),
    )
    if folds == [None]:
        infos = [train_member(config, experiment, data, None, device, parent_run_id=cell_id)]
    else:
        infos = _train_folds(config, experiment, data, folds, device, cell_id)
    with atomic_dir(paths.model_dir(run)) as tmp:
        for fold in folds:
            shutil.copytree(_staged(run, fold), tmp if fold is None else tmp / f"fold{fold}", dirs_exist_ok=True)
    for fold in folds:
        shutil.rmtree(_staged(run, fold))
    return infos[0] if len(infos) == 1 else {"run": run.key, "folds": infos}


def _train_folds(
    config: RunConfig,
    experiment: str,
    data: PreparedDataset,
    folds: list[int | None],
    device: torch.device,
    cell_id: str,
) -> list[dict[str, Any]]:
    """The fold models of a cross-validation run, each nested under the seed's own run (which
    the evaluate stage gives the concatenated embedding's test metrics)."""
    run = config.run
    started = any((paths.checkpoint_dir(run, f) / LAST).exists() or _staged(run, f).exists() for f in folds)
    seed_run = start_training_run(
        run, config.resolved, config.config_hash, experiment, resume=started, parent_run_id=cell_id,
        code=code_fingerprint(),
    )  # fmt: skip
    seed_run.set_tags({"folds": str(len(folds))})
    _log_dataset(seed_run, data, None)
    try:
        infos = [train_member(config, experiment, data, f, device, parent_run_id=seed_run.run_id) for f in folds]
    except KeyboardInterrupt:
        seed_run.finish("KILLED")
        raise
    except BaseException as exc:
        seed_run.fail(exc)
        raise
    seed_run.finish("FINISHED")
    return infos


def _log_dataset(tracked: TrackedRun, data: PreparedDataset, fold: int | None) -> None:
    """The prepared dataset as the run's MLflow input: digest = the manifest's md5, profile =
    images and classes per split the run reads (its fold's, on a cross-validation split)."""
    from dmlbench.data.prepare import MANIFEST

    directory = paths.prepared_dir(data.name)
    profile: dict[str, Any] = dict(data.info.get("splits", {}))  # from info.json: no image is read
    if fold is not None:
        profile.update(data.info["folds"][fold], fold=fold)
    manifest = directory / MANIFEST
    digest = md5_file(manifest)[:12] if manifest.exists() else "unknown"
    tracked.log_dataset(data.name, digest, directory.as_posix(), profile, context="train")


def _adopt(info: dict[str, Any], experiment: str, parent_run_id: str | None) -> None:
    """Nest a member trained before its parent existed (kept from an interrupted stage)."""
    if parent_run_id is None:
        return
    found = find_training_run(info["grid_key"], info["config_hash"], experiment)
    if found is not None and found.data.tags.get(PARENT_TAG) != parent_run_id:
        TrackedRun(found.info.run_id).set_tags({PARENT_TAG: parent_run_id})


def train_member(
    config: RunConfig,
    experiment: str,
    data: PreparedDataset,
    fold: int | None,
    device: torch.device,
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """Train one model of the run (``fold``: one fold model) into its staging directory, with
    its own MLflow run in ``experiment`` (nested under ``parent_run_id``); resume it from its
    checkpoint, or skip it if it already finished. Returns its ``run.json`` record plus what
    stays out of the DVC outputs (``mlflow_run_id``, ``resumed_from_epoch``)."""
    run, resolved, chash = config.run, config.resolved, config.config_hash
    name = run.key if fold is None else f"{run.key} fold {fold}"
    checkpoints = paths.checkpoint_dir(run, fold)
    checkpoints.mkdir(parents=True, exist_ok=True)
    staged = _staged(run, fold)
    done = _finished(staged, chash)
    if done is not None:
        print(f"{name}: already trained (kept from an interrupted stage)")
        _adopt(done, experiment, parent_run_id)
        return done
    resume = load_checkpoint(checkpoints, chash)
    if resume:
        print(f"{name}: resuming after epoch {resume.epoch} from {checkpoints}")

    code = code_fingerprint()
    tracked = start_training_run(
        run, resolved, chash, experiment, resume=resume is not None, fold=fold, parent_run_id=parent_run_id, code=code
    )
    if resume:  # the same run (or, if it was deleted meanwhile, a new one) gets every epoch once
        _log_missing_epochs(tracked, resume.history)
    device_name = _device_name(device)
    # the protocol's hflip is applied only on flip-invariant datasets: tag what training does
    hflip = config.protocol.augment.hflip and config.dataset_spec.hflip_invariant
    tracked.set_tags({"device": device_name, "hflip_applied": str(hflip).lower()})
    if "tuning" in resolved:  # the tuned values' origin: the study's MLflow run has the same tag
        tracked.set_tags({"study": resolved["tuning"]["study"], "study_trial": resolved["tuning"]["trial"]})
    _log_dataset(tracked, data, fold)
    log_path = paths.runlog_file(run, fold)
    earlier = read_runlog(log_path) or {}
    record: dict[str, Any] = {
        "grid_key": run.grid_key if fold is None else f"{run.grid_key}/fold{fold}",
        "config_hash": chash,
        "mlflow_run_id": tracked.run_id,
        "experiment": experiment,
        "device": device_name,
        "host": host(),
        "started": earlier.get("started") if resume and earlier.get("mlflow_run_id") == tracked.run_id else now(),
        "state": "running",
    }
    write_runlog(log_path, record)
    write_json(checkpoints / CHECKPOINT_STATUS, {"state": "running"})
    monitor = tracked.start_system_metrics()
    line = EpochLine(name, config.protocol.epochs, config.protocol.selection_metric, resume.history if resume else ())

    def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
        tracked.log_metrics(metrics, step=epoch)
        line(epoch, metrics)

    try:
        outcome = train(
            config, data, checkpoint_dir=checkpoints, resume=resume, on_epoch=on_epoch, device=device, fold=fold
        )
    except KeyboardInterrupt:
        monitor.finish()
        tracked.finish("KILLED")
        raise
    except BaseException as exc:
        monitor.finish()
        tracked.fail(exc)
        raise

    history, timings = split_timings(outcome.history)
    info = {
        "run": run.key,
        "grid_key": record["grid_key"],
        "fold": fold,
        "config_hash": chash,
        "code": code,
        "experiment": experiment,
        "device": device_name,
        "selection": outcome.selection,
        "test_feedback": outcome.test_feedback,
        "epochs_trained": outcome.history[-1]["epoch"],
        "stopped_early": outcome.stopped_early,
        "num_train_classes": outcome.num_classes,
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
        write_json(tmp / HISTORY, history)
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
    write_json(checkpoints / CHECKPOINT_STATUS, {"state": "complete"})
    extra = {"resumed_from_epoch": outcome.resumed_from_epoch, "ended": now(), "state": "complete"}
    write_runlog(log_path, {**record, **extra, "epochs": timings})
    return {**info, "mlflow_run_id": tracked.run_id, "resumed_from_epoch": outcome.resumed_from_epoch}
