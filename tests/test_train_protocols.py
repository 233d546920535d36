"""The named protocols of the two studies are in params.yaml, written out in full and valid;
per-dataset/backbone tables resolve per run; bad protocol input fails in one line."""

from __future__ import annotations

import copy

import pytest
import yaml
from helpers.project import ROOT

from dmlbench.errors import ConfigError
from dmlbench.grid import RunSpec
from dmlbench.params.load import parse_params
from dmlbench.params.protocol import Protocol
from dmlbench.params.run import run_config


def _raw():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _error(raw) -> str:
    with pytest.raises(ConfigError) as error:
        parse_params(raw)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_named_protocols_are_fully_written_out():
    raw = _raw()
    assert {"demo", "thesis", "reality_check", "proxy_anchor"} <= set(raw["protocols"])
    for name, protocol in raw["protocols"].items():
        missing = (
            set(Protocol.model_fields)
            - set(protocol)
            # the CPU demos leave their grid open; the published recipes fix everything
            - ({"backbones", "dims", "overrides"} if name in ("demo", "glyphs_pretrained") else set())
        )
        assert not missing, f"protocols.{name} leaves {sorted(missing)} to defaults"
        Protocol.model_validate(protocol)


def _with(protocol: str, backbones: dict, dims: list[int]):
    raw = _raw()
    raw.update(protocol=protocol, backbones=backbones, dims=dims)
    raw["tuning"]["baselines"] = []  # the demo's tuned-vs-published baseline: not these protocols' grids
    return parse_params(raw)


def test_thesis_protocol_resolves_table_3_per_dataset_and_backbone():
    params = _with("thesis", {"resnet50": {}, "bn_inception": {}, "googlenet": {}}, [64, 512])
    thesis = params.protocols["thesis"]
    assert (thesis.optimizer.name, thesis.epochs, thesis.samples_per_class) == ("adamw", 100, 5)
    assert thesis.classification_samples_per_class == "random"
    expected = {  # dataset, backbone: lr, step size, gamma (thesis Table 3), batch 100 / 180
        ("cub200", "resnet50"): (1e-4, 5, 0.1, 100),
        ("cub200", "bn_inception"): (1e-4, 10, 0.1, 180),
        ("cub200", "googlenet"): (1e-4, 10, 0.1, 180),
        ("cars196", "resnet50"): (1e-4, 10, 0.1, 100),
        ("cars196", "bn_inception"): (1e-4, 20, 0.1, 180),
        ("cars196", "googlenet"): (1e-4, 20, 0.1, 180),
        ("sop", "resnet50"): (6e-4, 10, 0.25, 100),
        ("sop", "bn_inception"): (6e-4, 20, 0.25, 180),
        ("sop", "googlenet"): (6e-4, 20, 0.25, 180),
    }
    for (dataset, backbone), values in expected.items():
        p = thesis.for_run(dataset, backbone)
        assert (p.optimizer.lr, p.scheduler.step_size, p.scheduler.gamma, p.batch_size) == values, (dataset, backbone)
    # The resolved (logged, hashed) config of a run holds the resolved values, not the table.
    run = RunSpec("glyphs", "resnet50", "contrastive", 64, 0)
    resolved = run_config(params, run).resolved["protocol"]
    assert resolved["batch_size"] == 100 and "overrides" not in resolved


def test_reality_check_and_proxy_anchor_protocols():
    rc = _with("reality_check", {"bn_inception": {}}, [128]).protocol
    assert (rc.optimizer.name, rc.optimizer.lr, rc.batch_size, rc.iterations_per_epoch) == ("rmsprop", 1e-6, 32, 100)
    assert rc.sampling_for("m_per_class") == 4 and rc.sampling_for("any") == 1  # 8x4 and 32x1
    assert (rc.augment.crop_size, rc.augment.crop_scale, rc.frozen_bn, rc.selection_metric) == (
        227,
        (0.16, 1.0),
        True,
        "map_at_r",
    )
    assert (rc.early_stopping.validate_every, rc.early_stopping.patience) == (2, 9)
    assert rc.for_run("sop", "bn_inception").early_stopping.patience == 39
    pa = _with("proxy_anchor", {"bn_inception": {}}, [512]).protocol
    assert (pa.loss_lr_multiplier, pa.warmup_epochs, pa.pooling, pa.grad_clip) == (100.0, 1, "gap+gmp", 10.0)
    assert pa.for_run("cars196", "bn_inception").scheduler.step_size == 20
    assert pa.for_run("sop", "bn_inception").frozen_bn is False


