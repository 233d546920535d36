"""params.yaml validation: bad input fails in one line naming the key and what is allowed."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.project import ROOT

from dmlbench.data import DATASETS
from dmlbench.errors import ConfigError
from dmlbench.grid import Combo, RunSpec
from dmlbench.losses import LOSSES
from dmlbench.models import BACKBONES
from dmlbench.params.load import load_params, parse_params
from dmlbench.params.model import config_hash, flatten
from dmlbench.params.run import run_config


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
    assert "protocol: 'thesis_v2' is not a key of protocols; valid: berton2025, demo, " in _error(raw)

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
    resolved = run_config(small_params, run).resolved
    assert resolved["loss"]["name"] == run.loss and resolved["protocol"]["epochs"] == 2
    assert config_hash(resolved) == config_hash(copy.deepcopy(resolved))
    other = run_config(
        small_params, RunSpec(run.dataset, run.backbone, run.loss, run.dim, small_params.seeds[1])
    ).resolved
    assert config_hash(other) != config_hash(resolved)
    assert flatten({"a": {"b": 1, "c": [1, 2]}}) == {"a.b": 1, "a.c": [1, 2]}
    with pytest.raises(ConfigError, match="dims: 999 is not in params.yaml"):
        small_params.check_run(Combo("glyphs", "tiny_cnn", run.loss, 999))


def _stage(script: str, params_file: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "stages" / script), "--params", str(params_file), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )


def test_stage_prints_one_line_and_exits_2(tmp_path, default_raw_params):
    """A typo anywhere fails the validate stage (which every other stage follows) in one line; a
    data stage reads its dataset's section alone, and a typo there fails it in one line too."""
    raw = copy.deepcopy(default_raw_params)
    raw["losses"]["arcfase"] = {}
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(raw))
    result = _stage("validate.py", bad, tmp_path, "--out", str(tmp_path / "artifacts" / "params.validated"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "losses.arcfase: unknown loss 'arcfase'; valid:" in lines[0]
    assert not (tmp_path / "artifacts").exists()  # failed before any work
    raw = copy.deepcopy(default_raw_params)
    raw["datasets"]["glyphs"]["source"]["num_clases"] = 10
    bad.write_text(yaml.safe_dump(raw))
    result = _stage("download.py", bad, tmp_path, "--dataset", "glyphs")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "datasets.glyphs.source.num_clases" in lines[0]
    assert not (tmp_path / "artifacts").exists()
    raw["tuning"] = {"sampler": "annealing"}  # the validate stage checks the tuning section as well
    raw["datasets"]["glyphs"]["source"].pop("num_clases")
    bad.write_text(yaml.safe_dump(raw))
    result = _stage("validate.py", bad, tmp_path, "--out", str(tmp_path / "artifacts" / "params.validated"))
    assert result.returncode == 2 and "tuning.sampler" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_protocol_override_names_a_registered_dataset(default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["protocols"]["demo"]["overrides"] = [{"datasets": ["cub2011"], "set": {"epochs": 3}}]
    message = _error(raw)
    assert "protocols.demo: unknown dataset 'cub2011'; valid:" in message and "cub200" in message


def _reality_check_methods() -> list[str]:
    """The 14 methods of the Reality Check's tables (literature.csv), as registry names."""
    from dmlbench.analysis import literature as lit

    rows = lit.load_literature()
    rc = rows[(rows["paper"] == lit.REALITY_CHECK) & (rows["setting"] == "rc_concatenated")]
    return sorted(set(rc["loss"]) - {"pretrained"})


RC_METHODS = _reality_check_methods()


def _protocol_grid(raw: dict, protocol: str, datasets: list[str], backbone: str, dim: int, losses) -> dict:
    raw = copy.deepcopy(raw)
    raw.update(protocol=protocol, backbones={backbone: {}}, dims=[dim])
    raw["tuning"]["baselines"] = []  # the demo's tuned-vs-published baseline (at its own dim)
    raw["datasets"] = {name: {"source": {}} for name in datasets}
    raw["losses"] = {name: {} for name in losses}
    return raw


def test_reality_check_protocol_carries_rcs_tuned_losses_per_dataset(default_raw_params):
    """protocols.reality_check.losses / overrides hold RC's published optimum per dataset
    (powerful-benchmarker docs/papers/mlrc.md); losses RC did not run keep their defaults."""
    raw = _protocol_grid(default_raw_params, "reality_check", ["cub200", "cars196"], "bn_inception", 128, RC_METHODS)
    raw["losses"]["lifted_structure"] = {}
    raw["protocols"]["reality_check"]["hyperparameters"] = "published"  # RC's best values, not a new search
    raw["tuning"]["baselines"] = []  # nothing to compare a published grid with
    params = parse_params(raw)

    def loss(dataset, name):
        return params.loss_params(Combo(dataset, "bn_inception", name, 128))

    assert (loss("cub200", "contrastive").pos_margin, loss("cub200", "contrastive").neg_margin) == (-0.2, 0.3841)
    assert (loss("cars196", "contrastive").pos_margin, loss("cars196", "contrastive").neg_margin) == (0.2652, 0.5409)
    assert loss("cub200", "proxy_nca").param_lr == 6.04e-3 and loss("cars196", "arcface").param_lr == 7.39e-6
    assert not loss("cub200", "triplet").miner and not loss("cub200", "margin").miner
    assert loss("cub200", "multi_similarity").miner_epsilon == 0.39
    assert LOSSES["multi_similarity_without_miner"].miner(loss("cub200", "multi_similarity_without_miner")) is None
    assert loss("cub200", "lifted_structure") == LOSSES["lifted_structure"].params()
    combo = Combo("cub200", "bn_inception", "lifted_structure", 128)
    assert params.loss_source(combo) == "defaults"
    assert params.loss_source(Combo("cub200", "bn_inception", "snr", 128)) == "protocol"
    # what a run trains with is what it logs and hashes
    run = RunSpec("cars196", "bn_inception", "soft_triple", 128, 0)
    assert run_config(params, run).resolved["loss"] == {
        "name": "soft_triple",
        **loss("cars196", "soft_triple").model_dump(),
    }
    other = RunSpec("cub200", "bn_inception", "soft_triple", 128, 0)
    assert config_hash(run_config(params, run).resolved) != config_hash(run_config(params, other).resolved)


def test_thesis_protocol_trains_the_thesis_codes_lifted_structure(default_raw_params):
    raw = _protocol_grid(default_raw_params, "thesis", ["cub200"], "resnet50", 512, ["lifted_structure", "triplet"])
    params = parse_params(raw)
    assert params.loss_params(Combo("cub200", "resnet50", "lifted_structure", 512)).formulation == "thesis_code"
    assert params.loss_params(Combo("cub200", "resnet50", "triplet", 512)) == LOSSES["triplet"].params()
    demo = parse_params(default_raw_params)
    assert demo.loss_params(Combo("glyphs", "tiny_cnn", "proxy_anchor", 32)).param_lr_multiplier == 10.0


def test_loss_values_merge_defaults_then_protocol_then_params(default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["losses"]["proxy_anchor"] = {"alpha": 16.0}  # a key the demo protocol does not set
    params = parse_params(raw)
    combo = Combo("glyphs", "tiny_cnn", "proxy_anchor", 32)
    values = params.loss_params(combo)
    assert (values.alpha, values.param_lr_multiplier, values.margin) == (16.0, 10.0, 0.1)
    assert (
        params.loss_source(combo) == "protocol"
        and params.loss_source(Combo("glyphs", "tiny_cnn", "triplet", 32)) == "defaults"
    )


def test_a_key_the_protocol_sets_cannot_be_silently_replaced(default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["losses"]["proxy_anchor"] = {"param_lr_multiplier": 100.0}
    message = _error(raw)
    assert message == (
        "params.yaml: losses.proxy_anchor.param_lr_multiplier: protocol 'demo' sets it to 10.0 for glyphs/tiny_cnn; "
        "remove it here, or edit protocols.demo to deviate from the protocol knowingly"
    )


def test_protocol_loss_tables_are_validated_against_the_registry(default_raw_params):
    raw = copy.deepcopy(default_raw_params)
    raw["protocols"]["demo"]["losses"]["tripplet"] = {"margin": 0.2}
    message = _error(raw)
    assert "protocols.demo.losses.tripplet: unknown loss 'tripplet'; valid:" in message and "triplet" in message

    raw = copy.deepcopy(default_raw_params)
    raw["protocols"]["reality_check"]["overrides"][1]["set"]["losses"]["cosface"]["scale"] = -3
    message = _error(raw)
    assert message.startswith("params.yaml: protocols.reality_check.overrides[1].set.losses.cosface.scale:")
    assert "greater than 0" in message and "(got -3)" in message

    raw = copy.deepcopy(default_raw_params)
    raw["protocols"]["thesis"]["losses"]["lifted_structure"]["alpha"] = 30.0  # belongs to thesis_code: fine
    parse_params(raw)
    raw["protocols"]["thesis"]["losses"]["lifted_structure"]["formulation"] = "pml"
    message = _error(raw)
    assert "protocols.thesis.losses.lifted_structure: alpha is not a parameter of formulation 'pml'" in message

    raw = copy.deepcopy(default_raw_params)
    raw["protocols"]["demo"]["losses"]["proxy_anchor"] = {"param_lr": 0.01, "param_lr_multiplier": 10.0}
    assert "set param_lr (absolute) or param_lr_multiplier (x the protocol lr), not both" in _error(raw)

    raw = copy.deepcopy(default_raw_params)
    raw["losses"]["contrastive"] = {"pos_margin": 0.6}
    assert "losses.contrastive: pos_margin (0.6) must be < neg_margin (0.5)" in _error(raw)
