"""Weights without a published digest (DINO, DINOv2, CLIP and ConvNeXt Hub files): the weights lock
records a file's sha256 at first use, verifies it on every later load, refuses a changed file in
one line, and a missing file names what to fetch and where. Run offline with ``tiny_vit``, whose
loader is the modern backbones' (:mod:`dmlbench.models.pinned_timm`), on a locally written file."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import yaml

from dmlbench.models import BACKBONES, build_model, pinned_timm, tiny_vit
from dmlbench.models.weights import WeightsError, sha256_file, weights_file_problem
from dmlbench.models.weights_lock import LOCK_ENV, LockEntry, locked, read_lock, record

NAME = tiny_vit.HUB_FILE.name  # timm/test_vit.r160_in1k/model.safetensors


@pytest.fixture
def lock(tmp_path, monkeypatch) -> Path:
    """An empty lock of this test's own (the committed one is never written by tests)."""
    path = tmp_path / "weights_lock.yaml"
    monkeypatch.setenv(LOCK_ENV, str(path))
    monkeypatch.delenv("DMLBENCH_OFFLINE", raising=False)
    return path


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network unreachable (test)")

    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def write_weights(path: Path, seed: int) -> dict[str, torch.Tensor]:
    """A test_vit state dict at 160 px (as the Hub file: 40 x 40 position embeddings), 4 px patches."""
    import timm

    torch.manual_seed(seed)
    net = timm.create_model("test_vit", num_classes=0, global_pool="", img_size=160, patch_size=4)
    state = net.state_dict()
    if path.suffix == ".safetensors":  # as the Hub's file: timm picks the reader by the suffix
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    return state


def tiny(weights_path: Path | None = None) -> tiny_vit.TinyViTParams:
    return tiny_vit.TinyViTParams(weights_path=str(weights_path) if weights_path else None)


def test_first_use_records_the_hash_and_the_next_load_verifies_it(lock, tmp_path):
    file = tmp_path / "test_vit.pth"
    state = write_weights(file, seed=0)
    assert locked(NAME) is None
    model = build_model("tiny_vit", tiny(file), 8, pooling="cls", pretrained=True)
    entry = read_lock(lock)[NAME]
    assert entry.sha256 == sha256_file(file) and entry.url == tiny_vit.HUB_FILE.url("main")
    # the file's weights are in the model (block weights as they are; position embeddings resampled 40x40 -> 8x8)
    torch.testing.assert_close(model.trunk.net.blocks[0].attn.qkv.weight, state["blocks.0.attn.qkv.weight"])
    assert model.trunk.net.pos_embed.shape == (1, 1 + 8 * 8, 64)
    build_model("tiny_vit", tiny(file), 8, pooling="cls", pretrained=True)  # same bytes: accepted
    assert read_lock(lock) == {NAME: entry}


def test_a_changed_file_is_refused_in_one_line(lock, tmp_path):
    file = tmp_path / "test_vit.pth"
    write_weights(file, seed=0)
    build_model("tiny_vit", tiny(file), 8, pretrained=True)
    recorded = read_lock(lock)[NAME].sha256
    write_weights(file, seed=1)  # other bytes under the same name
    with pytest.raises(WeightsError) as caught:
        build_model("tiny_vit", tiny(file), 8, pretrained=True)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("backbones.tiny_vit: ")
    assert sha256_file(file) in message and recorded in message and str(lock) in message
    assert read_lock(lock)[NAME].sha256 == recorded  # never overwritten by the changed file


def test_a_wrong_sha256_in_the_lock_is_refused(lock, tmp_path):
    file = tmp_path / "test_vit.pth"
    write_weights(file, seed=0)
    record(NAME, LockEntry("0" * 64, tiny_vit.HUB_FILE.url("main"), "main"))
    with pytest.raises(WeightsError, match="recorded 0{64}"):
        build_model("tiny_vit", tiny(file), 8, pretrained=True)


def test_a_missing_weights_path_names_the_file_and_where_to_fetch_it(lock, tmp_path):
    missing = tmp_path / "nowhere" / "model.safetensors"
    with pytest.raises(WeightsError) as caught:
        build_model("tiny_vit", tiny(missing), 8, pretrained=True)
    message = str(caught.value)
    assert "\n" not in message and str(missing) in message
    assert "https://huggingface.co/timm/test_vit.r160_in1k/resolve/main/model.safetensors" in message
    assert locked(NAME) is None


def test_without_network_a_missing_hub_file_names_url_and_cache_path(lock, hub_dir, no_network):
    with pytest.raises(WeightsError) as caught:
        build_model("tiny_vit", tiny(), 8, pretrained=True)
    message = str(caught.value)
    target = hub_dir / "checkpoints" / "timm--test_vit.r160_in1k--model.safetensors"
    assert "\n" not in message and f"put it at {target}" in message
    assert tiny_vit.HUB_FILE.url("main") in message and not target.exists()
    # the pre-flight check reports the same file, at the same place
    (file,) = tiny().weights_files("tiny_vit")
    problem = weights_file_problem(file)
    assert problem is not None and "\n" not in problem and f"put it at {target}" in problem


def test_offline_jobs_never_download(lock, hub_dir, monkeypatch):
    monkeypatch.setenv("DMLBENCH_OFFLINE", "1")
    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: pytest.fail("downloaded offline"))
    with pytest.raises(WeightsError, match="DMLBENCH_OFFLINE"):
        build_model("tiny_vit", tiny(), 8, pretrained=True)


def test_first_download_pins_the_hub_commit_and_later_downloads_fetch_it(lock, hub_dir, tmp_path, monkeypatch):
    source = tmp_path / "served.safetensors"
    write_weights(source, seed=0)
    fetched: list[str] = []

    def download(url, dst, *args, **kwargs):
        fetched.append(url)
        Path(dst).write_bytes(source.read_bytes())

    monkeypatch.setattr(torch.hub, "download_url_to_file", download)
    monkeypatch.setattr(pinned_timm, "hub_commit", lambda url, timeout=0: "0123abcd" * 5)
    build_model("tiny_vit", tiny(), 8, pretrained=True)
    entry = read_lock(lock)[NAME]
    commit_url = tiny_vit.HUB_FILE.url("0123abcd" * 5)
    assert fetched == [commit_url] and entry == LockEntry(sha256_file(source), commit_url, "0123abcd" * 5)
    assert yaml.safe_load(lock.read_text())["files"][NAME]["revision"] == "0123abcd" * 5

    monkeypatch.setattr(pinned_timm, "hub_commit", lambda url, timeout=0: pytest.fail("asked the Hub again"))
    cached = tiny().weights_files("tiny_vit")[0]
    assert cached.url == commit_url and cached.sha256 == entry.sha256  # the pre-flight checks the pinned file
    cached.path.unlink()
    build_model("tiny_vit", tiny(), 8, pretrained=True)
    assert fetched == [commit_url, commit_url]


def test_a_backbone_without_a_hub_file_has_no_pretrained_weights(lock):
    class NoWeights(pinned_timm.PinnedTimmParams):
        pass

    assert NoWeights().weights_files("x") == []
    assert BACKBONES["tiny_vit"].params().weights_files("tiny_vit")[0].url == tiny_vit.HUB_FILE.url("main")
