"""Loss and backbone registries: every entry builds, trains a step, and declares what it needs."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from dmlbench.losses import LOSSES
from dmlbench.losses.base import ParametricLossParams
from dmlbench.models import BACKBONES, build_model
from dmlbench.models.embedding import GlobalPool


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_entry_builds_and_backpropagates(name):
    spec = LOSSES[name]
    params = spec.params()
    # A loss lives in losses/<name>.py, which DVC tracks per loss.
    assert Path(inspect.getsourcefile(spec.build)).stem == name
    loss = spec.build(params, 6, 16)
    torch.manual_seed(0)
    embeddings = torch.nn.functional.normalize(torch.randn(24, 16, requires_grad=True), dim=1)
    labels = torch.arange(6).repeat_interleave(4)
    miner = spec.miner(params)
    value = loss(embeddings, labels, miner(embeddings, labels) if miner is not None else None)
    assert torch.isfinite(value) and value.item() > 0
    value.backward()
    owns = [p for p in loss.parameters() if p.requires_grad]
    assert spec.has_parameters == bool(owns), "has_parameters must match the module"
    assert spec.has_parameters == isinstance(params, ParametricLossParams)


def test_demo_losses_declare_thesis_miners():
    from pytorch_metric_learning import miners

    assert isinstance(LOSSES["triplet"].miner(LOSSES["triplet"].params()), miners.TripletMarginMiner)
    assert LOSSES["triplet"].miner(LOSSES["triplet"].params()).type_of_triplets == "semihard"
    assert isinstance(
        LOSSES["multi_similarity"].miner(LOSSES["multi_similarity"].params()), miners.MultiSimilarityMiner
    )
    assert LOSSES["contrastive"].miner(LOSSES["contrastive"].params()) is None
    assert LOSSES["proxy_anchor"].has_parameters and LOSSES["proxy_anchor"].sampler == "any"


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_backbone_builds_and_embeds(name):
    spec = BACKBONES[name]
    model = build_model(name, spec.params(), dim=24, pooling="gap+gmp")
    out = model(torch.rand(3, 3, 32, 32))
    assert out.shape == (3, 24)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(3))


def test_pooling_and_frozen_batchnorm():
    features = torch.arange(8.0).view(1, 2, 2, 2)
    torch.testing.assert_close(GlobalPool("gap")(features), torch.tensor([[1.5, 5.5]]))
    torch.testing.assert_close(GlobalPool("gmp")(features), torch.tensor([[3.0, 7.0]]))
    torch.testing.assert_close(GlobalPool("gap+gmp")(features), torch.tensor([[4.5, 12.5]]))

    model = build_model("tiny_cnn", BACKBONES["tiny_cnn"].params(width=8), dim=8, frozen_bn=True)
    model.train()
    bn = model.batchnorm_layers()
    assert bn and all(not layer.training for layer in bn)
    assert all(not p.requires_grad for layer in bn for p in layer.parameters())
    before = bn[0].running_mean.clone()
    model(torch.rand(4, 3, 32, 32)).sum().backward()
    torch.testing.assert_close(bn[0].running_mean, before)  # statistics not updated


def test_tiny_cnn_has_no_pretrained_weights():
    from dmlbench.errors import ConfigError

    with pytest.raises(ConfigError, match="pretrained: false"):
        build_model("tiny_cnn", BACKBONES["tiny_cnn"].params(), dim=8, pretrained=True)


def test_readme_example_loss_works(tmp_path, monkeypatch):
    """The "Adding a loss" example in README.md is real code: it builds and trains a step."""
    import importlib.util
    import re

    from conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Adding a loss")[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    module_path = tmp_path / "circle.py"
    module_path.write_text(code)
    spec = importlib.util.spec_from_file_location("readme_circle", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    entry = module.SPEC
    assert entry.name == "circle" and not entry.has_parameters
    loss = entry.build(entry.params(), 4, 8)
    embeddings = torch.nn.functional.normalize(torch.randn(16, 8, requires_grad=True), dim=1)
    value = loss(embeddings, torch.arange(4).repeat_interleave(4))
    assert torch.isfinite(value)
    value.backward()
