"""The learning rate of a loss's own parameters (proxies, class weights, Margin's beta).

Thesis Table 4 (Psomas 2020) gives absolute rates: ProxyNCA "proxy lr 0.00001", Margin "beta lr
0.00005", ArcFace "weights lr 0.0001", SoftTriple "weights lr 0.0001"; so under the thesis
protocol they are the same on SOP (base lr 6e-4, Table 3) as on CUB200 (1e-4). Proxy-Anchor's
proxies train at 100 x the lr (a multiplier: the official code, tjddus9597/Proxy-Anchor-CVPR2020
code/train.py), as does the thesis's own loss (its code). The Reality Check's tuned "proxy lr"s
are absolute values the protocol gives, and a protocol's ``loss_lr_multiplier`` (the Proxy-Anchor
recipe) applies to every loss whose lr is not given."""

from __future__ import annotations

import pytest
import yaml
from helpers.project import ROOT
from pydantic import ValidationError

from dmlbench.grid import RunSpec
from dmlbench.losses import LOSSES
from dmlbench.params.load import parse_params
from dmlbench.params.run import run_config
from dmlbench.train.optim import make_loss_optimizer

TABLE_4 = {  # loss: absolute lr of its parameters (thesis Table 4; Margin per class as Margin's beta)
    "proxy_nca": 1e-5,
    "margin": 5e-5,
    "margin_per_class": 5e-5,
    "arcface": 1e-4,
    "soft_triple": 1e-4,
}
MULTIPLIERS = {  # loss: x the protocol lr (sources with no absolute value)
    "proxy_anchor": 100.0,  # Proxy-Anchor's official code; thesis Table 4 gives no proxy lr
    "thesis_proxy": 100.0,  # the thesis code's own loss (ch. 6)
    "cosface": 1.0,  # not in the thesis: the protocol lr
    "subcenter_arcface": 100.0,  # not in the thesis: class proxies at a proxy's lr, as Proxy-Anchor's
    "normalized_softmax": 1.0,
}
PARAMETRIC = sorted(name for name, spec in LOSSES.items() if spec.has_parameters)


def _params(protocol: str, datasets: list[str], backbones: list[str], dims: list[int], losses=PARAMETRIC, **extra):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(protocol=protocol, dims=dims, seeds=[0])
    raw["datasets"] = {name: {"source": {}} for name in datasets}
    raw["backbones"] = {name: {} for name in backbones}
    raw["losses"] = {name: extra.get(name, {}) for name in losses}
    raw["tuning"]["baselines"] = []
    raw["protocols"][protocol]["hyperparameters"] = "published"  # the protocol's values, no tune stage
    return parse_params(raw)


def _loss_lr(params, dataset: str, backbone: str, loss: str, dim: int) -> tuple[float, float]:
    """(protocol lr, lr of the loss optimiser) of a run, built as training builds them."""
    config = run_config(params, RunSpec(dataset, backbone, loss, dim, 0))
    module = config.loss_spec.build(config.loss_params, 4, dim)
    optimiser = make_loss_optimizer(config.protocol, config.loss_params, module.parameters())
    (group,) = optimiser.param_groups
    return config.protocol.optimizer.lr, group["lr"]


def test_every_loss_with_parameters_has_a_sourced_lr():
    assert set(TABLE_4) | set(MULTIPLIERS) == set(PARAMETRIC) and not set(TABLE_4) & set(MULTIPLIERS)


@pytest.fixture(scope="module")
def thesis():
    return _params("thesis", ["cub200", "sop"], ["resnet50", "bn_inception"], [512])


@pytest.mark.parametrize("backbone", ["resnet50", "bn_inception"])
@pytest.mark.parametrize("loss", sorted(TABLE_4))
def test_the_thesis_protocol_gives_table_4s_absolute_lr_on_sop_and_cub(thesis, loss, backbone):
    assert _loss_lr(thesis, "sop", backbone, loss, 512) == pytest.approx((6e-4, TABLE_4[loss]))  # Table 3: 6e-4
    assert _loss_lr(thesis, "cub200", backbone, loss, 512) == pytest.approx((1e-4, TABLE_4[loss]))


