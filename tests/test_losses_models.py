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
    assert spec.has_parameters == bool(owns), "ParametricLossParams (has_parameters) must match the module"


def test_the_losses_of_both_studies_are_registered():
    thesis = {"contrastive", "triplet", "lifted_structure", "npair", "proxy_nca", "arcface", "margin"}
    thesis |= {"multi_similarity", "soft_triple", "proxy_anchor", "thesis_proxy"}
    reality_check = {"contrastive", "triplet", "ntxent", "proxy_nca", "margin", "normalized_softmax", "cosface"}
    reality_check |= {"arcface", "fastap", "snr", "multi_similarity", "soft_triple"}
    reality_check |= {"multi_similarity_without_miner", "margin_per_class"}
    assert thesis | reality_check | {"circle"} <= set(LOSSES)


def test_losses_declare_thesis_table_5_miners():
    from pytorch_metric_learning import miners

    def miner(name):
        return LOSSES[name].miner(LOSSES[name].params())

    assert isinstance(miner("triplet"), miners.TripletMarginMiner) and miner("triplet").type_of_triplets == "semihard"
    assert isinstance(miner("lifted_structure"), miners.MultiSimilarityMiner)  # "hard" pairs, thesis code
    assert isinstance(miner("margin"), miners.DistanceWeightedMiner)
    assert isinstance(miner("multi_similarity"), miners.MultiSimilarityMiner)
    for name in ("contrastive", "npair", "proxy_nca", "arcface", "soft_triple", "proxy_anchor", "thesis_proxy"):
        assert miner(name) is None, name


def test_losses_declare_table_4_defaults_and_what_they_need():
    defaults = {name: spec.params() for name, spec in LOSSES.items()}
    assert defaults["contrastive"].neg_margin == 0.5 and defaults["triplet"].margin == 0.1
    assert defaults["lifted_structure"].neg_margin == 0.5 and defaults["npair"].l2_reg_weight == 0.02
    assert (defaults["margin"].margin, defaults["margin"].beta) == (0.5, 1.2)
    assert (defaults["arcface"].margin, defaults["arcface"].scale) == (28.6, 64.0)
    ms = defaults["multi_similarity"]
    assert (ms.alpha, ms.beta, ms.base, ms.miner_epsilon) == (2.0, 50.0, 0.5, 0.1)
    st = defaults["soft_triple"]
    assert (st.la, 1 / st.gamma, st.tau, st.margin) == (20.0, 10.0, 0.2, 0.1)
    assert (defaults["proxy_anchor"].margin, defaults["proxy_anchor"].alpha) == (0.1, 32.0)
    # Own learning rates under a base lr of 6e-4 (thesis SOP): Table 4's are absolute (ProxyNCA
    # proxies 1e-5, Margin beta 5e-5, ArcFace and SoftTriple weights 1e-4); Proxy-Anchor's proxies
    # x100 (its code) and so Sub-center ArcFace's sub-centres, the others x1 (tests/test_loss_lr.py: the
    # optimisers training builds).
    lr = {name: p.optimizer_lr(6e-4, None) for name, p in defaults.items() if isinstance(p, ParametricLossParams)}
    assert lr == pytest.approx(
        {
            "proxy_nca": 1e-5,
            "margin": 5e-5,
            "margin_per_class": 5e-5,
            "arcface": 1e-4,
            "cosface": 6e-4,
            "soft_triple": 1e-4,
            "proxy_anchor": 6e-2,
            "normalized_softmax": 6e-4,
            "thesis_proxy": 6e-2,
            "subcenter_arcface": 6e-2,
        }
    )
    pair_losses = {"contrastive", "triplet", "lifted_structure", "npair", "margin", "multi_similarity"}
    pair_losses |= {"circle", "ntxent", "fastap", "snr", "margin_per_class", "multi_similarity_without_miner"}
    pair_losses |= {"smooth_ap", "supcon", "tuplet_margin", "hyp_vit_sphere"}
    assert {name for name, spec in LOSSES.items() if spec.sampler == "m_per_class"} == pair_losses
    margin = LOSSES["margin"].build(defaults["margin"], 5, 8)
    assert margin.learn_beta and isinstance(margin.beta, torch.nn.Parameter) and margin.beta.numel() == 1
    per_class = LOSSES["margin_per_class"].build(defaults["margin_per_class"], 5, 8)
    assert per_class.learn_beta and per_class.beta.numel() == 5


