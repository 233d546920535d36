"""Where each stage reads and writes, relative to the repository root (DVC's working dir).

artifacts/raw/<dataset>/                       download: extracted or generated files
artifacts/prepared/<dataset>/                  prepare: image cache + manifest.csv
artifacts/models/<ds>/<bb>/<loss>/<dim>/seed<k>/   train: selected model, history, MLflow run id
artifacts/checkpoints/<...>/seed<k>/           train: resumable per-epoch checkpoint (persist)
artifacts/embeddings/<...>/seed<k>/            embed: test/val embeddings + labels
artifacts/evaluation/<ds>/<bb>/<loss>/<dim>/   evaluate: per-run metrics and per-query values
artifacts/metrics/<ds>/<bb>/<loss>/<dim>.json  evaluate: mean and 95% CI over seeds (dvc metrics)
artifacts/{embeddings,evaluation}/<ds>/<bb>/pretrained/, artifacts/metrics/<ds>/<bb>/pretrained.json
                                               embed_pretrained/evaluate_pretrained: untrained baseline
reports/                                       report: report.md and its figures
data/                                          archive drop-box tracked by data.dvc (no stage dep)
"""

from __future__ import annotations

import os
from pathlib import Path

from dmlbench.config import Combo, RunSpec

ARTIFACTS = Path("artifacts")
REPORTS = Path("reports")
DROPBOX = Path("data")


def project_root() -> Path:
    """The DVC repository root when run by DVC, else the current directory."""
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()).resolve()


def raw_dir(dataset: str) -> Path:
    return ARTIFACTS / "raw" / dataset


def prepared_dir(dataset: str) -> Path:
    return ARTIFACTS / "prepared" / dataset


def model_dir(run: RunSpec) -> Path:
    return ARTIFACTS / "models" / run.relpath


def checkpoint_dir(run: RunSpec) -> Path:
    return ARTIFACTS / "checkpoints" / run.relpath


def embedding_dir(run: RunSpec) -> Path:
    return ARTIFACTS / "embeddings" / run.relpath


def evaluation_dir(combo: Combo) -> Path:
    return ARTIFACTS / "evaluation" / combo.relpath


def metrics_file(combo: Combo) -> Path:
    return ARTIFACTS / "metrics" / combo.relpath.with_suffix(".json")


PRETRAINED = "pretrained"  # the untrained-trunk baseline's place in the loss level of the layout


def pretrained_key(dataset: str, backbone: str) -> str:
    """DVC matrix suffix of the baseline stages, e.g. ``glyphs-tiny_cnn``."""
    return f"{dataset}-{backbone}"


def pretrained_embedding_dir(dataset: str, backbone: str) -> Path:
    """artifacts/embeddings/<ds>/<bb>/pretrained/: pooled trunk features before any training."""
    return ARTIFACTS / "embeddings" / dataset / backbone / PRETRAINED


def pretrained_evaluation_dir(dataset: str, backbone: str) -> Path:
    return ARTIFACTS / "evaluation" / dataset / backbone / PRETRAINED


def pretrained_metrics_file(dataset: str, backbone: str) -> Path:
    return ARTIFACTS / "metrics" / dataset / backbone / f"{PRETRAINED}.json"
