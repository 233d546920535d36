"""The ``train@<dataset>-<backbone>-<loss>-<dim>-<seed>`` stage: train, save, track.

Writes ``artifacts/models/<run>/`` (``model.pt``, ``history.json``, ``config.yaml``, ``run.json``;
``fold<f>/`` per fold model), byte-identical on every clone (no run id, no timing). A checkpoint in
``artifacts/checkpoints/<run>/`` lets a re-run resume into the same MLflow run. A diverged run stops
in one line and writes nothing. docs/tracking.md and docs/pipeline.md describe runs and spool."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import yaml

from dmlbench import paths
from dmlbench.data.cache import PreparedDataset
from dmlbench.devices import default_device
from dmlbench.grid import RunSpec
from dmlbench.io import atomic_dir, md5_file, read_json, write_json
from dmlbench.params.model import Params
from dmlbench.params.run import RunConfig, run_config
from dmlbench.stage_inputs import inputs_fingerprint, package_fingerprint
from dmlbench.tracking.record import DatasetInput, TrainingRecord, ending
from dmlbench.tracking.runlog import read_runlog, split_timings
from dmlbench.tracking.runs import find_training_run
from dmlbench.tracking.spooled import SpooledRun, StageTracking
from dmlbench.train.checkpoint import LAST, clear_checkpoint, load_checkpoint
from dmlbench.train.loop import TrainOutcome, train
from dmlbench.train.progress import EpochLine

MODEL = "model.pt"
HISTORY = "history.json"
RUN_INFO = "run.json"
CONFIG = "config.yaml"
CHECKPOINT_STATUS = "status.json"


def _finished(staged: Path, chash: str) -> dict[str, Any] | None:
    """The staged member's run.json if it was trained with this config and the code the stage reads, else None."""
    if not (staged / RUN_INFO).exists():
        return None
    info = read_json(staged / RUN_INFO)
    return info if info.get("config_hash") == chash and info.get("inputs") == inputs_fingerprint() else None


def _data_digest(data: PreparedDataset) -> str:
    return DatasetInput.of(data.name, paths.prepared_dir(data.name), data.info, None).digest


def _kept(config: RunConfig, data: PreparedDataset, folds: list[int | None], experiment: str,
          tracking: StageTracking) -> list[dict] | None:  # fmt: skip
    """The run's finished models when ``artifacts/models/<run>/`` holds them for this config, code and
    data (a completed command whose recording was killed): each member ``complete`` in its checkpoint
    status, and FINISHED in the spool or, with the spool empty, in MLflow. Else None (it trains)."""
    run, chash, digest = config.run, config.config_hash, _data_digest(data)
    infos = []
    for fold in folds:
        status_file = paths.checkpoint_dir(run, fold) / CHECKPOINT_STATUS
        status = read_json(status_file) if status_file.exists() else {}
        model = paths.model_dir(run, fold)
        info = _finished(model, chash)
        wanted = {"state": "complete", "config_hash": chash, "code": package_fingerprint(), "data": digest}
        if info is None or any(status.get(k) != v for k, v in wanted.items()) or not (model / MODEL).exists():
            return None
        if status.get("model_md5") != md5_file(model / MODEL):
            return None
        logged = read_runlog(paths.runlog_file(run, fold)) or {}
        infos.append({**info, "mlflow_run_id": logged.get("mlflow_run_id"),
                      "resumed_from_epoch": status.get("resumed_from_epoch")})  # fmt: skip
    if not tracking.flush():
        return infos  # the store does not answer: the runs' ends wait in the spool, sent once it does
    try:
        found = [find_training_run(info["grid_key"], chash, experiment) for info in infos]
        if len(folds) > 1:  # the seed's run above its fold runs
            found.append(find_training_run(run.grid_key, chash, experiment))
    except Exception as exc:  # noqa: BLE001 (the store stopped answering since: its records were sent)
        print(f"{run.key}: the tracking store did not answer ({type(exc).__name__}); its records were sent before")
        return infos
    if any(one is None or one.info.status != "FINISHED" for one in found):
        return None
    return [{**info, "mlflow_run_id": one.info.run_id} for info, one in zip(infos, found, strict=False) if one]


