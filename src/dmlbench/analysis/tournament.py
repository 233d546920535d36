"""The "Tournament of Loss Functions" (thesis Table 11).

Within every experiment (e.g. one backbone x embedding size), losses are ranked by score
(rank 1 = best; ties share the average rank). A loss's total rank is the sum over
experiments, its mean rank the total divided by the number of experiments, and its
standard deviation that of its per-experiment ranks around the mean.
"""

from __future__ import annotations

import pandas as pd


def experiment_ranks(results: pd.DataFrame) -> pd.DataFrame:
    """``results`` (experiment, loss, score) with a ``rank`` column added per experiment."""
    missing = {"experiment", "loss", "score"} - set(results.columns)
    if missing:
        raise ValueError(f"results lack columns {sorted(missing)}")
    if results.duplicated(["experiment", "loss"]).any():
        raise ValueError("results have more than one score for an (experiment, loss) pair")
    ranked = results.copy()
    ranked["rank"] = ranked.groupby("experiment")["score"].rank(method="average", ascending=False)
    return ranked


def tournament(results: pd.DataFrame, ddof: int = 0) -> pd.DataFrame:
    """Columns ``loss, total_rank, mean_rank, std_rank``, sorted by ``total_rank`` (best first).

    ``ddof=0``: population standard deviation of a loss's ranks.
    """
    ranked = experiment_ranks(results)
    grouped = ranked.groupby("loss")["rank"]
    table = pd.DataFrame(
        {
            "total_rank": grouped.sum(),
            "mean_rank": grouped.mean(),
            "std_rank": grouped.std(ddof=ddof).fillna(0.0),
            "experiments": grouped.count(),
        }
    ).reset_index()
    return table.sort_values(["total_rank", "loss"], kind="stable").reset_index(drop=True)
