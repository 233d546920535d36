"""The DVC adapter (src/dmlbench/dvc_adapter.py): each function against what DVC itself does on a
small repository (its command line, its own lock file). The splice of ``dvc.lock`` with the adapter's
YAML functions is checked byte for byte against DVC's rewrite in tests/test_record.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dmlbench import dvc_adapter as dvc

DVC = [sys.executable, "-m", "dvc"]
PIPELINE = {
    "stages": {
        "prep": {"cmd": "python -c \"open('prep.txt', 'w').write(open('input.txt').read().upper())\"",
                 "deps": ["input.txt"], "params": ["size"], "outs": ["prep.txt"]},
        "train": {"matrix": {"seed": "${seeds}"}, "cmd": "echo ${item.seed} > train-${item.seed}.txt",
                  "deps": ["prep.txt"], "outs": ["train-${item.seed}.txt"]},
        "keep": {"foreach": ["a", "b"], "do": {"cmd": "echo ${item} > keep-${item}.txt",
                 "outs": [{"keep-${item}.txt": {"persist": True}}]}},
    }
}  # fmt: skip


def _dvc(root: Path, *args: str) -> str:
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    return subprocess.run([*DVC, *args], cwd=root, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump(PIPELINE, sort_keys=False))
    (root / "params.yaml").write_text("size: 3\nseeds: [0, 1]\n")
    (root / "input.txt").write_text("input\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    _dvc(root, "init", "-q")
    return root


def test_the_installed_dvc_passes_and_another_minor_release_is_refused_in_one_line():
    dvc.check_version()
    dvc.check_version("3.67.0")
    for other in ("3.68.0", "3.66.9", "4.0.0"):
        with pytest.raises(RuntimeError, match=rf"DVC {other} is installed") as caught:
            dvc.check_version(other)
        assert "3.67.0" in str(caught.value) and "3.68.0" in str(caught.value) and "\n" not in str(caught.value)


def test_stages_graph_status_and_cache_as_dvcs_command_line_lists_them(repo, monkeypatch):
    monkeypatch.chdir(repo)
    listed = [line.split()[0] for line in _dvc(repo, "stage", "list").splitlines() if line.strip()]
    with dvc.open_repo(repo) as opened:
        stages = dvc.pipeline_stages(opened)
        assert sorted(stages) == sorted(listed) == ["keep@a", "keep@b", "prep", "train@0", "train@1"]
        assert all(dvc.is_pipeline_stage(stage) for stage in stages.values())
        graph = dvc.stage_graph(opened)
        assert {dep.addressing for dep in graph.successors(stages["train@0"])} == {"prep"}
        assert sorted(dvc.stale_stages(opened)) == sorted(json.loads(_dvc(repo, "status", "--json")))
    assert dvc.cache_dir(repo) == Path(_dvc(repo, "cache", "dir").strip()).resolve()


def test_a_stage_run_by_hand_through_the_adapter_gets_the_lock_entry_dvc_commit_writes(repo, monkeypatch):
    """remove_outputs, hash_dependencies, run_environment, save_stage, commit_stage, lock_entry,
    lock_file: the entry equals the one ``dvc commit --force`` writes; DVC then finds prep up to date."""
    monkeypatch.chdir(repo)
    (repo / "prep.txt").write_text("stale\n")
    with dvc.open_repo(repo) as opened, opened.lock:  # (DVC's stage operations assert it is held)
        prep = dvc.pipeline_stages(opened)["prep"]
        dvc.remove_outputs(prep)
        assert not (repo / "prep.txt").exists()
        hashes = dvc.hash_dependencies(prep)
        assert hashes["input.txt"] == {"md5": hashlib.md5(b"input\n").hexdigest()}
        cwd, env = dvc.run_environment(prep, {"EXTRA": "1"})
        assert Path(cwd).resolve() == repo.resolve() and env["DVC_STAGE"] == "prep" and env["EXTRA"] == "1"
        with pytest.raises(dvc.DvcFailure, match="prep.txt"):
            dvc.save_stage(prep)  # its output is missing
        subprocess.run(prep.cmd, shell=True, cwd=cwd, env=env, check=True)
        dvc.save_stage(prep)
        dvc.commit_stage(prep)
        entry = dvc.lock_entry(prep)
        assert dvc.lock_file(prep) == repo / "dvc.lock"
    dvc.lock_file(prep).write_text(dvc.dump_yaml({"schema": "2.0", "stages": entry}))
    assert "prep" not in json.loads(_dvc(repo, "status", "--json"))
    written = (repo / "dvc.lock").read_text()
    _dvc(repo, "commit", "--force", "prep")
    assert (repo / "dvc.lock").read_text() == written
    assert dvc.parse_yaml(written, "dvc.lock")["stages"] == entry


def test_one_dependency_hashed_now_and_none_for_a_missing_one(repo, monkeypatch):
    monkeypatch.chdir(repo)
    with dvc.open_repo(repo) as opened, opened.lock:
        stages = dvc.pipeline_stages(opened)
        (dep,) = [dep for dep in stages["prep"].deps if str(dep) == "input.txt"]
        assert dvc.hash_dependency(dep) == {"md5": hashlib.md5(b"input\n").hexdigest()}
        (missing,) = stages["train@0"].deps  # prep.txt: not made yet
        assert dvc.hash_dependency(missing) is None


def test_definitions_as_dvcs_resolver_generates_them(repo):
    with dvc.open_repo(repo) as opened:
        found = dvc.stage_definitions(opened, repo, yaml.safe_load((repo / "dvc.yaml").read_text()))
    assert [(name, kind) for name, kind, _ in found] == [("prep", "entry"), ("train", "matrix"), ("keep", "foreach")]
    _, _, train = found[1]
    assert list(train.normalized_iterable) == ["0", "1"]
    (resolved,) = train.resolve_one("1").values()
    assert resolved["cmd"] == "echo 1 > train-1.txt" and resolved["outs"] == ["train-1.txt"]
    _, _, prep = found[0]
    assert list(prep.resolve()) == ["prep"]