def train_stage(params: Params, run: RunSpec, device: torch.device | None = None) -> dict[str, Any]:
    """Train the run (one model, or one per fold), then write ``artifacts/models/<run>/`` in one step,
    tracking through the stage's spool; models already there return at once (:func:`_kept`)."""
    config = run_config(params, run)
    device = device or default_device()
    data = PreparedDataset.load(paths.prepared_dir(run.dataset))
    folds: list[int | None] = list(range(data.num_folds)) or [None]
    several = (len(params.datasets) > 1, len(params.backbones) > 1)  # named in the cell run's name
    with StageTracking(paths.spool_dir(run)) as tracking:
        kept = _kept(config, data, folds, params.tracking.experiment, tracking)
        if kept is not None:
            print(f"{run.key}: already trained for this config, code and data ({paths.model_dir(run)}); "
                  "not trained again")  # fmt: skip
            return kept[0] if len(kept) == 1 else {"run": run.key, "folds": kept}
        infos = _train_members(config, params.tracking.experiment, data, folds, device, several, tracking)
    staged = {fold: paths.staged_dir(run, fold) for fold in folds}
    with atomic_dir(paths.model_dir(run)) as tmp:
        for fold, member in staged.items():
            shutil.copytree(member, tmp if fold is None else tmp / f"fold{fold}", dirs_exist_ok=True)
    for member in staged.values():
        shutil.rmtree(member)
    return infos[0] if len(infos) == 1 else {"run": run.key, "folds": infos}


def _train_members(
    config: RunConfig,
    experiment: str,
    data: PreparedDataset,
    folds: list[int | None],
    device: torch.device,
    several: tuple[bool, bool],
    tracking: StageTracking,
) -> list[dict[str, Any]]:
    """The run's model(s) in MLflow under the cell's run; fold models nest under the seed's own run
    (evaluate gives it the concatenated embedding's test metrics)."""
    run = config.run
    cell = tracking.cell_run(experiment, run.combo, config.resolved, several)
    if folds == [None]:
        return [train_member(config, experiment, data, None, device, parent=cell, tracking=tracking)]
    started = any((paths.checkpoint_dir(run, f) / LAST).exists() or paths.staged_dir(run, f).exists() for f in folds)
    seed_run = tracking.training_run(
        "seed", run, config.resolved, config.config_hash, experiment, resume=started, parent=cell,
        code=package_fingerprint(),
    )  # fmt: skip
    seed_run.set_tags({"folds": str(len(folds))})
    DatasetInput.of(data.name, paths.prepared_dir(data.name), data.info, None).log_to(seed_run)
    with ending(seed_run):
        infos = [train_member(config, experiment, data, f, device, parent=seed_run, tracking=tracking) for f in folds]
    seed_run.finish("FINISHED")
    return infos


def _run_tags(config: RunConfig, device_name: str) -> dict[str, str]:
    """What a training's run is tagged with beyond its identity: the device, whether the
    protocol's hflip is applied (only on flip-invariant datasets) and the tuned values' study."""
    hflip = config.protocol.augment.hflip and config.dataset_spec.hflip_invariant
    tags = {"device": device_name, "hflip_applied": str(hflip).lower()}
    if "tuning" in config.resolved:  # the tuned values' origin: the study's MLflow run has the same tag
        tags.update(study=config.resolved["tuning"]["study"], study_trial=str(config.resolved["tuning"]["trial"]))
    return tags


