"""Retrieval gallery (Proxy-Anchor Fig. 3 style): per loss, one trained run's test embeddings retrieve
the ``k`` nearest images of each chosen query (cosine, exact faiss, the query excluded); neighbours
of the query's class framed green, others red. Images come from the prepared cache, its padding
cropped where the cache records each image's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dmlbench.errors import DataError
from dmlbench.evaluate.knn import knn

RIGHT, WRONG, QUERY = "#27ae60", "#e74c3c", "#2c3e50"


@dataclass(frozen=True)
class GalleryRun:
    """One loss's run to show: its label and its ``embeddings.npz``."""

    label: str
    embeddings: Path


def query_splits(arrays: dict[str, np.ndarray]) -> tuple[str, str]:
    """(query split, reference split): ``query``/``gallery`` when embedded, else ``test``/``test``."""
    if "query_embeddings" in arrays and "gallery_embeddings" in arrays:
        return "query", "gallery"
    if "test_embeddings" in arrays:
        return "test", "test"
    raise DataError(f"embeddings hold no test or query/gallery split (keys: {', '.join(sorted(arrays))})")


def choose_queries(labels: np.ndarray, count: int, seed: int) -> np.ndarray:
    """``count`` query rows of distinct classes (as many as there are classes), reproducibly."""
    rng = np.random.default_rng(seed)
    classes = rng.permutation(np.unique(labels))[:count]
    return np.array([rng.choice(np.flatnonzero(labels == c)) for c in classes], dtype=np.int64)


def neighbours(arrays: dict[str, np.ndarray], queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices into the reference split ``len(queries) x k``, whether each has the query's class)."""
    query_split, reference_split = query_splits(arrays)
    query = arrays[f"{query_split}_embeddings"]
    reference = arrays[f"{reference_split}_embeddings"]
    same = query_split == reference_split
    found = knn(query, reference, k, exclude_self=same)[queries]
    correct = arrays[f"{reference_split}_labels"][found] == arrays[f"{query_split}_labels"][queries][:, None]
    return found, correct


def _crop(image: np.ndarray, size: np.ndarray | None) -> np.ndarray:
    return image if size is None else image[: int(size[0]), : int(size[1])]


def retrieval_gallery(
    runs: Sequence[GalleryRun], prepared, path: Path, queries: int = 4, k: int = 4, seed: int = 0
) -> Path:
    """Draw ``queries`` rows: the query image, then ``k`` neighbours for each run side by side.

    ``prepared``: a :class:`~dmlbench.data.cache.PreparedDataset` whose splits match the
    embeddings' rows. The same queries are used for every run.
    """
    import matplotlib.pyplot as plt

    from dmlbench.analysis.plots.style import save_figure

    loaded = []
    for run in runs:
        with np.load(run.embeddings) as npz:
            loaded.append({key: npz[key] for key in npz.files})
    query_split, reference_split = query_splits(loaded[0])
    query_data, reference_data = prepared.split(query_split), prepared.split(reference_split)
    for run, arrays in zip(runs, loaded, strict=True):
        for name, data in ((query_split, query_data), (reference_split, reference_data)):
            if not np.array_equal(arrays[f"{name}_labels"], data.labels):
                raise DataError(f"{run.embeddings}: rows do not match the prepared {name!r} split (re-run embed)")
    chosen = choose_queries(query_data.labels, queries, seed)
    results = [neighbours(arrays, chosen, k) for arrays in loaded]
    query_sizes = getattr(query_data, "sizes", None)
    reference_sizes = getattr(reference_data, "sizes", None)

    gap = 0.35
    widths = [1.0] + [w for _ in runs for w in ([gap] + [1.0] * k)]
    fig = plt.figure(figsize=(0.95 * (1 + len(runs) * (k + gap)), 1.15 * len(chosen) + 0.5))
    grid = fig.add_gridspec(len(chosen), len(widths), width_ratios=widths, wspace=0.06, hspace=0.08)
    for row, q in enumerate(chosen):
        _tile(
            fig.add_subplot(grid[row, 0]),
            _crop(query_data.images[q], None if query_sizes is None else query_sizes[q]),
            QUERY,
            "query" if row == 0 else None,
        )
        for block, (found, correct) in enumerate(results):
            for j in range(k):
                index = int(found[row, j])
                image = _crop(reference_data.images[index], None if reference_sizes is None else reference_sizes[index])
                title = runs[block].label if row == 0 and j == 0 else None
                _tile(
                    fig.add_subplot(grid[row, 1 + block * (k + 1) + 1 + j]),
                    image,
                    RIGHT if correct[row, j] else WRONG,
                    title,
                )
    fig.suptitle(
        f"Test queries (left) and their {k} nearest test images per loss; red frame = other class", y=1.0, fontsize=10
    )
    return save_figure(fig, path)


def _tile(ax, image: np.ndarray, colour: str, title: str | None) -> None:
    ax.imshow(image, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_edgecolor(colour)
        spine.set_linewidth(3 if colour != RIGHT else 2)
    if title:
        ax.set_title(title, fontsize=8, loc="left")