def test_protocol_errors_are_one_line():
    raw = _raw()
    raw["protocol"] = "reality_check"
    assert "backbones: protocol 'reality_check' trains only bn_inception, not tiny_cnn" in _error(raw)
    raw = _raw()
    raw["protocols"]["demo"]["overrides"] = [{"backbones": ["tiny_cnn"], "set": {"pooling": "gmp"}}]
    assert "cannot override ['pooling']; allowed: epochs" in _error(raw)
    raw["protocols"]["demo"]["overrides"] = [{"set": {"batch_size": 30}}]
    assert "overrides[0]: batch_size (30) must be a multiple of samples_per_class (4)" in _error(raw)
    raw["protocols"]["demo"]["overrides"] = [{"backbones": ["resnet5O"], "set": {"epochs": 2}}]
    assert "protocols.demo: unknown backbone 'resnet5O'" in _error(raw)
    raw = _raw()
    raw["protocols"]["demo"].update(epochs=6, warmup_epochs=6)
    assert "warmup_epochs (6) must be < epochs (6)" in _error(raw)
    raw = _raw()
    raw["protocols"]["demo"]["classification_samples_per_class"] = 3
    assert "multiple of classification_samples_per_class (3)" in _error(raw)


def test_an_override_changes_only_matching_runs_config_hash():
    from dmlbench.params.model import config_hash

    raw = _raw()
    raw["datasets"]["other"] = copy.deepcopy(raw["datasets"]["glyphs"])
    raw["datasets"] = {"glyphs": raw["datasets"]["glyphs"]}
    raw["protocols"]["demo"]["hyperparameters"] = "published"  # no tuning result needed
    raw["tuning"]["baselines"] = []  # nothing to compare a published grid with
    base = parse_params(raw)
    raw["protocols"]["demo"]["overrides"] = [{"datasets": ["cub200"], "set": {"epochs": 3}}]
    changed = parse_params(raw)
    run = RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0)
    assert config_hash(run_config(base, run).resolved) == config_hash(run_config(changed, run).resolved)
    raw["protocols"]["demo"]["overrides"] = [{"datasets": ["glyphs"], "set": {"epochs": 3}}]
    assert run_config(parse_params(raw), run).resolved["protocol"]["epochs"] == 3


def test_the_loss_parameters_optimiser_follows_param_lr_then_the_protocol():
    """RC publishes absolute "proxy lr"s with no weight decay on Margin's beta; Proxy-Anchor's
    recipe multiplies the protocol lr; the thesis's Table 4 lrs are multipliers of its lr."""
    import torch

    from dmlbench.grid import Combo
    from dmlbench.losses import LOSSES
    from dmlbench.train.optim import make_loss_optimizer

    raw = _raw()
    raw.update(protocol="reality_check", backbones={"bn_inception": {}}, dims=[128])
    raw["tuning"]["baselines"] = []
    raw["datasets"] = {"cub200": {"source": {}}}
    raw["losses"] = {"proxy_nca": {}, "margin": {}, "soft_triple": {}}
    params = parse_params(raw)

    def optimiser(name):
        combo = Combo("cub200", "bn_inception", name, 128)
        loss_params = params.loss_params(combo)
        loss = LOSSES[name].build(loss_params, 4, 8)
        return make_loss_optimizer(params.protocol_for(combo), loss_params, loss.parameters())

    proxy_nca, margin = optimiser("proxy_nca"), optimiser("margin")
    assert isinstance(proxy_nca, torch.optim.RMSprop)
    group = proxy_nca.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["momentum"]) == (6.04e-3, 1e-4, 0.9)
    group = margin.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["momentum"]) == (1.31e-3, 0.0, 0.9)
    # Proxy-Anchor recipe: 100 x 1e-4; thesis: ProxyNCA's Table 4 multiplier 0.1 x 1e-4
    pa = _with("proxy_anchor", {"bn_inception": {}}, [512])
    combo = Combo("glyphs", "bn_inception", "contrastive", 512)
    proxies = LOSSES["proxy_nca"].build(LOSSES["proxy_nca"].params(), 4, 8).parameters()
    lr = make_loss_optimizer(pa.protocol_for(combo), LOSSES["proxy_nca"].params(), proxies).param_groups[0]["lr"]
    assert lr == pytest.approx(1e-2)
    thesis = _with("thesis", {"bn_inception": {}}, [512])
    proxies = LOSSES["proxy_nca"].build(LOSSES["proxy_nca"].params(), 4, 8).parameters()
    lr = make_loss_optimizer(thesis.protocol_for(combo), LOSSES["proxy_nca"].params(), proxies).param_groups[0]["lr"]
    assert lr == pytest.approx(1e-5)
