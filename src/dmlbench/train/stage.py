"""The ``train@<dataset>-<backbone>-<loss>-<dim>-<seed>`` stage: train, save, track.

Writes ``artifacts/models/<run>/`` (``model.pt`` = weights of the epoch selected on the
validation split, ``history.json``, ``config.yaml``, ``run.json``) and keeps a resumable
checkpoint in ``artifacts/checkpoints/<run>/`` until the run is complete.
"""

from __future__ import annotations

from typing import Any

import torch
import yaml

from dmlbench import paths
from dmlbench.config import Params, RunSpec, config_hash
from dmlbench.data.cache import PreparedDataset
from dmlbench.io import atomic_dir, md5_file, write_json
from dmlbench.tracking import start_training_run
from dmlbench.train.checkpoint import clear_checkpoint, code_fingerprint, load_checkpoint
from dmlbench.train.loop import train

MODEL = "model.pt"
HISTORY = "history.json"
RUN_INFO = "run.json"
CONFIG = "config.yaml"
CHECKPOINT_STATUS = "status.json"


def train_stage(params: Params, run: RunSpec, device: torch.device | None = None) -> dict[str, Any]:
    params.check_run(run)
    resolved = params.resolved(run)
    chash = config_hash(resolved)
    data = PreparedDataset.load(paths.prepared_dir(run.dataset))
    checkpoints = paths.checkpoint_dir(run)
    checkpoints.mkdir(parents=True, exist_ok=True)
    resume = load_checkpoint(checkpoints, chash)
    resume_run_id = resume["extra"].get("mlflow_run_id") if resume else None
    if resume:
        print(f"{run.key}: resuming after epoch {resume['epoch']} from {checkpoints}")

    tracked = start_training_run(run, resolved, chash, params.tracking.experiment, resume_run_id=resume_run_id)
    write_json(checkpoints / CHECKPOINT_STATUS, {"state": "running", "mlflow_run_id": tracked.run_id})
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
        tracked.finish("KILLED")
        raise
    except BaseException:
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
    summary = {"selected_epoch": outcome.selected_epoch}
    if outcome.selection["value"] is not None:
        summary[f"selected/val_{outcome.selection['metric']}"] = outcome.selection["value"]
    tracked.log_metrics(summary)
    tracked.set_tags({"selection": f"{outcome.selection['split'] or 'last epoch'}:{outcome.selection['metric']}"})
    tracked.log_artifact(out / CONFIG)
    tracked.log_artifact(out / HISTORY)
    tracked.finish("FINISHED")
    clear_checkpoint(checkpoints)
    write_json(checkpoints / CHECKPOINT_STATUS, {"state": "complete", "mlflow_run_id": tracked.run_id})
    return info
