"""One MLflow run per grid cell (dataset, backbone, loss, dim): the parent of its seeds' runs.

Created by its first training under the store's lock; evaluate adds the seed-mean metrics
(:mod:`dmlbench.tracking.summary`). Identity: ``combo_key`` + ``cell_hash`` (new params supersede).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dmlbench.grid import Combo
from dmlbench.params.model import config_hash, flatten
from dmlbench.tracking.runs import find_runs
from dmlbench.tracking.store import ensure_experiment, store_lock, supersede

KIND = "summary"


def cell_config(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """A run's resolved config without its seed: the same for every seed of the cell."""
    return {key: value for key, value in resolved.items() if key != "seed"}


def cell_run_name(loss: str, dim: int | str, prefix: str = "") -> str:
    """``contrastive d32 (cell)`` after ``prefix`` (``"cub200 resnet50 "``) where the grid has several."""
    return f"{prefix}{loss} d{dim} (cell)"


def cell_tags(combo: Combo) -> dict[str, str]:
    tags = {"dataset": combo.dataset, "backbone": combo.backbone, "loss": combo.loss, "dim": str(combo.dim)}
    return {**tags, "variant": combo.variant} if combo.variant else tags


def ensure_cell_run(
    mlflow_client: Any,
    experiment: str,
    key: str,
    tags: Mapping[str, str],
    name: str,
    params: Mapping[str, Any] | None = None,
) -> str:
    """The active cell run of ``key`` (``combo_key``), created if missing; its id. With ``params``: the
    run whose ``cell_hash`` matches (a new one supersedes others); without: the newest active run."""
    from mlflow.entities import Param

    experiment_id = ensure_experiment(experiment, mlflow_client)
    digest = config_hash(params) if params is not None else None
    with store_lock():  # find-or-create must not race with a parallel train stage of the cell
        existing = find_runs(mlflow_client, experiment_id, {"kind": KIND, "combo_key": key})
        for run in existing:
            if digest is None or run.data.tags.get("cell_hash") == digest:
                return run.info.run_id
        run_tags = {"kind": KIND, "combo_key": key, **tags}
        if digest is not None:
            run_tags["cell_hash"] = digest
        run_id = mlflow_client.create_run(experiment_id, run_name=name, tags=run_tags).info.run_id
        if params is not None:
            mlflow_client.log_batch(run_id, params=[Param(k, str(v)) for k, v in flatten(params).items()])
        supersede(mlflow_client, existing, run_id)
    return run_id
