"""Fake pipeline outputs for the report tests: evaluation, training and embedding files for every
cell of a grid, with a known ranking of the losses."""

from __future__ import annotations

import shutil

import numpy as np

from dmlbench import paths
from dmlbench.io import write_json

METRICS = ["precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8", "r_precision", "map_at_r"]
QUALITY = {"contrastive": 0.5, "triplet": 0.3, "multi_similarity": 0.7, "proxy_anchor": 0.6}


def fake_outputs(params, prepared_glyphs, with_feedback: bool = True) -> None:
    """Evaluation, training and embedding outputs for every cell of ``params`` (a known ranking)."""
    rng = np.random.default_rng(0)
    prepared_root, prepared = prepared_glyphs
    shutil.copytree(prepared_root / "prepared", paths.prepared_dir("glyphs"))
    test = prepared.split("test")
    for combo in params.combos():
        runs = {}
        for seed in params.seeds:
            run = combo.with_seed(seed)
            base = QUALITY[combo.loss] + 0.01 * combo.dim / 32 + rng.normal(0, 0.01)
            metrics = {m: float(np.clip(base * (0.6 if "r_prec" in m or "map" in m else 1), 0, 1)) for m in METRICS}
            runs[f"seed{seed}"] = {"seed": seed, "metrics": metrics}
            history = []
            for epoch in (1, 2, 3):
                entry = {
                    "epoch": epoch,
                    "train/loss": 1.0 / epoch,
                    "train/lr": 0.001,
                    "train/epoch_seconds": 2.0 + combo.dim / 64,
                    "train/images_per_second": 400.0 - combo.dim,
                    "train/elapsed_seconds": epoch * (2.0 + combo.dim / 64),
                    "val/map_at_r": base * epoch / 3,
                }
                if with_feedback:  # the test score peaks at epoch 2, the validation score at epoch 3
                    entry["test_feedback/map_at_r"] = 0.6 * base + (0.03 if epoch == 2 else 0.0)
                history.append(entry)
            write_json(paths.model_dir(run) / "history.json", history)
            info = {
                "selection": {"split": "val", "metric": "map_at_r", "epoch": 3, "value": base},
                "device": "cpu",
                "precision": "fp32",
            }
            write_json(paths.model_dir(run) / "run.json", info)
            centres = rng.normal(size=(test.labels.max() + 1, combo.dim)) * (1 + 4 * QUALITY[combo.loss])
            embeddings = centres[test.labels] + rng.normal(size=(len(test), combo.dim))
            embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
            paths.embedding_dir(run).mkdir(parents=True, exist_ok=True)
            np.savez(
                paths.embedding_dir(run) / "embeddings.npz",
                test_embeddings=embeddings.astype(np.float32),
                test_labels=test.labels,
            )
        write_json(paths.evaluation_dir(combo) / "runs.json", {"combo": combo.key, "runs": runs})
