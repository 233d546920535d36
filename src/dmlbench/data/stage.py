"""The ``download@<dataset>`` and ``prepare@<dataset>`` stages."""

from __future__ import annotations

from typing import Any

from dmlbench import paths
from dmlbench.config import Params
from dmlbench.data import DATASETS
from dmlbench.data.prepare import prepare_dataset


def _spec_and_params(params: Params, dataset: str):
    params.check_listed(dataset)
    return DATASETS[dataset], params.datasets[dataset]


def download_stage(params: Params, dataset: str) -> None:
    """Fetch the dataset into ``artifacts/raw/<dataset>``: take its archives from ``data/`` (or
    download them there, verified), then unpack; generated datasets are rendered instead."""
    spec, dataset_params = _spec_and_params(params, dataset)
    spec.fetch(dataset_params, paths.raw_dir(dataset), paths.DROPBOX)


def prepare_stage(params: Params, dataset: str, workers: int | None = None) -> dict[str, Any]:
    """Decode, resize and split into ``artifacts/prepared/<dataset>`` with ``workers`` processes (default: all CPUs)."""
    spec, dataset_params = _spec_and_params(params, dataset)
    return prepare_dataset(spec, dataset_params, paths.raw_dir(dataset), paths.prepared_dir(dataset), workers=workers)