def train_member(
    config: RunConfig,
    experiment: str,
    data: PreparedDataset,
    fold: int | None,
    device: torch.device,
    parent: SpooledRun | None = None,
    tracking: StageTracking | None = None,
) -> dict[str, Any]:
    """Train one model (``fold``: a fold model) into its staging directory with its own MLflow run under
    ``parent``, through ``tracking`` (None: a spool of its own, flushed here); resume or skip it.
    Returns its ``run.json`` record plus ``mlflow_run_id`` (None while unsent) and ``resumed_from_epoch``."""
    if tracking is None:
        with StageTracking(paths.spool_dir(config.run)) as own:
            return train_member(config, experiment, data, fold, device, parent, own)
    run, chash = config.run, config.config_hash
    name = run.key if fold is None else f"{run.key} fold {fold}"
    checkpoints, staged = paths.checkpoint_dir(run, fold), paths.staged_dir(run, fold)
    checkpoints.mkdir(parents=True, exist_ok=True)
    done = _finished(staged, chash)
    if done is not None:
        print(f"{name}: already trained (kept from an interrupted stage)")
        if parent is not None:  # trained before its parent existed: nest it
            tracking.adopt(done["grid_key"], done["config_hash"], experiment, parent)
        return done
    resume = load_checkpoint(checkpoints, chash)
    if resume:
        print(f"{name}: resuming after epoch {resume.epoch} from {checkpoints}")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    record = TrainingRecord.open(
        tracking, "run" if fold is None else f"fold{fold}", run, config.resolved, chash, experiment, fold=fold,
        parent=parent, code=package_fingerprint(), resumed=resume.history if resume else None,
        tags=_run_tags(config, device_name),
        dataset=DatasetInput.of(data.name, paths.prepared_dir(data.name), data.info, fold),
        log_path=paths.runlog_file(run, fold),
    )  # fmt: skip
    write_json(checkpoints / CHECKPOINT_STATUS, {"state": "running"})
    line = EpochLine(name, config.protocol.epochs, config.protocol.selection_metric, resume.history if resume else ())

    def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
        record.log_epoch(epoch, metrics)
        line(epoch, metrics)

    with record.training():
        outcome = train(
            config, data, checkpoint_dir=checkpoints, resume=resume, on_epoch=on_epoch, device=device, fold=fold
        )
    info = _save_member(config, outcome, fold, device_name, experiment, staged, record.runlog["grid_key"])
    model_md5 = md5_file(staged / MODEL)
    history, timings = split_timings(outcome.history)
    record.complete(
        _summary_metrics(outcome),
        {
            "selection": f"{outcome.selection['split'] or 'last epoch'}:{outcome.selection['metric']}",
            "stopped_early": str(outcome.stopped_early).lower(),
        },
        artifacts=[staged / CONFIG, staged / HISTORY],
        # the model's final place (the stage copies the staged files there) and its md5
        references={"model": (paths.model_dir(run, fold) / MODEL, model_md5)},
        timings=timings,
        resumed_from_epoch=outcome.resumed_from_epoch,
    )
    clear_checkpoint(checkpoints)
    # what the finished model is, so that a re-run of a completed but unrecorded stage returns at once (_kept)
    complete = {"config_hash": chash, "code": package_fingerprint(), "data": _data_digest(data), "model_md5": model_md5}
    write_json(checkpoints / CHECKPOINT_STATUS, {"state": "complete", **complete,
                                                 "resumed_from_epoch": outcome.resumed_from_epoch})  # fmt: skip
    return {**info, "mlflow_run_id": record.runlog["mlflow_run_id"], "resumed_from_epoch": outcome.resumed_from_epoch}


def _save_member(
    config: RunConfig, outcome: TrainOutcome, fold: int | None, device_name: str, experiment: str, staged: Path,
    grid_key: str,
) -> dict[str, Any]:  # fmt: skip
    """Write the member's model, history, run record and config into ``staged`` (one step);
    return the run record (``run.json``). No MLflow id and no timing: identical on every clone."""
    run, resolved = config.run, config.resolved
    history, _ = split_timings(outcome.history)
    info = {
        "run": run.key,
        "grid_key": grid_key,
        "fold": fold,
        "config_hash": config.config_hash,
        "code": package_fingerprint(),
        "inputs": inputs_fingerprint(),  # the code the stage reads (what a kept member is reused for)
        "experiment": experiment,
        "device": device_name,
        "precision": outcome.precision,
        "compile": outcome.compiled,
        "selection": outcome.selection,
        "test_feedback": outcome.test_feedback,
        "epochs_trained": outcome.history[-1]["epoch"],
        "stopped_early": outcome.stopped_early,
        "num_train_classes": outcome.num_classes,
    }
    with atomic_dir(staged) as tmp:
        model = {
            "state_dict": outcome.model_state,
            "resolved": resolved,
            "config_hash": config.config_hash,
            "selection": outcome.selection,
            "fold": fold,
        }
        torch.save(model, tmp / MODEL)
        write_json(tmp / HISTORY, history)
        write_json(tmp / RUN_INFO, info)
        (tmp / CONFIG).write_text(yaml.safe_dump(resolved, sort_keys=False))
    return info


def _summary_metrics(outcome: TrainOutcome) -> dict[str, float]:
    """The run's summary: the selected epoch and its validation score, and (clearly labelled) what
    test-set model selection would have reported."""
    summary: dict[str, float] = {"selected_epoch": outcome.selected_epoch}
    if outcome.selection["value"] is not None:
        summary[f"selected/val_{outcome.selection['metric']}"] = outcome.selection["value"]
    feedback = outcome.test_feedback
    if feedback is not None:
        summary[f"test_feedback/best_{feedback['metric']}"] = feedback["best_value"]
        summary["test_feedback/best_epoch"] = feedback["best_epoch"]
        if feedback["selected_value"] is not None:
            summary[f"test_feedback/selected_{feedback['metric']}"] = feedback["selected_value"]
    return summary
