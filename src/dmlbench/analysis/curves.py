"""Per-epoch curves for ``dvc plots show``: one CSV per experiment in ``reports/curves/``, columns
``epoch, loss, validation, train_loss`` (the selection metric on the validation classes in percent,
the mean training loss; means over seeds and fold models), drawn by ``.dvc/plots/by_loss.json``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

CURVES = "curves"
COLUMNS = ["epoch", "loss", "validation", "train_loss"]


def curve_tables(history: pd.DataFrame, metric: str, names: dict[str, str]) -> dict[str, pd.DataFrame]:
    """``{"<dataset>-<backbone>-<dim>": table}``; a table's ``validation`` is NaN where no epoch was validated."""
    column = f"val/{metric}"
    data = history.assign(
        validation=100 * history[column] if column in history.columns else float("nan"),
        train_loss=history["train/loss"],
        loss=history["loss"].map(names),
    )
    tables = {}
    for (dataset, backbone, dim), block in data.groupby(["dataset", "backbone", "dim"], sort=False):
        means = block.groupby(["epoch", "loss"], sort=False)[["validation", "train_loss"]].mean().reset_index()
        tables[f"{dataset}-{backbone}-{dim}"] = means.sort_values(["loss", "epoch"], kind="stable")[COLUMNS]
    return tables


def write_curves(history: pd.DataFrame, metric: str, names: dict[str, str], folder: Path) -> list[Path]:
    """One ``<experiment>.csv`` per experiment in ``folder`` (which must exist), values to 4 decimals."""
    written = []
    for key, table in curve_tables(history, metric, names).items():
        path = folder / f"{key}.csv"
        table.to_csv(path, index=False, float_format="%.4f")
        written.append(path)
    return written
