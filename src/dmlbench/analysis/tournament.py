"""The "Tournament of Loss Functions" (thesis Table 11): losses ranked within every experiment (1 =
best, ties averaged); total rank = sum over experiments, mean rank = total / experiments, and the
*sample* sd of the ranks (``ddof=1``, which reproduces Table 11: ``ddof=0`` gives SoftTriple 1.14
where the thesis prints 1.19).
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
    if results["score"].isna().any():
        raise ValueError("results have missing scores")
    ranked = results.copy()
    ranked["rank"] = ranked.groupby("experiment")["score"].rank(method="average", ascending=False)
    return ranked


def tournament(results: pd.DataFrame, ddof: int = 1) -> pd.DataFrame:
    """Columns ``loss, total_rank, mean_rank, std_rank, experiments``, sorted by ``total_rank`` (best first).

    ``std_rank`` = sqrt(sum_e (rank_e - mean_rank)^2 / (n - ddof)); NaN when a loss has
    fewer than ``ddof + 1`` experiments. Ties in ``total_rank`` keep alphabetical order.
    """
    ranked = experiment_ranks(results)
    grouped = ranked.groupby("loss")["rank"]
    table = pd.DataFrame(
        {
            "total_rank": grouped.sum(),
            "mean_rank": grouped.mean(),
            "std_rank": grouped.std(ddof=ddof),
            "experiments": grouped.count(),
        }
    ).reset_index()
    return table.sort_values(["total_rank", "loss"], kind="stable").reset_index(drop=True)
