"""Shared fixtures: a small glyph dataset prepared once per session, a private MLflow store."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


@pytest.fixture(scope="session")
def default_raw_params() -> dict:
    """params.yaml of the repository, as loaded YAML."""
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def small_params_dict(base: dict, **overrides) -> dict:
    """A reduced copy of params.yaml: 40 glyph classes x 16 images, 2 epochs of batch 16."""
    raw = copy.deepcopy(base)
    raw["datasets"]["glyphs"]["source"].update(num_classes=40, images_per_class=16)
    raw["datasets"]["glyphs"]["split"].update(val_fraction=0.25)
    raw["protocols"][raw["protocol"]].update(epochs=2, batch_size=16, samples_per_class=4)
    for key, value in overrides.items():
        raw[key] = value
    return raw


@pytest.fixture(scope="session")
def small_raw_params(default_raw_params) -> dict:
    return small_params_dict(default_raw_params)


@pytest.fixture(scope="session")
def small_params(small_raw_params):
    from dmlbench.config import parse_params

    return parse_params(small_raw_params)


@pytest.fixture(scope="session")
def prepared_glyphs(tmp_path_factory, small_params):
    """The small glyph dataset generated and prepared once: (prepared_dir, PreparedDataset)."""
    from dmlbench.data import DATASETS
    from dmlbench.data.cache import PreparedDataset
    from dmlbench.data.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("glyphs")
    spec, params = DATASETS["glyphs"], small_params.datasets["glyphs"]
    spec.fetch(params, root / "raw", root / "dropbox")
    prepare_dataset(spec, params, root / "raw", root / "prepared")
    return root, PreparedDataset.load(root / "prepared")


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch) -> str:
    """A fresh sqlite tracking store for one test."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def in_project(tmp_path, monkeypatch) -> Path:
    """Run with a temporary directory as the project root (artifacts/ goes there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    return tmp_path
