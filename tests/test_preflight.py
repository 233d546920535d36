"""Pre-flight: before any stage runs, every pretrained weights file the grid needs is here (with
its pinned sha256) or downloadable (HTTP HEAD against a local server here), else the pipeline
stops and lists each missing file and where to put it."""

from __future__ import annotations

import copy
import hashlib
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from test_url_check import presigned  # noqa: F401 - a fixture: HEAD refused, GET served

from dmlbench import devices
from dmlbench.errors import WeightsError
from dmlbench.params.load import parse_params
from dmlbench.pipeline import __main__ as pipeline
from dmlbench.pipeline.archives import missing_archives
from dmlbench.pipeline.preflight import missing_weights, require_weights

RESNET_FILE = "resnet50-0676ba61.pth"


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the pre-flight check used the network")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(urllib.request.OpenerDirector, "open", refuse)


def _raw(default_raw_params: dict, backbones: dict, pretrained: bool = True) -> dict:
    """params.yaml with the demo protocol made pretrained and ``backbones`` as the grid's."""
    raw = copy.deepcopy(default_raw_params)
    raw["backbones"] = backbones
    raw["protocols"][raw["protocol"]]["pretrained"] = pretrained
    return raw


def _closed_port_url(name: str) -> str:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"


def test_demo_grid_passes_without_network(default_raw_params, hub_dir, no_network):
    params = parse_params(default_raw_params)
    assert not params.protocol.pretrained
    assert missing_weights(params) == []
    require_weights(params)
    assert not hub_dir.exists()


def test_downloadable_file_passes_with_head_requests_only(default_raw_params, hub_dir, server):
    root, url, requests = server
    (root / RESNET_FILE).write_bytes(b"weights")
    for path in (f"/{RESNET_FILE}", f"/moved/{RESNET_FILE}"):  # also through a redirect
        params = parse_params(_raw(default_raw_params, {"resnet50": {"weights_url": url + path}}))
        assert missing_weights(params) == []
    assert requests == [("HEAD", f"/{RESNET_FILE}"), ("HEAD", f"/moved/{RESNET_FILE}"), ("HEAD", f"/{RESNET_FILE}")]
    assert not (hub_dir / "checkpoints" / RESNET_FILE).exists()  # checked, not downloaded


def test_a_presigned_url_refusing_head_passes_with_a_ranged_get(
    default_raw_params,
    hub_dir,
    presigned,  # noqa: F811 - the fixture imported above
    tmp_path,
):
    url, requests = presigned  # HEAD -> 403, GET -> the file (tests/test_url_check.py)
    raw = _raw(default_raw_params, {"resnet50": {"weights_url": f"{url}/moved/{RESNET_FILE}"}})
    raw["datasets"] = {"cub200": {"source": {"archive": {"url": f"{url}/moved/CUB_200_2011.tgz"}}}}
    params = parse_params(raw)
    assert missing_weights(params) == [] and missing_archives(params, tmp_path / "data") == []
    assert ("GET", f"/{RESNET_FILE}", "bytes=0-0") in requests
    assert ("GET", "/CUB_200_2011.tgz", "bytes=0-0") in requests
    assert not (hub_dir / "checkpoints" / RESNET_FILE).exists()


def test_every_missing_file_is_listed_with_its_checksum_and_where_to_put_it(default_raw_params, hub_dir, server):
    _, url, _ = server
    backbones = {
        "resnet50": {"weights_url": f"{url}/{RESNET_FILE}"},  # HTTP 404
        "googlenet": {"weights_url": _closed_port_url("googlenet-1378be20.pth")},  # connection refused
        "bn_inception": {},  # the real URL, but a copy elsewhere is named and absent
    }
    backbones["bn_inception"]["weights_path"] = str(hub_dir.parent / "nowhere" / "bn.pth")
    params = parse_params(_raw(default_raw_params, backbones))
    with pytest.raises(WeightsError) as error:
        require_weights(params)
    header, *lines = str(error.value).splitlines()
    assert "protocol 'demo' (pretrained: true) needs 3 pretrained weights file(s)" in header
    assert len(lines) == 3
    resnet, googlenet, bn = lines
    cached = hub_dir / "checkpoints"
    assert resnet.startswith(f"backbones.resnet50: {RESNET_FILE} is not at {cached / RESNET_FILE}")
    assert "HTTP 404" in resnet and "(sha256 0676ba61)" in resnet
    assert f"put it at {cached / RESNET_FILE} or set backbones.resnet50.weights_path" in resnet
    assert googlenet.startswith("backbones.googlenet: googlenet-1378be20.pth is not at")
    assert "(sha256 1378be20)" in googlenet and "backbones.googlenet.weights_path" in googlenet
    assert bn.startswith(f"backbones.bn_inception.weights_path: {hub_dir.parent / 'nowhere' / 'bn.pth'} does not exist")
    assert "52deb473314542a5c2f87e9e6f26f4ca42fe863d15f986414dbae8c2dfdd2353" in bn
    assert "http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth" in bn


