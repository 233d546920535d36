"""The tune stage's result files, and what ``train@`` reads from them.

``best.yaml``: the search's best values and their origin, no timing or run id (its hash changes
only with a new best, which re-trains exactly that loss's cells).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dmlbench import paths
from dmlbench.errors import ConfigError
from dmlbench.io import atomic_path

BEST = "best.yaml"
TRIALS = "trials.csv"
STUDY = "study.json"
STUDY_DIR = "study"


def best_file(dataset: str, backbone: str, loss: str) -> Path:
    return paths.tuning_dir(dataset, backbone, loss) / BEST


def write_best(path: Path, record: dict[str, Any]) -> None:
    header = "# tune stage result: the values train@ uses when the protocol's hyperparameters are tuned\n"
    with atomic_path(path) as tmp:
        tmp.write_text(header + yaml.safe_dump(record, sort_keys=False))


def read_best(dataset: str, backbone: str, loss: str) -> dict[str, Any]:
    """The tune stage's record for a cell; ConfigError if the stage has not run."""
    path = best_file(dataset, backbone, loss)
    if not path.exists():
        raise ConfigError(
            f"{path}: no tuning result; the protocol's hyperparameters are 'tuned', so run "
            f"`dvc repro tune@{dataset}-{backbone}-{loss}` first (make repro does)"
        )
    return yaml.safe_load(path.read_text())


def tuned_values(dataset: str, backbone: str, loss: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(values, provenance)``: the best values of the cell's search and the record that
    names the study, trial and objective (what a training run logs as its origin)."""
    record = read_best(dataset, backbone, loss)
    if record.get("hyperparameters") != "tuned":
        raise ConfigError(
            f"{best_file(dataset, backbone, loss)}: written for published hyperparameters; re-run "
            f"`dvc repro tune@{dataset}-{backbone}-{loss}` (the protocol now says tuned)"
        )
    provenance: dict[str, Any] = {k: record[k] for k in ("study", "trial", "objective", "value") if k in record}
    return dict(record.get("values") or {}), provenance
