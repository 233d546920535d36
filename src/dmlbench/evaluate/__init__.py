"""Evaluation: exact retrieval metrics (Reality Check definitions), kNN, intervals, embedding."""

from dmlbench.evaluate.intervals import Interval, t_interval
from dmlbench.evaluate.metrics import per_query_metrics, retrieval_metrics

__all__ = ["Interval", "per_query_metrics", "retrieval_metrics", "t_interval"]
