"""Where each stage reads and writes, relative to the repository root (DVC's working dir); the
layout, stage by stage: docs/pipeline.md, "Where outputs live".
"""

from __future__ import annotations

import os
from pathlib import Path

from dmlbench.grid import Combo, RunSpec

ARTIFACTS = Path("artifacts")
REPORTS = Path("reports")
DROPBOX = Path("data")


def project_root() -> Path:
    """The DVC repository root when run by DVC, else the current directory."""
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()).resolve()


def raw_dir(dataset: str) -> Path:
    return ARTIFACTS / "raw" / dataset


def downloaded_record(dataset: str) -> Path:
    """The download stage's DVC output: what it extracted (:mod:`dmlbench.data.raw_record`)."""
    return ARTIFACTS / "downloaded" / f"{dataset}.json"


def prepared_dir(dataset: str) -> Path:
    return ARTIFACTS / "prepared" / dataset


def _member(directory: Path, fold: int | None) -> Path:
    return directory if fold is None else directory / f"fold{fold}"


def tuning_dir(dataset: str, backbone: str, loss: str) -> Path:
    """The tune stage's outputs for one dataset x backbone x loss (every dim trains its result)."""
    return ARTIFACTS / "tuning" / dataset / backbone / loss


def tuning_runlog(dataset: str, backbone: str, loss: str) -> Path:
    return ARTIFACTS / "runlog" / "tuning" / dataset / backbone / f"{loss}.json"


def model_dir(run: RunSpec, fold: int | None = None) -> Path:
    """A run's outputs; ``fold``: the sub-directory of one fold model (cross-validation)."""
    return _member(ARTIFACTS / "models" / run.relpath, fold)


def checkpoint_dir(run: RunSpec, fold: int | None = None) -> Path:
    return _member(ARTIFACTS / "checkpoints" / run.relpath, fold)


def staged_dir(run: RunSpec, fold: int | None = None) -> Path:
    """Where a finished member's outputs wait (inside the checkpoint directory, kept across runs) until
    the run is assembled: a killed cross-validation stage keeps its finished folds."""
    return checkpoint_dir(run, fold) / "final"


def runlog_file(run: RunSpec, fold: int | None = None) -> Path:
    """The run's execution record (``fold``: one fold model's, ``seed<k>/fold<f>.json``)."""
    base = ARTIFACTS / "runlog" / run.relpath
    return base.with_suffix(".json") if fold is None else base / f"fold{fold}.json"


SPOOLS = ARTIFACTS / "runlog" / "spool"


def spool_dir(run: RunSpec) -> Path:
    """Where a training stage's tracking records wait until sent (:mod:`dmlbench.tracking.spool`):
    one folder per stage, its fold models' records included."""
    return SPOOLS / run.relpath


def embedding_dir(run: RunSpec, fold: int | None = None) -> Path:
    return _member(ARTIFACTS / "embeddings" / run.relpath, fold)


def folds_in(directory: Path) -> list[int | None]:
    """The fold models stored under a run directory: ``[0, 1, ...]``, or ``[None]`` without folds."""
    folds = sorted(int(p.name[4:]) for p in Path(directory).glob("fold*") if p.is_dir() and p.name[4:].isdigit())
    return folds or [None]


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
