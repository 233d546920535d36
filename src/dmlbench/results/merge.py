"""Merge results indexes (``reports/results.csv``, :mod:`dmlbench.analysis.exports`) of several labs.

Rows keep a ``source`` column (the file they came from); indexes merge when they follow one protocol
and each experiment's runs are pairable (:func:`~dmlbench.analysis.pairing.check_pairable`); a run
in several indexes counts once, its trainer's copy (``provenance`` ``trained here``); any mismatch is
refused in one line naming the files, the rows and the field. Rules: docs/report.md ("Several labs").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dmlbench.analysis.identity import PAIRING
from dmlbench.analysis.pairing import check_pairable, run_name
from dmlbench.errors import DmlbenchError
from dmlbench.tracking.workspace import TRAINED_HERE

RUN_KEY = ["dataset", "backbone", "loss", "dim", "seed", "metric"]
CELL_KEY = ["dataset", "backbone", "loss", "dim", "metric"]
REQUIRED = ("level", *RUN_KEY, "value", "low", "high", "n", "protocol", *PAIRING, "provenance")


class MergeRefused(DmlbenchError):
    """Results indexes that cannot be compared (protocols, data or values differ)."""


def read_index(path: Path) -> pd.DataFrame:
    """One results index with a ``source`` column (the file's path where the rows have none);
    one-line :class:`MergeRefused` for a missing file or column."""
    path = Path(path)
    if not path.is_file():
        raise MergeRefused(f"{path}: no such results index (reports/results.csv of a lab)")
    frame = pd.read_csv(path, dtype={"split": str, "protocol_digest": str, "dataset_checksum": str})
    missing = [column for column in REQUIRED if column not in frame.columns]
    if missing:
        raise MergeRefused(
            f"{path}: lacks column(s) {', '.join(missing)}: written by a report stage before results indexes "
            "recorded protocol, dataset checksum, split and provenance; re-run its report stage"
        )
    frame["seed"] = frame["seed"].astype("Int64")  # empty on cell rows
    if "source" not in frame.columns:
        frame["source"] = str(path)
    frame["source"] = frame["source"].fillna(str(path))
    return frame


def merge_indexes(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The rows of ``frames`` (each from :func:`read_index`) as one index (module docstring)."""
    merged = pd.concat(frames, ignore_index=True)
    protocols = merged.groupby("protocol", sort=False)["source"].first()
    if len(protocols) > 1:
        named = ", ".join(f"{name} ({source})" for name, source in protocols.items())
        raise MergeRefused(f"cannot merge results of different protocols: {named}; every lab must train one protocol")
    runs = _deduplicated(merged[merged["level"] == "run"], RUN_KEY)
    cells = _deduplicated(merged[merged["level"] == "cell"], CELL_KEY, compare=False)
    identities = runs.drop_duplicates(["dataset", "backbone", "loss", "dim", "seed"])
    try:
        check_pairable(identities)
    except DmlbenchError as exc:
        raise MergeRefused(f"cannot merge: {exc}") from None
    return pd.concat([runs, cells], ignore_index=True)


def _deduplicated(rows: pd.DataFrame, key: list[str], compare: bool = True) -> pd.DataFrame:
    """``rows`` with one row per ``key``: the copy trained here in its own index first; with
    ``compare``, copies whose value differs are refused."""
    first_trained = rows.assign(_order=(rows["provenance"] != TRAINED_HERE).astype(int)).sort_values(
        "_order", kind="stable"
    )
    if compare:
        values = first_trained.groupby(key, sort=False)["value"]
        spread = values.max() - values.min()
        if (spread > 1e-9).any():
            where = spread[spread > 1e-9].index[0]
            clash = first_trained.set_index(key).loc[where]
            sources = " and ".join(dict.fromkeys(clash["source"]))
            row = pd.Series(dict(zip(key, where, strict=True)))
            raise MergeRefused(
                f"cannot merge: {run_name(row)} {row['metric']} differs between {sources} "
                f"({', '.join(f'{v:g}' for v in clash['value'])}); one run must have one result"
            )
    return first_trained.drop_duplicates(key).drop(columns="_order")
