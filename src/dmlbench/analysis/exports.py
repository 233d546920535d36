"""Machine-readable outputs of the report stage (docs/report.md): ``reports/results.csv``, one row
per run and metric (``level = run``) and per cell and metric (``level = cell``), which labs' files
merge with ``python -m dmlbench.results merge``; and ``reports/metrics/<name>.json`` = ``{loss: value}``
for ``dvc metrics show``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dmlbench import __version__
from dmlbench.analysis.identity import CELL, IDENTITY, UNKNOWN
from dmlbench.analysis.numbers import TOP1, Analysis
from dmlbench.evaluate.intervals import interval_method
from dmlbench.evaluate.metrics import metric_range
from dmlbench.io import atomic_path, write_json

RESULTS = "results.csv"
HEADLINE = "metrics"
HEADLINE_METRICS = ("map_at_r", TOP1)
HEADLINE_FILES = (*HEADLINE_METRICS, "mean_rank")  # reports/metrics/<name>.json, listed in dvc.yaml


def code_versions(codes: pd.DataFrame) -> dict[str, int]:
    """Runs per code fingerprint, most frequent first."""
    return {str(k): int(v) for k, v in codes["code"].value_counts().items()}


def interval_kinds(runs: pd.DataFrame) -> pd.DataFrame:
    """dataset, backbone, loss, dim, metric, interval: how each cell's interval over seeds was built
    (:func:`~dmlbench.evaluate.intervals.interval_method` inside the metric's range)."""
    rows = [
        {
            **dict(zip([*CELL, "metric"], key, strict=True)),
            "interval": interval_method(group["value"], *metric_range(key[-1])),
        }
        for key, group in runs.groupby([*CELL, "metric"], sort=False)
    ]
    return pd.DataFrame(rows, columns=[*CELL, "metric", "interval"])


def results_frame(analysis: Analysis, identities: pd.DataFrame, commit: str) -> pd.DataFrame:
    """The rows of ``results.csv`` (metrics as fractions, as the evaluate stage writes them);
    ``identities``: :func:`~.identity.run_identities` (a column it lacks is ``unknown``). A cell row
    joins its runs' distinct values of each identity column with ``+``."""
    identities = identities.reindex(columns=[*CELL, "seed", *IDENTITY], fill_value=UNKNOWN)
    runs = analysis.results.runs.merge(identities, on=[*CELL, "seed"], how="left")
    runs = runs.assign(level="run", low=math.nan, high=math.nan, n=1, interval="none")
    cells = analysis.summary.rename(columns={"mean": "value"}).assign(level="cell", seed=pd.NA)
    cells = cells.merge(interval_kinds(analysis.results.runs), on=[*CELL, "metric"], how="left")
    per_cell = identities.groupby(CELL)[IDENTITY].agg(lambda c: "+".join(sorted(set(map(str, c))))).reset_index()
    cells = cells.merge(per_cell, on=CELL, how="left")
    frame = pd.concat([runs, cells], ignore_index=True)
    frame = frame.assign(dmlbench_version=__version__, git_commit=commit)
    columns = ["level", *CELL, "seed", "metric", "value", "low", "high", "n", "interval", *IDENTITY]
    return frame[columns + ["dmlbench_version", "git_commit"]]


def headline(analysis: Analysis) -> dict[str, dict[str, float]]:
    """``{name: {loss: value}}`` for each name of :data:`HEADLINE_FILES`: the metrics in percent (mean over
    the grid's cells of each cell's seed mean) and the tournament's mean rank."""
    summary = analysis.summary
    table: dict[str, dict[str, float]] = {}
    for metric in HEADLINE_METRICS:
        rows = summary[summary["metric"] == metric]
        means = rows.groupby("loss", sort=False)["mean"].mean()
        table[metric] = {loss: round(100 * float(means[loss]), 2) for loss in analysis.params.losses if loss in means}
    ranks = analysis.ranking.set_index("loss")["mean_rank"]
    table["mean_rank"] = {loss: round(float(ranks[loss]), 2) for loss in analysis.params.losses if loss in ranks}
    return table


def write_exports(analysis: Analysis, identities: pd.DataFrame, commit: str, report_dir: Path) -> None:
    """Write ``results.csv`` and ``metrics/<name>.json`` under ``report_dir``, each file replaced
    atomically; nothing else in ``metrics/`` is touched (DVC's ``.gitignore`` of those files lives there,
    committed to git: replacing the folder whole deleted it)."""
    with atomic_path(report_dir / RESULTS, suffix=".csv") as tmp:
        results_frame(analysis, identities, commit).to_csv(tmp, index=False)
    (report_dir / HEADLINE).mkdir(parents=True, exist_ok=True)
    for name, entry in headline(analysis).items():
        write_json(report_dir / HEADLINE / f"{name}.json", entry)
