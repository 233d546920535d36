"""Concatenated vs separated evaluation of cross-validation fold models (Reality Check)."""

from __future__ import annotations

import numpy as np
import pytest

from dmlbench.evaluate.combine import concatenate_embeddings, concatenated_metrics, separated_metrics
from dmlbench.evaluate.metrics import retrieval_metrics


def _folds(seed: int = 0, n: int = 400, classes: int = 40, dim: int = 16, folds: int = 4):
    """Four "fold models": each sees the class structure through its own random projection
    and its own noise, like models trained on different class subsets."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    centres = rng.normal(size=(classes, 32))
    embeddings = []
    for _ in range(folds):
        projection = rng.normal(size=(32, dim))
        embeddings.append(((centres[labels] + rng.normal(scale=2.0, size=(n, 32))) @ projection).astype(np.float32))
    return embeddings, labels


def test_concatenation_normalises_each_fold_then_the_whole():
    embeddings, _ = _folds()
    scaled = [e * (10.0**i) for i, e in enumerate(embeddings)]  # fold scales must not matter
    combined = concatenate_embeddings(scaled)
    assert combined.shape == (400, 64) and combined.dtype == np.float32
    assert np.allclose(np.linalg.norm(combined, axis=1), 1.0, atol=1e-6)
    # Cosine similarity of the concatenation = mean of the fold models' cosine similarities.
    unit = [e / np.linalg.norm(e, axis=1, keepdims=True) for e in embeddings]
    mean_cosine = np.mean([u[:5] @ u[5:10].T for u in unit], axis=0)
    assert np.allclose(combined[:5] @ combined[5:10].T, mean_cosine, atol=1e-5)


def test_separated_is_the_mean_of_fold_metrics_and_concatenated_evaluates_once():
    embeddings, labels = _folds()
    separated = separated_metrics(embeddings, labels, recall_ks=(1, 4))
    per_fold = [retrieval_metrics(e, labels, recall_ks=(1, 4)) for e in embeddings]
    assert separated["folds"] == per_fold
    for name, value in separated["mean"].items():
        assert value == pytest.approx(np.mean([fold[name] for fold in per_fold]))
    concatenated = concatenated_metrics(embeddings, labels, recall_ks=(1, 4))
    assert concatenated == retrieval_metrics(concatenate_embeddings(embeddings), labels, recall_ks=(1, 4))
    # The ensemble of four noisy views beats their average, as in the Reality Check's tables.
    assert concatenated["map_at_r"] > separated["mean"]["map_at_r"] + 0.02
    assert concatenated["precision_at_1"] > separated["mean"]["precision_at_1"]


def test_query_gallery_folds():
    embeddings, labels = _folds(1)
    queries, gallery = [e[:100] for e in embeddings], [e[100:] for e in embeddings]
    separated = separated_metrics(queries, labels[:100], gallery, labels[100:], recall_ks=(1, 10))
    assert separated["folds"][2] == retrieval_metrics(queries[2], labels[:100], gallery[2], labels[100:], (1, 10))
    concatenated = concatenated_metrics(queries, labels[:100], gallery, labels[100:], recall_ks=(1, 10))
    expected = retrieval_metrics(
        concatenate_embeddings(queries), labels[:100], concatenate_embeddings(gallery), labels[100:], (1, 10)
    )
    assert concatenated == expected


def test_fold_mismatches_are_rejected():
    embeddings, labels = _folds()
    with pytest.raises(ValueError, match="row counts differ"):
        concatenate_embeddings([embeddings[0], embeddings[1][:-1]])
    with pytest.raises(ValueError, match="one reference embedding per fold"):
        separated_metrics(embeddings, labels, embeddings[:2], labels)
    with pytest.raises(ValueError, match="at least one"):
        concatenate_embeddings([])


def test_fold_spread_reproduces_the_theses_table_12_from_its_table_13():
    """Thesis Table 13 lists the 10 fold models' test R@1 of Multi-Similarity (BN-Inception 512,
    CUB200); Table 12 reports them as 63.61 +/- 0.59: the mean and the *sample* std (ddof = 1;
    ddof = 0 would print 0.56)."""
    from dmlbench.evaluate.combine import fold_spread

    table_13 = [64.25, 63.67, 63.60, 63.76, 64.28, 64.24, 63.35, 63.33, 63.23, 62.34]
    spread = fold_spread([{"recall_at_1": value} for value in table_13])["recall_at_1"]
    assert (round(spread["mean"], 2), round(spread["std"], 2), spread["n"]) == (63.61, 0.59, 10)
    single = fold_spread([{"recall_at_1": 0.5}])["recall_at_1"]
    assert single["n"] == 1 and np.isnan(single["std"])
    with pytest.raises(ValueError, match="at least one fold model"):
        fold_spread([])
