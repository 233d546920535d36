"""Where each stage reads and writes, relative to the repository root (DVC's working dir).

artifacts/raw/<dataset>/                       download: extracted or generated files
artifacts/prepared/<dataset>/                  prepare: image cache + manifest.csv
artifacts/models/<ds>/<bb>/<loss>/<dim>/seed<k>/   train: selected model, history, MLflow run id
artifacts/checkpoints/<...>/seed<k>/           train: resumable per-epoch checkpoint (persist)
artifacts/embeddings/<...>/seed<k>/            embed: test/val embeddings + labels
artifacts/evaluation/<ds>/<bb>/<loss>/<dim>/   evaluate: per-run metrics and per-query values
artifacts/metrics/<ds>/<bb>/<loss>/<dim>.json  evaluate: mean and 95% CI over seeds (dvc metrics)
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