def test_a_present_file_is_checked_against_its_pinned_sha256_offline(default_raw_params, hub_dir, no_network):
    data = b"pretend ImageNet weights"
    digest = hashlib.sha256(data).hexdigest()
    name = f"resnet50-{digest[:8]}.pth"
    (hub_dir / "checkpoints").mkdir(parents=True)
    (hub_dir / "checkpoints" / name).write_bytes(data)
    good = {"weights_url": f"https://example.invalid/{name}", "weights_sha256": digest[:8]}
    assert missing_weights(parse_params(_raw(default_raw_params, {"resnet50": good}))) == []

    bad = {**good, "weights_sha256": "0" * 64}
    (problem,) = missing_weights(parse_params(_raw(default_raw_params, {"resnet50": bad})))
    assert problem.startswith(f"backbones.resnet50: {hub_dir / 'checkpoints' / name} has sha256 {digest}, expected 0")

    local = hub_dir / "copy.pth"
    local.write_bytes(data)
    by_path = {"weights_path": str(local), "weights_sha256": digest}
    assert missing_weights(parse_params(_raw(default_raw_params, {"resnet50": by_path}))) == []


def test_not_pretrained_needs_no_weights_and_timm_weights_path_is_checked(default_raw_params, hub_dir, no_network):
    backbones = {"resnet50": {}, "timm_resnet18": {"weights_path": str(hub_dir / "r18.safetensors")}}
    assert missing_weights(parse_params(_raw(default_raw_params, backbones, pretrained=False))) == []
    only_timm = {"timm_resnet18": backbones["timm_resnet18"]}
    (problem,) = missing_weights(parse_params(_raw(default_raw_params, only_timm)))
    assert problem.startswith(f"backbones.timm_resnet18.weights_path: {hub_dir / 'r18.safetensors'} does not exist")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_pipeline_stops_before_dvc_runs_anything(
    default_raw_params, hub_dir, server, tmp_path, monkeypatch, capsys, jobs
):
    _, url, _ = server
    raw = _raw(default_raw_params, {"resnet50": {"weights_url": f"{url}/{RESNET_FILE}"}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))

    def no_dvc(*args, **kwargs):
        raise AssertionError("a DVC stage or plan started before the pre-flight check failed")

    monkeypatch.setattr(pipeline, "plan_after_validate", no_dvc)
    monkeypatch.setattr(pipeline.subprocess, "run", no_dvc)
    monkeypatch.setattr(pipeline, "run_to_the_end", no_dvc)
    assert pipeline.main(["--params", str(tmp_path / "params.yaml"), "--jobs", jobs]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: protocol 'demo' (pretrained: true) needs 1 pretrained weights file(s)")
    cached = hub_dir / "checkpoints" / RESNET_FILE
    assert err[1].startswith(f"error: backbones.resnet50: {RESNET_FILE} is not at {cached}")


def test_the_validate_stage_stops_plain_dvc_repro_before_download(default_raw_params, tmp_path):
    # `dvc repro` without the pipeline: the first stage (validate; download depends on it) fails
    raw = _raw(default_raw_params, {"resnet50": {"weights_url": _closed_port_url(RESNET_FILE)}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    marker = tmp_path / "params.validated"
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TORCH_HOME=str(tmp_path / "torch"), PYTHONPATH=str(root / "src"))
    result = subprocess.run(
        [sys.executable, "stages/validate.py", "--params", str(tmp_path / "params.yaml"), "--out", str(marker)],
        cwd=root, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and not marker.exists()
    err = result.stderr.splitlines()
    assert err[0].startswith("error: protocol 'demo' (pretrained: true) needs 1 pretrained weights file(s)")
    assert err[1].startswith(f"error: backbones.resnet50: {RESNET_FILE} is not at {tmp_path / 'torch' / 'hub'}")


@pytest.mark.parametrize("argv, visible", [(["--gpus", "3"], "3"), (["--gpus", "0,1", "--jobs", "1"], "0,1")])
def test_gpus_reach_the_sequential_stages(default_raw_params, tmp_path, monkeypatch, argv, visible):
    """--gpus with one id, or with --jobs 1, runs a plain `dvc repro`: its stages see those GPUs only."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(default_raw_params, sort_keys=False))
    monkeypatch.chdir(tmp_path)  # no data.dvc here: the drop-box is left alone
    seen = []

    def dvc_repro(command, cwd, env):
        seen.append((command[-2:], env.get("CUDA_VISIBLE_DEVICES")))
        return 1  # stop: no closing summary

    monkeypatch.setattr(pipeline, "run_to_the_end", dvc_repro)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(devices.DEVICE_ENV, raising=False)  # the runner sets it; removed again afterwards
    gpu = devices.CudaFacts("2.14.1+cu130", "13.0", True, ("sm_90",), (devices.Gpu("H100", (9, 0)),), "580.95.05")
    monkeypatch.setattr(devices, "cuda_facts", lambda: gpu)  # --gpus: the device pre-flight finds a usable GPU
    assert pipeline.main(["--params", str(tmp_path / "params.yaml"), *argv]) == 1
    assert seen == [(["dvc", "repro"], visible)]


def test_the_faiss_backend_without_faiss_fails_before_any_stage_in_one_line(default_raw_params, monkeypatch):
    import importlib.util

    from dmlbench.errors import DmlbenchError
    from dmlbench.pipeline.preflight import require_backend

    raw = copy.deepcopy(default_raw_params)
    raw["evaluate"]["backend"] = "faiss"
    params = parse_params(raw)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "faiss" else real_find_spec(name, *a)
    )
    with pytest.raises(DmlbenchError, match=r"^evaluate.backend: faiss, .* not installed .* auto, torch, screened$"):
        require_backend(params)
    raw["evaluate"]["backend"] = "torch"
    require_backend(parse_params(raw))  # the others need nothing beyond the base install