def test_the_reality_checks_miner_free_variants():
    """RC's "MS" (no miner) beside "MS+Miner", Margin / class, and Triplet / Margin with
    ``miner: false``: the same loss module, every pair or triplet of the batch."""
    from pytorch_metric_learning import losses, miners

    def built(name, **values):
        spec = LOSSES[name]
        params = spec.params(**values)
        return spec.build(params, 5, 8), spec.miner(params)

    ms, ms_miner = built("multi_similarity_without_miner")
    assert isinstance(ms, losses.MultiSimilarityLoss) and ms_miner is None
    assert isinstance(built("multi_similarity")[1], miners.MultiSimilarityMiner)
    for name in ("triplet", "margin"):
        assert built(name)[1] is not None and built(name, miner=False)[1] is None
    assert built("margin_per_class")[1] is None
    assert isinstance(built("margin_per_class", miner=True)[1], miners.DistanceWeightedMiner)
    # MS without miner = MS loss on all pairs: equal to the mined loss when the miner keeps every pair
    torch.manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(12, 8, dtype=torch.float64), dim=1)
    y = torch.arange(3).repeat_interleave(4)
    wide = LOSSES["multi_similarity"].params(miner_epsilon=10.0)
    mined = LOSSES["multi_similarity"].build(wide, 3, 8)(x, y, LOSSES["multi_similarity"].miner(wide)(x, y))
    torch.testing.assert_close(ms(x, y), mined)


def _thesis_code_lifted(x, labels, alpha=40.0, beta=2.0, eps=0.1):
    """The thesis code's loop (billpsomas/deep_metric_learning_benchmark, losses.py), re-written:
    per anchor, sorted positives/negatives, hard mining with eps, skipped anchors count in n."""
    import math

    n, total = len(x), 0.0
    sim = [[sum(a * b for a, b in zip(x[i], x[j], strict=True)) for j in range(n)] for i in range(n)]
    for i in range(n):
        pos = sorted(sim[i][j] for j in range(n) if labels[j] == labels[i] and j != i)
        neg = sorted(sim[i][j] for j in range(n) if labels[j] != labels[i])
        neg_kept = [s for s in neg if s + eps > pos[0]]
        pos_kept = [s for s in pos if s - eps < neg[-1]]
        if not neg_kept or not pos_kept:
            continue
        total += 2 / beta * math.log(sum(math.exp(-beta * s) for s in pos_kept))
        total += 2 / alpha * math.log(sum(math.exp(alpha * s) for s in neg_kept))
    return total / n


def test_lifted_structure_thesis_code_formulation_matches_the_thesis_loop():
    from pytorch_metric_learning import losses

    from dmlbench.losses._impl.lifted_structure import ThesisLiftedStructureLoss

    spec = LOSSES["lifted_structure"]
    assert isinstance(spec.build(spec.params(), 4, 8), losses.LiftedStructureLoss)  # every other protocol
    params = spec.params(formulation="thesis_code")
    loss, miner = spec.build(params, 4, 8), spec.miner(params)
    assert isinstance(loss, ThesisLiftedStructureLoss) and isinstance(miner, type(spec.miner(spec.params())))
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.nn.functional.normalize(torch.randn(16, 8, dtype=torch.float64), dim=1)
        y = torch.arange(4).repeat_interleave(4)[torch.randperm(16)]
        expected = _thesis_code_lifted(x.tolist(), y.tolist())
        assert loss(x, y, miner(x, y)).item() == pytest.approx(expected, rel=1e-12)
    # an anchor whose mined sets are empty adds 0 but counts in the mean: two far-apart classes
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1])
    assert loss(x, y, miner(x, y)).item() == 0.0
    with pytest.raises(ValueError, match="alpha is not a parameter of formulation 'pml'"):
        spec.params(alpha=30.0)


