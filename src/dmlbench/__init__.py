"""dmlbench: a reproducible benchmark pipeline for deep metric learning.

Sub-packages, one per concern: ``data`` (datasets, splits, caches), ``models`` (backbones,
heads), ``losses`` (registry over pytorch-metric-learning), ``train``, ``evaluate``
(retrieval metrics, intervals), ``analysis`` (tournament, plots, report), ``tracking``
(MLflow), ``tune`` (the search), ``pipeline`` (the runner). ``params`` holds the one schema for
``params.yaml``.
"""

__version__ = "0.1.0"
