"""Evaluation: exact retrieval metrics (Reality Check definitions), kNN, clustering, intervals, embedding."""

from dmlbench.evaluate.clustering import clustering_metrics
from dmlbench.evaluate.combine import concatenate_embeddings, concatenated_metrics, separated_metrics
from dmlbench.evaluate.intervals import Interval, bootstrap_interval, t_interval
from dmlbench.evaluate.metrics import per_query_metrics, query_gallery_metrics, retrieval_metrics

__all__ = [
    "Interval",
    "bootstrap_interval",
    "clustering_metrics",
    "concatenate_embeddings",
    "concatenated_metrics",
    "per_query_metrics",
    "query_gallery_metrics",
    "retrieval_metrics",
    "separated_metrics",
    "t_interval",
]
