"""The ``download@<dataset>`` and ``prepare@<dataset>`` stages (given the dataset's validated
section, :func:`dmlbench.params.datasets.load_dataset_params`)."""

from __future__ import annotations

from typing import Any

from dmlbench import paths
from dmlbench.data import DATASETS
from dmlbench.data.base import DatasetParams
from dmlbench.data.prepare import prepare_dataset
from dmlbench.data.raw_record import ensure_extracted, record_download


def download_stage(dataset: str, dataset_params: DatasetParams) -> None:
    """Fetch (or render) the dataset into ``artifacts/raw/<dataset>`` and record what was extracted in
    ``artifacts/downloaded/<dataset>.json`` (the DVC output)."""
    DATASETS[dataset].fetch(dataset_params, paths.raw_dir(dataset), paths.DROPBOX)
    record_download(DATASETS[dataset], paths.raw_dir(dataset), paths.downloaded_record(dataset))


def prepare_stage(dataset: str, dataset_params: DatasetParams, workers: int | None = None) -> dict[str, Any]:
    """Decode, resize and split into ``artifacts/prepared/<dataset>`` (a missing extraction re-created first)."""
    spec = DATASETS[dataset]
    ensure_extracted(spec, dataset_params, paths.raw_dir(dataset), paths.downloaded_record(dataset), paths.DROPBOX)
    return prepare_dataset(spec, dataset_params, paths.raw_dir(dataset), paths.prepared_dir(dataset), workers=workers)