def _thesis_loss_by_hand(x, labels, proxies, alpha, margin, variant):
    """Eq. 6.1/6.2 with plain Python loops over cosine similarities."""
    import math

    def cos(a, b):
        return sum(i * j for i, j in zip(a, b, strict=True)) / math.sqrt(sum(i * i for i in a) * sum(j * j for j in b))

    classes = range(len(proxies))
    positive = [c for c in classes if c in labels]
    pos = sum(
        math.log(
            1
            + sum(math.exp(-alpha * (cos(proxies[c], xi) - margin)) for xi, y in zip(x, labels, strict=True) if y == c)
        )
        for c in positive
    ) / len(positive)

    def proxy_sim(c, d):
        if variant == 1:
            return cos(proxies[c], proxies[d])
        return sum(cos(proxies[c], xi) * cos(xi, proxies[d]) for xi in x)

    neg = sum(
        math.log(1 + sum(math.exp(alpha * (proxy_sim(c, d) + margin)) for d in classes if d != c)) for c in classes
    ) / len(proxies)
    return pos + neg


@pytest.mark.parametrize("variant", [1, 2])
def test_thesis_proxy_loss_matches_hand_computed_values(variant):
    """Eq. 6.1/6.2 on a small example: a literal value and a loop-by-loop re-computation."""
    from pytorch_metric_learning.losses import BaseMetricLossFunction

    from dmlbench.losses._impl.thesis_proxy import ThesisProxyLoss

    loss = LOSSES["thesis_proxy"].build(LOSSES["thesis_proxy"].params(alpha=1.0, margin=0.1, variant=variant), 2, 2)
    assert isinstance(loss, ThesisProxyLoss) and isinstance(loss, BaseMetricLossFunction)
    with torch.no_grad():
        loss.proxies.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    labels = torch.tensor([0, 1, 0])
    # By hand: positives log(1 + e^-0.9 + e^-0.5) for proxy 0, log(1 + e^-0.9) for proxy 1, averaged;
    # negatives: w0.w1 = 0 (6.1) or sum_x (w0.x)(x.w1) = 0.6 * 0.8 = 0.48 (6.2), plus margin 0.1.
    expected = {1: 1.2648116, 2: 1.5450356}[variant]
    assert loss(x, labels).item() == pytest.approx(expected, abs=1e-6)

    torch.manual_seed(variant)
    x = torch.nn.functional.normalize(torch.randn(7, 3), dim=1)
    labels = torch.tensor([0, 0, 2, 2, 2, 3, 0])
    loss = LOSSES["thesis_proxy"].build(LOSSES["thesis_proxy"].params(alpha=4.0, margin=0.2, variant=variant), 5, 3)
    by_hand = _thesis_loss_by_hand(x.tolist(), labels.tolist(), loss.proxies.tolist(), 4.0, 0.2, variant)
    assert loss(x, labels).item() == pytest.approx(by_hand, rel=1e-5)
    # Stable where the naive formula overflows (alpha 32, sums over a batch): finite, with gradients.
    big = LOSSES["thesis_proxy"].build(LOSSES["thesis_proxy"].params(alpha=500.0), 5, 3)
    value = big(x.requires_grad_(), labels)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(x.grad).all() and torch.isfinite(big.proxies.grad).all()


@pytest.mark.parametrize("name", [*sorted(set(BACKBONES) - {"timm"}), "timm_test_resnet"])
def test_backbone_builds_and_embeds(name):
    spec = BACKBONES[name]
    pooling = "native" if name == "clip_vitb16" else "gap+gmp"  # CLIP's projection embeds the class token
    model = build_model(name, spec.params(), dim=24, pooling=pooling)
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


@pytest.mark.parametrize("doc, heading", [("README.md", "## How to extend"), ("docs/extending.md", "## Adding a loss")])
def test_readme_example_loss_works(tmp_path, monkeypatch, doc, heading):
    """The "Adding a loss" example of the README and docs/extending.md is real code: it builds and trains a step."""
    import importlib.util
    import re

    from helpers.project import ROOT

    readme = (ROOT / doc).read_text()
    section = readme.split(heading)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    module_path = tmp_path / "angular.py"
    module_path.write_text(code)
    spec = importlib.util.spec_from_file_location("readme_angular", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    entry = module.SPEC
    assert entry.name == "angular" and not entry.has_parameters
    assert "angular" not in LOSSES  # an example of adding one, not a registered loss
    assert entry.params().alpha == 40.0
    loss = entry.build(entry.params(), 4, 8)
    embeddings = torch.nn.functional.normalize(torch.randn(16, 8, requires_grad=True), dim=1)
    value = loss(embeddings, torch.arange(4).repeat_interleave(4))
    assert torch.isfinite(value)
    value.backward()
