"""Hub weights pinned by the project's weights lock (:mod:`dmlbench.models.hub`), against a stand-in
Hub on 127.0.0.1 (:mod:`helpers.fake_hub`) that answers with the Hub's headers: the first use pins the
commit ``main`` resolves to and the sha256 the Hub publishes (its LFS id) and checks the downloaded
bytes against it; later loads ask nothing; a failed commit lookup, a file outside LFS, bytes that
differ from the published digest or from the lock, and an offline job without the file each fail in
one line; a file already in the Hub cache is pinned from the cache; parallel writers lose no entry.
Run with ``tiny_vit``, whose loader is every modern trunk's (:mod:`dmlbench.models.pinned_timm`)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from pathlib import Path

import pytest
import torch
import yaml

from dmlbench.errors import WeightsError
from dmlbench.models import BACKBONES, build_model, hub, tiny_vit
from dmlbench.weights_lock import LOCK_ENV, LockEntry, lock_path, read_lock, record

HUB_FILE = tiny_vit.HUB_FILE  # timm/test_vit.r160_in1k/model.safetensors
NAME = HUB_FILE.name


def weights_bytes(seed: int) -> tuple[bytes, dict[str, torch.Tensor]]:
    """A test_vit state dict at 160 px (as the Hub file: 40 x 40 position embeddings), 4 px patches,
    as safetensors bytes."""
    import timm
    from safetensors.torch import save

    torch.manual_seed(seed)
    net = timm.create_model("test_vit", num_classes=0, img_size=160, patch_size=4)
    state = net.state_dict()
    return save(state), state


def tiny(weights_path: Path | None = None) -> tiny_vit.TinyViTParams:
    return tiny_vit.TinyViTParams(weights_path=str(weights_path) if weights_path else None)


def served(fake_hub, seed: int = 0) -> tuple[str, str, dict[str, torch.Tensor]]:
    data, state = weights_bytes(seed)
    commit, sha256 = fake_hub.add(HUB_FILE.repo, HUB_FILE.filename, data)
    return commit, sha256, state


def test_first_use_pins_the_hubs_commit_and_published_sha256(fake_hub):
    commit, sha256, state = served(fake_hub)
    model = build_model("tiny_vit", tiny(), 8, pooling="cls", pretrained=True)
    entry = read_lock(fake_hub.lock)[NAME]
    assert entry == LockEntry(sha256, f"{fake_hub.url}/{HUB_FILE.repo}/resolve/{commit}/model.safetensors", commit)
    assert len(entry.revision) == 40 and entry.revision != "main"
    # downloaded into huggingface_hub's cache at that commit; its weights are in the model
    cached = fake_hub.cache / "models--timm--test_vit.r160_in1k" / "snapshots" / commit / "model.safetensors"
    assert cached.is_file() and hashlib.sha256(cached.read_bytes()).hexdigest() == sha256
    torch.testing.assert_close(model.trunk.net.blocks[0].attn.qkv.weight, state["blocks.0.attn.qkv.weight"])
    assert model.trunk.net.pos_embed.shape == (1, 1 + 8 * 8, 64)  # tiny_vit's 32 px / 4 px grid
    # later loads verify the cached file against the lock and ask the Hub nothing
    asked = list(fake_hub.requests)
    build_model("tiny_vit", tiny(), 8, pooling="cls", pretrained=True)
    assert fake_hub.requests == asked and read_lock(fake_hub.lock) == {NAME: entry}
    assert yaml.safe_load(fake_hub.lock.read_text())["files"][NAME]["revision"] == commit


def test_bytes_that_differ_from_the_published_sha256_are_deleted_in_one_line(fake_hub):
    _, sha256, _ = served(fake_hub)
    fake_hub.tamper = True  # the CDN serves other bytes than the LFS id the Hub publishes
    with pytest.raises(WeightsError) as caught:
        build_model("tiny_vit", tiny(), 8, pretrained=True)
    message = str(caught.value)
    assert "\n" not in message and sha256 in message and "the download was deleted" in message
    assert not [p for p in fake_hub.cache.rglob("*") if p.is_file() and p.stat().st_size > 1000]


def test_a_failed_commit_lookup_is_an_error_not_main(fake_hub):
    served(fake_hub)
    fake_hub.omit_commit = True
    with pytest.raises(WeightsError, match="named no commit") as caught:
        build_model("tiny_vit", tiny(), 8, pretrained=True)
    assert "\n" not in str(caught.value) and read_lock(fake_hub.lock) == {}


def test_a_file_without_a_published_sha256_is_refused(fake_hub):
    served(fake_hub)
    fake_hub.etag = "1" * 40  # a git blob id: a file outside LFS, no sha256 published
    with pytest.raises(WeightsError, match="publishes no sha256"):
        build_model("tiny_vit", tiny(), 8, pretrained=True)
    assert read_lock(fake_hub.lock) == {}


def test_an_unknown_repo_names_what_cannot_be_asked(fake_hub):
    with pytest.raises(WeightsError) as caught:
        build_model("tiny_vit", tiny(), 8, pretrained=True)
    message = str(caught.value)
    assert "\n" not in message and NAME in message and "make fetch" in message


def test_a_file_already_in_the_cache_is_pinned_from_the_cache_without_a_request(fake_hub):
    data, state = weights_bytes(3)
    sha256, commit = hashlib.sha256(data).hexdigest(), "c" * 40
    folder = fake_hub.cache / "models--timm--test_vit.r160_in1k"  # huggingface_hub's layout
    (folder / "blobs").mkdir(parents=True)
    (folder / "blobs" / sha256).write_bytes(data)
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "snapshots" / commit / "model.safetensors").symlink_to(f"../../blobs/{sha256}")
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    model = build_model("tiny_vit", tiny(), 8, pretrained=True)
    assert fake_hub.requests == [] and read_lock(fake_hub.lock)[NAME].revision == commit
    torch.testing.assert_close(model.trunk.net.blocks[0].attn.qkv.weight, state["blocks.0.attn.qkv.weight"])
    # a cached blob whose bytes are not its published digest is refused
    other = fake_hub.cache.parent / "other"
    other.mkdir()
    os.environ["HF_HUB_CACHE"] = str(other)
    try:
        (other / folder.name / "blobs").mkdir(parents=True)
        (other / folder.name / "blobs" / sha256).write_bytes(weights_bytes(4)[0])
        (other / folder.name / "snapshots" / commit).mkdir(parents=True)
        (other / folder.name / "snapshots" / commit / "model.safetensors").symlink_to(f"../../blobs/{sha256}")
        fake_hub.lock.unlink()
        with pytest.raises(WeightsError, match=f"the Hub published {sha256}"):
            build_model("tiny_vit", tiny(), 8, pretrained=True)
    finally:
        os.environ["HF_HUB_CACHE"] = str(fake_hub.cache)


def test_a_changed_cached_file_is_refused_and_the_lock_kept(fake_hub):
    commit, sha256, _ = served(fake_hub)
    build_model("tiny_vit", tiny(), 8, pretrained=True)
    cached = fake_hub.cache / "models--timm--test_vit.r160_in1k" / "snapshots" / commit / "model.safetensors"
    blob = cached.resolve()
    blob.chmod(0o644)
    blob.write_bytes(weights_bytes(1)[0])  # other bytes under the same name
    with pytest.raises(WeightsError) as caught:
        build_model("tiny_vit", tiny(), 8, pretrained=True)
    message = str(caught.value)
    assert "\n" not in message and sha256 in message and str(fake_hub.lock) in message
    assert read_lock(fake_hub.lock)[NAME].sha256 == sha256


def test_a_weights_path_copy_is_checked_against_the_lock(fake_hub, tmp_path):
    _, sha256, _ = served(fake_hub)
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(weights_bytes(0)[0])
    build_model("tiny_vit", tiny(copy), 8, pretrained=True)  # pinned from the Hub, the copy verified
    assert read_lock(fake_hub.lock)[NAME].sha256 == sha256 and not fake_hub.cache.exists()
    copy.write_bytes(weights_bytes(2)[0])
    with pytest.raises(WeightsError, match=f"pins {sha256}"):
        build_model("tiny_vit", tiny(copy), 8, pretrained=True)
    missing = tmp_path / "nowhere.safetensors"
    with pytest.raises(WeightsError) as caught:
        build_model("tiny_vit", tiny(missing), 8, pretrained=True)
    assert "\n" not in str(caught.value) and str(missing) in str(caught.value) and sha256 in str(caught.value)


def test_offline_jobs_ask_nothing_and_name_make_fetch(fake_hub, monkeypatch):
    served(fake_hub)
    for variable in ("DMLBENCH_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(variable, "1")
        with pytest.raises(WeightsError) as caught:  # neither pinned nor cached
            build_model("tiny_vit", tiny(), 8, pretrained=True)
        assert "\n" not in str(caught.value) and "make fetch" in str(caught.value) and fake_hub.requests == []
        monkeypatch.delenv(variable)
    build_model("tiny_vit", tiny(), 8, pretrained=True)  # online: pinned and cached
    entry = read_lock(fake_hub.lock)[NAME]
    for path in fake_hub.cache.rglob("model.safetensors"):
        path.unlink()  # pinned, but the file is not here
    monkeypatch.setenv("DMLBENCH_OFFLINE", "1")
    asked = len(fake_hub.requests)
    with pytest.raises(WeightsError) as caught:
        build_model("tiny_vit", tiny(), 8, pretrained=True)
    assert "\n" not in str(caught.value) and entry.revision in str(caught.value) and "make fetch" in str(caught.value)
    assert len(fake_hub.requests) == asked


def test_a_complete_lock_is_only_read(fake_hub, monkeypatch):
    """Loading a pinned file never writes the lock: a stage (or a read-only checkout) only reads it."""
    served(fake_hub)
    build_model("tiny_vit", tiny(), 8, pretrained=True)
    before = fake_hub.lock.read_bytes()
    monkeypatch.setattr(hub, "record", lambda *a, **k: pytest.fail("wrote the weights lock"))
    build_model("tiny_vit", tiny(), 8, pretrained=True)
    assert fake_hub.lock.read_bytes() == before


def test_the_lock_lives_at_the_project_root_not_in_the_package(tmp_path, monkeypatch):
    import dmlbench

    monkeypatch.delenv(LOCK_ENV, raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert lock_path() == tmp_path / "weights.lock"
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "repo"))
    assert lock_path() == tmp_path / "repo" / "weights.lock"
    package = Path(dmlbench.__file__).parent
    assert not list(package.rglob("*lock*.yaml")) and not list(package.rglob("weights.lock"))
    root = Path(__file__).resolve().parents[1]
    assert read_lock(root / "weights.lock") is not None  # the committed project lock parses


def _record_many(path: str, worker: int) -> None:
    for i in range(10):
        record(f"repo{worker}/file{i}", LockEntry(f"{worker:02d}{i:062d}", f"url{worker}-{i}", "0" * 40), Path(path))


def test_parallel_writers_lose_no_entry_and_never_replace_one(tmp_path):
    path = tmp_path / "weights.lock"
    context = multiprocessing.get_context("fork")  # separate processes, separate open files: flock excludes them
    workers = [context.Process(target=_record_many, args=(str(path), w)) for w in range(4)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
    assert all(p.exitcode == 0 for p in workers)
    files = read_lock(path)
    assert len(files) == 40 and files["repo2/file7"].url == "url2-7"
    kept = record("repo2/file7", LockEntry("f" * 64, "elsewhere", "1" * 40), path)
    assert kept.url == "url2-7" and read_lock(path)["repo2/file7"].url == "url2-7"
    assert not list(tmp_path.glob(".weights.lock.*.tmp"))


def test_the_preflight_pins_and_reports_a_hub_file(fake_hub, monkeypatch):
    """``make fetch``/the pre-flight pin the file before any stage (so no stage writes the lock)."""
    from dmlbench.models.hub import hub_file_problem

    commit, sha256, _ = served(fake_hub)
    (file,) = tiny().weights_files("tiny_vit")
    assert file.hub == HUB_FILE and file.sha256 is None
    assert hub_file_problem("tiny_vit", HUB_FILE) is None  # pinned (HEAD only), not downloaded
    assert read_lock(fake_hub.lock)[NAME].sha256 == sha256 and not fake_hub.cache.exists()
    (file,) = tiny().weights_files("tiny_vit")
    assert file.sha256 == sha256 and commit in str(file.path) and commit in str(file.url)
    assert hub_file_problem("tiny_vit", HUB_FILE, fetch=True) is None and file.path.is_file()
    assert BACKBONES["tiny_vit"].params().weights_files("tiny_vit")[0].path == file.path


def test_the_validate_stage_records_each_backbones_pin_for_the_manifests(fake_hub):
    """What :func:`dmlbench.pipeline.preflight.weights_pins` hands the manifests: the lock's
    sha256 and commit of each pretrained Hub file per backbone; nothing when not pretrained."""
    from types import SimpleNamespace

    from dmlbench.models.hub import hub_file_problem
    from dmlbench.pipeline.preflight import weights_pins

    commit, sha256, _ = served(fake_hub)
    grid = SimpleNamespace(protocol=SimpleNamespace(pretrained=True), backbones={"tiny_vit": tiny()})
    assert weights_pins(grid) == {}  # not pinned yet: the pre-flight pins first
    assert hub_file_problem("tiny_vit", HUB_FILE) is None
    assert weights_pins(grid) == {"tiny_vit": {NAME: f"{sha256}@{commit}"}}
    grid.protocol.pretrained = False
    assert weights_pins(grid) == {}
