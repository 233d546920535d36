"""Shared fixtures and hooks: a small glyph dataset prepared once per session, a private MLflow store,
local servers, archives in the real datasets' formats. The helpers they use, and that tests import,
are in ``tests/helpers/``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from helpers.archives import build_cars, build_cub, build_inshop, build_sop
from helpers.evaluation import CPU_EVALUATION_PATHS, CpuEvaluationPaths
from helpers.project import ROOT, small_params_dict
from helpers.servers import PROXY_VARIABLES, FileServer, StaticServer

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a CUDA GPU: skipped, with the reason, where torch sees none."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (make gpu-check runs these on one)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_inherited_run_device(monkeypatch):
    """Each test starts without ``DMLBENCH_DEVICE``: the runner's ``main()``, called in-process by
    some tests, exports the run's device to its own environment for its stages."""
    monkeypatch.delenv("DMLBENCH_DEVICE", raising=False)


@pytest.fixture(scope="session")
def default_raw_params() -> dict:
    """params.yaml of the repository, as loaded YAML."""
    return yaml.safe_load((ROOT / "params.yaml").read_text())


@pytest.fixture(scope="session")
def small_raw_params(default_raw_params) -> dict:
    return small_params_dict(default_raw_params)


@pytest.fixture(scope="session")
def small_params(small_raw_params):
    from dmlbench.params.load import parse_params

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
def hub_dir(tmp_path, monkeypatch) -> Path:
    """An empty torch hub cache, so no test sees (or writes) the user's real one."""
    import torch

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    return tmp_path / "hub"


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A stand-in Hugging Face Hub on 127.0.0.1 (:mod:`helpers.fake_hub`) as ``HF_ENDPOINT``, with an empty
    Hub cache and weights lock of this test's own (``hub.cache``, ``hub.lock``), online."""
    from helpers.fake_hub import FakeHub

    hub = FakeHub()
    hub.cache, hub.lock = tmp_path / "hf-cache", tmp_path / "weights.lock"
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub.cache))
    monkeypatch.setenv("DMLBENCH_WEIGHTS_LOCK", str(hub.lock))
    for name in ("DMLBENCH_OFFLINE", "HF_HUB_OFFLINE", "DMLBENCH_SKIP_URL_CHECK", "HF_TOKEN", *PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield hub
    hub.close()


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


# --------------------------------------------------------------------------- CPU evaluation paths
# `evaluate.backend: auto` forced onto either CPU path (see helpers.evaluation): both run on every machine.


@pytest.fixture
def cpu_evaluation_paths(monkeypatch) -> CpuEvaluationPaths:
    """Run code under each CPU evaluation path in turn: ``with paths.force("screened"): ...``."""
    return CpuEvaluationPaths(monkeypatch)


@pytest.fixture(params=CPU_EVALUATION_PATHS)
def auto_cpu_path(request, monkeypatch):
    """The whole test runs with ``auto`` forced to one CPU path (parametrised: both run on every
    machine); yields ``(path, ran)``, ``ran`` filled as the test evaluates."""
    paths = CpuEvaluationPaths(monkeypatch)
    with paths.force(request.param) as ran:
        yield request.param, ran


# --------------------------------------------------------------------------- dataset archives
# Small archives in the exact formats of CUB-200-2011, CARS196, SOP and In-Shop (helpers.archives),
# and local HTTP servers on 127.0.0.1 (helpers.servers).


@pytest.fixture
def file_server(tmp_path):
    """A local HTTP server over ``tmp_path/served`` (see :class:`helpers.servers.FileServer`)."""
    root = tmp_path / "served"
    root.mkdir()
    server = FileServer(root)
    yield server
    server.close()


@pytest.fixture(autouse=False)
def fast_retries(monkeypatch):
    """No back-off waits between download retries."""
    monkeypatch.setattr("dmlbench.data.download.BACKOFF_SECONDS", 0.0)


@pytest.fixture(scope="session")
def real_format_archives(tmp_path_factory) -> dict:
    """``{dataset: {"files": [paths], "md5": {filename: md5}, ...}}`` for the four real datasets."""
    from dmlbench.io import md5_file

    out = tmp_path_factory.mktemp("archives")
    built = {"cub200": build_cub(out), "cars196": build_cars(out), "sop": build_sop(out), "inshop": build_inshop(out)}
    for entry in built.values():
        entry["md5"] = {path.name: md5_file(path) for path in entry["files"]}
    return built


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A local HTTP server over ``tmp_path/www``; ``/moved/<name>`` redirects (302) to ``/<name>``.
    Yields (root, url, requests) with ``requests`` the (method, path) of every request. Proxy
    settings of the environment are removed (urllib would send 127.0.0.1 through them)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "www"
    root.mkdir()
    httpd = StaticServer(root)
    yield root, httpd.url, httpd.requests
    httpd.close()
