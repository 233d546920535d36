"""The tune stages' results as the report reads them: per loss the best record, the trial table,
the study summary and (where the run log is here) the seconds of each trial; and the test-class
comparison of the tuned grid with its baseline cells (``tuning.baselines``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import yaml

from dmlbench import paths
from dmlbench.analysis.numbers import rows_of
from dmlbench.evaluate.intervals import bounded_t_interval
from dmlbench.evaluate.metrics import metric_range
from dmlbench.io import read_json
from dmlbench.params.model import Params
from dmlbench.params.tuned import BEST, STUDY, TRIALS
from dmlbench.params.tuning import baseline_combos


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
                        dataset,
                        backbone,
                        loss,
                        best,
                        pd.read_csv(directory / TRIALS),
                        read_json(directory / STUDY),
                        seconds,
                    )
                )
    return found


def load_baseline_runs(params: Params, variant: str) -> pd.DataFrame:
    """Per-seed test metrics of the ``variant`` baseline cells (``baseline@`` stages), as
    ``Results.runs`` holds the grid's: dataset, backbone, loss, dim, seed, metric, value. Empty
    where none is here."""
    rows = []
    for combo in baseline_combos(params):
        if combo.variant != variant:
            continue
        runs_file = paths.evaluation_dir(combo) / "runs.json"
        if not runs_file.exists():
            continue
        cell = {"dataset": combo.dataset, "backbone": combo.backbone, "loss": combo.loss, "dim": combo.dim}
        for info in read_json(runs_file)["runs"].values():
            rows += [{**cell, "seed": info["seed"], "metric": m, "value": v} for m, v in info["metrics"].items()]
    return pd.DataFrame(rows, columns=["dataset", "backbone", "loss", "dim", "seed", "metric", "value"])


def difference_interval(
    a: np.ndarray, b: np.ndarray, confidence: float, span: float, paired: bool = False
) -> tuple[float, float, float, float]:
    """mean(a) - mean(b) with its t-interval and p-value, the interval kept inside ``[-span, span]``
    (two scores in [0, 1]: span 1): ``paired`` (a_i and b_i from the same seed, which gives both the
    same initial weights and batches: ``scipy.stats.ttest_rel``, n - 1 df), else Welch's
    (``ttest_ind``, unequal variances). NaN bounds and p when a sample has one value or no
    difference varies (a zero-width interval no small sample supports)."""
    from scipy import stats

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    estimate = float(a.mean() - b.mean())
    flat = bool(np.ptp(a - b) <= 1e-12) if paired and a.size == b.size else (a.var() == 0 and b.var() == 0)
    if a.size < 2 or b.size < 2 or flat:
        return estimate, math.nan, math.nan, math.nan
    test = stats.ttest_rel(a, b) if paired else stats.ttest_ind(a, b, equal_var=False)
    bounds = test.confidence_interval(confidence)
    return estimate, max(-span, float(bounds.low)), min(span, float(bounds.high)), float(test.pvalue)


def matched(a: pd.DataFrame, b: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, bool]:
    """The ``value`` of two cells' runs (columns seed, value), paired by seed where both have the same
    seeds (then in seed order), else as two independent samples."""
    left, right = a.groupby("seed")["value"].mean(), b.groupby("seed")["value"].mean()
    if set(left.index) == set(right.index):
        order = sorted(left.index)
        return left[order].to_numpy(), right[order].to_numpy(), True
    return left.to_numpy(), right.to_numpy(), False


def tuning_gain(
    tuned: pd.DataFrame, baseline: pd.DataFrame, metric: str, confidence: float, exclude_seeds: tuple[int, ...] = ()
) -> pd.DataFrame:
    """Per dataset x backbone x loss at the baseline's dim: the tuned and baseline seed means of
    ``metric`` (t-intervals clipped to the metric's range), the gain tuned - baseline (paired over
    matched seeds, else Welch; ``paired`` says which), and each loss's rank by mean within its
    dataset x backbone under either (1 = best). ``exclude_seeds``: seeds left out of both (the
    search's own seed, whose tuned run repeats the trial the search picked)."""
    lower, upper = metric_range(metric)
    rows = []
    picked = baseline[(baseline["metric"] == metric) & ~baseline["seed"].isin(exclude_seeds)]
    tuned = tuned[~tuned["seed"].isin(exclude_seeds)]
    for (dataset, backbone, loss, dim), base in picked.groupby(["dataset", "backbone", "loss", "dim"], sort=False):
        mine = rows_of(tuned, dataset=dataset, backbone=backbone, loss=loss, dim=dim, metric=metric)
        if not len(mine):
            continue
        ours_values, theirs_values, paired = matched(mine, base)
        ours, theirs = (
            bounded_t_interval(ours_values, confidence, lower, upper),
            bounded_t_interval(theirs_values, confidence, lower, upper),
        )
        gain, low, high, p = difference_interval(ours_values, theirs_values, confidence, upper - lower, paired)
        rows.append({
            "dataset": dataset, "backbone": backbone, "loss": loss, "dim": dim,
            "tuned": ours.mean, "tuned_low": ours.low, "tuned_high": ours.high, "tuned_n": ours.n,
            "baseline": theirs.mean, "baseline_low": theirs.low, "baseline_high": theirs.high, "baseline_n": theirs.n,
            "gain": gain, "gain_low": low, "gain_high": high, "p_value": p, "paired": paired,
        })  # fmt: skip
    table = pd.DataFrame(rows)
    if len(table):
        by = table.groupby(["dataset", "backbone"])
        table["rank_tuned"] = by["tuned"].rank(method="average", ascending=False)
        table["rank_baseline"] = by["baseline"].rank(method="average", ascending=False)
    return table


def swapped_pairs(gains: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """(dataset, backbone, loss a, loss b) for every pair of losses whose order by mean differs
    between the baseline and the tuned values (a ahead of b under the baseline, behind after tuning)."""
    swaps = []
    for (dataset, backbone), group in gains.groupby(["dataset", "backbone"], sort=False):
        records = group.to_dict("records")
        for a in records:
            for b in records:
                if a["baseline"] > b["baseline"] and a["tuned"] < b["tuned"]:
                    swaps.append((dataset, backbone, a["loss"], b["loss"]))
    return swaps
