"""The tune stages' results as the report reads them: per loss the best record, the trial table,
the study summary and (where the run log is here) the seconds of each trial."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import yaml

from dmlbench import paths
from dmlbench.config import Params
from dmlbench.io import read_json
from dmlbench.tune.results import BEST, STUDY, TRIALS


@dataclass(frozen=True)
class StudyResult:
    dataset: str
    backbone: str
    loss: str
    best: dict[str, Any]
    trials: pd.DataFrame
    summary: dict[str, Any]
    seconds: float | None  # device-seconds of all trials; None where the run log is missing

    @property
    def complete(self) -> pd.DataFrame:
        return self.trials[self.trials["state"] == "complete"]


def load_studies(params: Params) -> list[StudyResult]:
    """Every searched dataset x backbone x loss of the grid whose tune outputs exist."""
    found = []
    for dataset in params.datasets:
        for backbone in params.backbones:
            for loss in params.losses:
                directory = paths.tuning_dir(dataset, backbone, loss)
                if not (directory / BEST).exists():
                    continue
                best = yaml.safe_load((directory / BEST).read_text())
                if best.get("hyperparameters") != "tuned" or not best.get("values"):
                    continue
                runlog = paths.tuning_runlog(dataset, backbone, loss)
                seconds = None
                if runlog.exists():
                    log = read_json(runlog)
                    if log.get("study") == best.get("study"):
                        seconds = float(sum(v for v in log.get("seconds", {}).values() if v))
                found.append(
                    StudyResult(
                        dataset, backbone, loss, best, pd.read_csv(directory / TRIALS), read_json(directory / STUDY), seconds
                    )
                )
    return found
