"""The ``embed@<run>`` and ``evaluate@<dataset>-<backbone>-<loss>-<dim>`` stages.

embed: the selected model embeds the test and validation images with the evaluation
transform; ``artifacts/embeddings/<run>/embeddings.npz`` holds ``<split>_embeddings``
(float32, unit norm) and ``<split>_labels``, ``meta.json`` the run key and MLflow run id.

evaluate: for every seed, exact retrieval metrics on the test classes (each test image
queries all others); per-run values and per-query arrays go to
``artifacts/evaluation/<combo>/``; the mean and 95% t-interval over seeds go to
``artifacts/metrics/<combo>.json`` (shown by ``dvc metrics show``) and every training run
in MLflow gets its ``test/*`` metrics.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

from dmlbench import paths
from dmlbench.config import Combo, Params, RunSpec, config_hash
from dmlbench.data.cache import PreparedDataset
from dmlbench.errors import ConfigError, DataError
from dmlbench.evaluate.embed import compute_embeddings
from dmlbench.evaluate.intervals import t_interval
from dmlbench.evaluate.metrics import per_query_metrics
from dmlbench.io import atomic_dir, md5_file, read_json, write_json
from dmlbench.models import build_model

EMBEDDINGS = "embeddings.npz"
META = "meta.json"
EMBED_SPLITS = ("test", "val")


def load_trained_model(params: Params, run: RunSpec, device: torch.device) -> tuple[torch.nn.Module, dict]:
    """The selected model of ``run``; refuses weights trained under a different config."""
    model_path = paths.model_dir(run) / "model.pt"
    if not model_path.exists():
        raise DataError(f"{model_path}: missing (run the train@{run.key} stage first)")
    saved = torch.load(model_path, map_location="cpu", weights_only=False)
    if saved["config_hash"] != config_hash(params.resolved(run)):
        raise ConfigError(f"{model_path}: trained with other params than params.yaml now has; re-run train@{run.key}")
    protocol = params.protocol
    model = build_model(
        run.backbone, params.backbones[run.backbone], run.dim, pooling=protocol.pooling, frozen_bn=protocol.frozen_bn
    )
    model.load_state_dict(saved["state_dict"])
    return model.to(device).eval(), saved


def embed_stage(params: Params, run: RunSpec, device: torch.device | None = None) -> dict[str, Any]:
    params.check_run(run)
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, _ = load_trained_model(params, run, device)
    run_info = read_json(paths.model_dir(run) / "run.json")
    data = PreparedDataset.load(paths.prepared_dir(run.dataset))
    augment = params.protocol.augment
    arrays: dict[str, np.ndarray] = {}
    counts = {}
    for name in EMBED_SPLITS:
        split = data.split(name)
        if len(split) == 0:
            continue
        arrays[f"{name}_embeddings"] = compute_embeddings(
            model, split.images, augment.eval_resize, augment.crop_size, params.protocol.eval_batch_size, device
        )
        arrays[f"{name}_labels"] = split.labels
        counts[name] = len(split)
    meta = {
        "run": run.key,
        "mlflow_run_id": run_info["mlflow_run_id"],
        "model_md5": md5_file(paths.model_dir(run) / "model.pt"),
        "splits": counts,
        "dim": run.dim,
    }
    with atomic_dir(paths.embedding_dir(run)) as tmp:
        np.savez(tmp / EMBEDDINGS, **arrays)
        write_json(tmp / META, meta)
    return meta


def evaluate_stage(params: Params, combo: Combo) -> dict[str, Any]:
    params.check_run(combo)
    recall_ks = tuple(params.evaluate.recall_at)
    runs: dict[str, Any] = {}
    per_query: dict[str, np.ndarray] = {}
    for seed in params.seeds:
        run = combo.with_seed(seed)
        directory = paths.embedding_dir(run)
        if not (directory / EMBEDDINGS).exists():
            raise DataError(f"{directory / EMBEDDINGS}: missing (run the embed@{run.key} stage first)")
        meta = read_json(directory / META)
        with np.load(directory / EMBEDDINGS) as arrays:
            values = per_query_metrics(arrays["test_embeddings"], arrays["test_labels"], recall_ks=recall_ks)
        metrics = {name: float(np.mean(v)) for name, v in values.items() if name != "r"}
        runs[f"seed{seed}"] = {
            "seed": seed,
            "metrics": metrics,
            "num_queries": int(len(values["r"])),
            "mlflow_run_id": meta["mlflow_run_id"],
            "embeddings": (directory / EMBEDDINGS).as_posix(),
            "embeddings_md5": md5_file(directory / EMBEDDINGS),
        }
        per_query.update({f"seed{seed}/{name}": v for name, v in values.items()})

    names = list(next(iter(runs.values()))["metrics"])
    confidence = params.evaluate.confidence
    summary = {
        "n_runs": len(runs),
        "confidence": confidence,
        "test": {
            name: {
                key: value
                for key, value in t_interval([r["metrics"][name] for r in runs.values()], confidence).as_dict().items()
                if key in {"mean", "low", "high"}
            }
            for name in names
        },
    }
    with atomic_dir(paths.evaluation_dir(combo)) as tmp:
        write_json(tmp / "runs.json", {"combo": combo.key, "runs": runs})
        np.savez_compressed(tmp / "per_query.npz", **per_query)
    write_json(paths.metrics_file(combo), summary)
    _log_test_metrics(runs)
    return summary


def _log_test_metrics(runs: dict[str, Any]) -> None:
    """Attach ``test/*`` metrics and the embeddings reference to each training run in MLflow."""
    from dmlbench.tracking import TrackedRun

    for info in runs.values():
        tracked = TrackedRun(info["mlflow_run_id"])
        try:
            tracked.client.get_run(info["mlflow_run_id"])
        except Exception:
            print(f"warning: MLflow run {info['mlflow_run_id']} not found; test metrics not logged", file=sys.stderr)
            continue
        tracked.log_metrics({f"test/{name}": value for name, value in info["metrics"].items()})
        tracked.log_file_reference("embeddings", info["embeddings"], info["embeddings_md5"])