@pytest.mark.parametrize("loss", sorted(MULTIPLIERS))
def test_the_thesis_protocol_keeps_the_multipliers_the_sources_give(thesis, loss):
    assert _loss_lr(thesis, "sop", "resnet50", loss, 512) == pytest.approx((6e-4, 6e-4 * MULTIPLIERS[loss]))
    assert _loss_lr(thesis, "cub200", "resnet50", loss, 512) == pytest.approx((1e-4, 1e-4 * MULTIPLIERS[loss]))


def test_the_reality_checks_tuned_lrs_stay_absolute():
    """RC's per-dataset "lr" of each loss's RMSprop (params.yaml protocols.reality_check.overrides)."""
    params = _params("reality_check", ["cub200", "sop"], ["bn_inception"], [128])
    expected = {
        ("cub200", "proxy_nca"): 6.04e-3,
        ("cub200", "margin"): 1.31e-3,
        ("cub200", "margin_per_class"): 2.65e-4,
        ("cub200", "arcface"): 5.13e-3,
        ("cub200", "soft_triple"): 5.37e-5,
        ("sop", "proxy_nca"): 5.28e-4,
        ("sop", "arcface"): 2.01e-3,
        ("sop", "soft_triple"): 8.68e-5,
        ("cub200", "proxy_anchor"): 1e-6 * 100,  # RC did not run it: its default multiplier
    }
    for (dataset, loss), lr in expected.items():
        assert _loss_lr(params, dataset, "bn_inception", loss, 128) == pytest.approx((1e-6, lr)), (dataset, loss)


def test_a_protocol_multiplier_replaces_the_defaults_but_not_a_given_lr():
    """The Proxy-Anchor recipe: every loss's parameters at 100 x lr, unless params.yaml gives param_lr."""
    given = {"arcface": {"param_lr": 3e-3}}
    params = _params("proxy_anchor", ["cub200"], ["bn_inception"], [512], ["proxy_nca", "arcface"], **given)
    assert _loss_lr(params, "cub200", "bn_inception", "proxy_nca", 512) == pytest.approx((1e-4, 1e-2))
    assert _loss_lr(params, "cub200", "bn_inception", "arcface", 512) == pytest.approx((1e-4, 3e-3))


def test_the_demo_proxy_anchor_lr_is_unchanged():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["protocols"]["demo"]["hyperparameters"] = "published"  # trial 0 of its search
    raw["tuning"]["baselines"] = []
    params = parse_params(raw)
    assert _loss_lr(params, "glyphs", "tiny_cnn", "proxy_anchor", 32) == pytest.approx((2e-3, 2e-2))  # 10 x lr


def test_a_given_multiplier_replaces_a_default_absolute_lr():
    model = LOSSES["proxy_nca"].params
    assert model().optimizer_lr(6e-4, None) == 1e-5  # Table 4's default
    assert model(param_lr_multiplier=0.5).optimizer_lr(6e-4, None) == pytest.approx(3e-4)
    assert model(param_lr_multiplier=0.5).param_lr is None  # what the tuner reads as "no absolute lr"
    assert model(param_lr=2e-3).optimizer_lr(6e-4, 100.0) == 2e-3  # a given lr beats a protocol multiplier
    assert model(param_lr=None).optimizer_lr(6e-4, None) == pytest.approx(6e-4)  # x the default multiplier 1
    with pytest.raises(ValidationError, match="not both"):
        model(param_lr=2e-3, param_lr_multiplier=0.5)


def test_tuning_starts_from_the_lr_that_trains():
    """Trial 0's param_lr (tune.space.published_point) is the published values' effective lr."""
    from dmlbench.tune.space import published_point

    cases = [
        ("proxy_nca", {}, None, 1e-5),
        ("proxy_nca", {"param_lr_multiplier": 0.5}, None, 3e-4),
        ("proxy_nca", {}, 100.0, 6e-2),  # a protocol multiplier beats the module's default absolute lr
        ("proxy_nca", {"param_lr": 2e-3}, 100.0, 2e-3),  # and a given lr beats the protocol's multiplier
    ]
    for loss, values, protocol_multiplier, lr in cases:
        published = LOSSES[loss].params(**values)
        point = published_point(LOSSES[loss].search_space, published, published.optimizer_lr(6e-4, protocol_multiplier))
        assert point["param_lr"] == pytest.approx(lr), (values, protocol_multiplier)
