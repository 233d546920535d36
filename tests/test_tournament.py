"""The tournament ranking (thesis Table 11 rules) on constructed inputs."""

from __future__ import annotations

import pandas as pd
import pytest

from dmlbench.analysis.tournament import tournament


def test_ranks_sums_and_ties():
    results = pd.DataFrame(
        [
            ("e1", "a", 0.9),
            ("e1", "b", 0.8),
            ("e1", "c", 0.7),
            ("e2", "a", 0.5),
            ("e2", "b", 0.6),
            ("e2", "c", 0.6),  # b and c tie for rank 1
            ("e3", "a", 0.3),
            ("e3", "b", 0.2),
            ("e3", "c", 0.1),
        ],
        columns=["experiment", "loss", "score"],
    )
    table = tournament(results)
    assert list(table.columns[:4]) == ["loss", "total_rank", "mean_rank", "std_rank"]
    rows = table.set_index("loss")
    assert rows.loc["a", "total_rank"] == 1 + 3 + 1
    assert rows.loc["b", "total_rank"] == 2 + 1.5 + 2
    assert rows.loc["c", "total_rank"] == 3 + 1.5 + 3
    assert list(table["loss"]) == ["a", "b", "c"]
    assert rows.loc["a", "mean_rank"] == pytest.approx(5 / 3)
    assert rows.loc["a", "std_rank"] == pytest.approx(pd.Series([1, 3, 1]).std(ddof=0))
    assert rows.loc["b", "std_rank"] == pytest.approx(pd.Series([2, 1.5, 2]).std(ddof=0))


def test_rejects_malformed_results():
    with pytest.raises(ValueError, match="lack columns"):
        tournament(pd.DataFrame({"experiment": ["e"], "loss": ["a"]}))
    duplicated = pd.DataFrame({"experiment": ["e", "e"], "loss": ["a", "a"], "score": [1.0, 2.0]})
    with pytest.raises(ValueError, match="more than one score"):
        tournament(duplicated)
