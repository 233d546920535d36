"""Cross-validation models evaluated two ways (Reality Check, section "cross validation"):
**separated** (each fold model's metrics, averaged over the folds: the "128-dim" columns) and
**concatenated** (the k L2-normalised fold embeddings of an image concatenated and normalised again,
evaluated once: the "512-dim" columns; its cosine similarity is the mean of the fold models').
Self-retrieval (``reference_*`` omitted) and query/gallery alike. :func:`fold_spread`: the thesis's
form (Psomas 2020, Table 12), mean and sample std (ddof = 1) of the fold models' test scores; from
its Table 13 (MS, 10 folds) it gives Table 12's 63.61 +/- 0.59.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dmlbench.evaluate.metrics import retrieval_metrics
from dmlbench.evaluate.ranking import as_numpy, normalize_rows


def concatenate_embeddings(fold_embeddings: Sequence[Any]) -> np.ndarray:
    """``[n x d_1, ..., n x d_k]`` -> ``n x sum(d_i)``: normalise each, concatenate, normalise."""
    if len(fold_embeddings) == 0:
        raise ValueError("concatenate_embeddings needs at least one fold's embeddings")
    arrays = [normalize_rows(as_numpy(e)) for e in fold_embeddings]
    rows = {len(a) for a in arrays}
    if len(rows) != 1:
        raise ValueError(f"fold embeddings must embed the same images; row counts differ: {sorted(rows)}")
    return normalize_rows(np.concatenate(arrays, axis=1))


def separated_metrics(
    fold_embeddings: Sequence[Any],
    labels: Any,
    reference_fold_embeddings: Sequence[Any] | None = None,
    reference_labels: Any = None,
    recall_ks: Sequence[int] = (1, 2, 4, 8),
    **kwargs: Any,
) -> dict[str, Any]:
    """``{"mean": {metric: mean over folds}, "folds": [metrics of fold 0, ...]}``."""
    if len(fold_embeddings) == 0:
        raise ValueError("separated_metrics needs at least one fold's embeddings")
    if reference_fold_embeddings is not None and len(reference_fold_embeddings) != len(fold_embeddings):
        raise ValueError("give one reference embedding per fold model")
    folds = [
        retrieval_metrics(
            embeddings,
            labels,
            None if reference_fold_embeddings is None else reference_fold_embeddings[i],
            reference_labels,
            recall_ks,
            **kwargs,
        )
        for i, embeddings in enumerate(fold_embeddings)
    ]
    mean = {name: float(np.mean([fold[name] for fold in folds])) for name in folds[0]}
    return {"mean": mean, "folds": folds}


def fold_spread(fold_metrics: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """``{metric: {"mean", "std", "n"}}`` over fold models: mean and sample std (ddof = 1; NaN for
    one model) of each metric, n = the number of fold models (of every seed, when pooled)."""
    if len(fold_metrics) == 0:
        raise ValueError("fold_spread needs the metrics of at least one fold model")
    spread = {}
    for name in fold_metrics[0]:
        values = np.array([fold[name] for fold in fold_metrics], dtype=float)
        std = float(values.std(ddof=1)) if len(values) > 1 else float("nan")
        spread[name] = {"mean": float(values.mean()), "std": std, "n": len(values)}
    return spread


def concatenated_metrics(
    fold_embeddings: Sequence[Any],
    labels: Any,
    reference_fold_embeddings: Sequence[Any] | None = None,
    reference_labels: Any = None,
    recall_ks: Sequence[int] = (1, 2, 4, 8),
    **kwargs: Any,
) -> dict[str, float]:
    """Metrics of the concatenated, re-normalised embedding of all fold models."""
    queries = concatenate_embeddings(fold_embeddings)
    references = None if reference_fold_embeddings is None else concatenate_embeddings(reference_fold_embeddings)
    return retrieval_metrics(queries, labels, references, reference_labels, recall_ks, **kwargs)
