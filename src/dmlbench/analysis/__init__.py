"""Analysis: tournament ranking, statistics, figures and the generated report."""

from dmlbench.analysis.tournament import experiment_ranks, tournament

__all__ = ["experiment_ranks", "tournament"]
