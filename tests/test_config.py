"""params.yaml validation: bad input fails in one line naming the key and what is allowed."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

from dmlbench.config import Combo, RunSpec, config_hash, flatten, load_params, parse_params
from dmlbench.data import DATASETS
from dmlbench.errors import ConfigError
from dmlbench.losses import LOSSES
from dmlbench.models import BACKBONES


def _error(raw: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_params(raw)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_default_params_are_the_offline_demo():
    params = load_params(ROOT / "params.yaml")
    assert list(params.datasets) == ["glyphs"]
    assert {"contrastive", "triplet", "multi_similarity", "proxy_anchor"} <= set(params.losses)
    assert len(params.dims) >= 2 and len(params.seeds) >= 3
    assert len(params.runs()) == len(params.losses) * len(params.dims) * len(params.seeds)
    assert params.protocol.selection_metric in {"map_at_r", "precision_at_1", "r_precision"}


@pytest.mark.parametrize(
    ("section", "name", "registry"),
    [("datasets", "cub2011", DATASETS), ("backbones", "resnet5O", BACKBONES), ("losses", "tripplet", LOSSES)],
)
def test_unknown_registry_name_names_key_and_valid_values(default_raw_params, section, name, registry):
    raw = copy.deepcopy(default_raw_params)
    raw[section][name] = {}
    message = _error(raw)
    assert f"{section}.{name}" in message
    for valid in registry:
        assert valid in message


def test_wrong_typed_hyperparameter(default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["losses"]["triplet"]["margin"] = "wide"
    message = _error(raw)
    assert message.startswith("params.yaml: losses.triplet.margin:")
    assert "'wide'" in message


def test_unknown_hyperparameter_lists_allowed_keys(default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["losses"]["multi_similarity"]["epsilon"] = 0.2
    message = _error(raw)
    assert "losses.multi_similarity.epsilon: unknown key" in message
    assert "miner_epsilon" in message and "alpha" in message


def test_protocol_errors(default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["protocol"] = "thesis_v2"
    assert "protocol: 'thesis_v2' is not a key of protocols; valid: demo" in _error(raw)

    raw = copy.deepcopy(default_raw_params)
    raw["protocols"]["demo"]["optimizer"]["name"] = "adagrad"
    message = _error(raw)
    assert "protocols.demo.optimizer.name" in message and "adamw" in message

    raw = copy.deepcopy(default_raw_params)
    raw["protocols"]["demo"]["batch_size"] = 30
    assert "multiple of samples_per_class" in _error(raw)

    raw = copy.deepcopy(default_raw_params)
    raw["protocols"]["demo"]["augment"]["flip"] = True
    message = _error(raw)
    assert "protocols.demo.augment.flip: unknown key" in message and "hflip" in message


def test_grid_lists_are_checked(default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["dims"] = [64, 64]
    assert "dims has repeated values" in _error(raw)
    raw = copy.deepcopy(default_raw_params)
    raw["seeds"] = [0, -1]
    assert "seeds.1" in _error(raw)


def test_empty_loss_entry_means_published_defaults(default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["losses"] = {"triplet": None}
    params = parse_params(raw)
    assert params.losses["triplet"].margin == 0.1  # thesis Table 4


def test_run_identity_and_resolution(small_params):
    run = small_params.runs()[0]
    assert run.key == f"glyphs-tiny_cnn-{run.loss}-{run.dim}-{run.seed}"
    assert run.grid_key == f"glyphs/tiny_cnn/{run.loss}/{run.dim}/seed{run.seed}"
    resolved = small_params.resolved(run)
    assert resolved["loss"]["name"] == run.loss and resolved["protocol"]["epochs"] == 2
    assert config_hash(resolved) == config_hash(copy.deepcopy(resolved))
    other = small_params.resolved(RunSpec(run.dataset, run.backbone, run.loss, run.dim, small_params.seeds[1]))
    assert config_hash(other) != config_hash(resolved)
    assert flatten({"a": {"b": 1, "c": [1, 2]}}) == {"a.b": 1, "a.c": [1, 2]}
    with pytest.raises(ConfigError, match="dims: 999 is not in params.yaml"):
        small_params.check_run(Combo("glyphs", "tiny_cnn", run.loss, 999))


def test_stage_prints_one_line_and_exits_2(tmp_path, default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["losses"]["arcfase"] = {}
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "download.py"), "--dataset", "glyphs", "--params", str(bad)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "losses.arcfase: unknown loss 'arcfase'; valid:" in lines[0]
    assert not (tmp_path / "artifacts").exists()  # failed before any work


def test_protocol_override_names_a_registered_dataset(default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["protocols"]["demo"]["overrides"] = [{"datasets": ["cub2011"], "set": {"epochs": 3}}]
    message = _error(raw)
    assert "protocols.demo: unknown dataset 'cub2011'; valid:" in message and "cub200" in message
