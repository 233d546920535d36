"""The ``download@<dataset>`` and ``prepare@<dataset>`` stages (given the dataset's validated
section, :func:`dmlbench.params.datasets.load_dataset_params`)."""

from __future__ import annotations

from typing import Any

from dmlbench import paths
from dmlbench.data import DATASETS
from dmlbench.data.base import DatasetParams
from dmlbench.data.prepare import prepare_dataset


def download_stage(dataset: str, dataset_params: DatasetParams) -> None:
    """Fetch the dataset into ``artifacts/raw/<dataset>``: take its archives from ``data/`` (or
    download them there, verified), then unpack; generated datasets are rendered instead."""
    DATASETS[dataset].fetch(dataset_params, paths.raw_dir(dataset), paths.DROPBOX)


def prepare_stage(dataset: str, dataset_params: DatasetParams, workers: int | None = None) -> dict[str, Any]:
    """Decode, resize and split into ``artifacts/prepared/<dataset>`` with ``workers`` processes (default: all CPUs)."""
    return prepare_dataset(
        DATASETS[dataset], dataset_params, paths.raw_dir(dataset), paths.prepared_dir(dataset), workers=workers
    )
