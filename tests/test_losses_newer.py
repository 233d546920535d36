"""The newer losses: Smooth-AP, SupCon, Tuplet Margin, Sub-center ArcFace.

Each is finite, decreases on a toy problem, matches a value computed by hand from its paper's
equation, takes batches the project's sampler can give it, and (Sub-center ArcFace) trains its
own parameters with the optimiser training builds for them."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dmlbench.errors import ConfigError
from dmlbench.losses import LOSSES
from dmlbench.losses.search import check_space, grid_points

NEW = ["smooth_ap", "supcon", "tuplet_margin", "subcenter_arcface"]


def _unit(*degrees: float) -> torch.Tensor:
    """2-D unit embeddings at the given angles (PML's tests' angle_to_coord), float64."""
    return torch.tensor([[math.cos(math.radians(d)), math.sin(math.radians(d))] for d in degrees], dtype=torch.float64)


def _cos(a: float, b: float) -> float:
    return math.cos(math.radians(a - b))


def _build(name: str, num_classes: int = 4, dim: int = 2, **values):
    spec = LOSSES[name]
    return spec.build(spec.params(**values), num_classes, dim)


# --------------------------------------------------------------------------- every new loss


def test_the_new_losses_are_registered_with_what_they_need():
    for name in NEW:
        spec = LOSSES[name]
        assert spec.miner(spec.params()) is None, name
    assert {name: LOSSES[name].sampler for name in NEW} == {
        "smooth_ap": "m_per_class",
        "supcon": "m_per_class",
        "tuplet_margin": "m_per_class",
        "subcenter_arcface": "any",
    }
    assert [name for name in NEW if LOSSES[name].has_parameters] == ["subcenter_arcface"]
    defaults = {name: LOSSES[name].params() for name in NEW}
    assert defaults["smooth_ap"].temperature == 0.01 and defaults["supcon"].temperature == 0.1
    assert (defaults["tuplet_margin"].margin, defaults["tuplet_margin"].scale) == (5.73, 64.0)
    sub = defaults["subcenter_arcface"]
    assert (sub.margin, sub.scale, sub.sub_centers) == (28.6, 64.0, 3)
    assert sub.optimizer_lr(6e-4, None) == pytest.approx(6e-2)  # 100 x the protocol lr, as Proxy-Anchor's proxies


@pytest.mark.parametrize("name", NEW)
def test_each_new_loss_is_finite_and_decreases_on_a_toy_problem(name):
    """A few Adam steps on free unit embeddings (6 classes x 4) lower the loss; the loss's own
    parameters, if any, step with their own optimiser."""
    torch.manual_seed(0)
    loss_fn = _build(name, num_classes=6, dim=16)
    points = torch.nn.Parameter(torch.randn(24, 16))
    labels = torch.arange(6).repeat_interleave(4)
    optimisers = [torch.optim.Adam([points], lr=0.05)]
    if LOSSES[name].has_parameters:
        optimisers.append(torch.optim.Adam(loss_fn.parameters(), lr=0.05))
    values = []
    for _ in range(10):
        value = loss_fn(F.normalize(points, dim=1), labels)
        assert torch.isfinite(value), name
        for optimiser in optimisers:
            optimiser.zero_grad()
        value.backward()
        assert torch.isfinite(points.grad).all(), name
        for optimiser in optimisers:
            optimiser.step()
        values.append(value.item())
    assert values[-1] < values[0], f"{name}: {values}"


@pytest.mark.parametrize("name", NEW)
def test_each_search_space_validates_and_its_corners_give_finite_losses(name):
    spec = LOSSES[name]
    check_space(name, spec.params, spec.search_space, f"losses/{name}.py")
    assert spec.search_space, name
    torch.manual_seed(0)
    embeddings = F.normalize(torch.randn(12, 8), dim=1)
    labels = torch.arange(3).repeat_interleave(4)
    for corner in (0, -1):
        values = {key: grid_points(dim, 2)[corner] for key, dim in spec.search_space.items() if key != "param_lr"}
        assert torch.isfinite(_build(name, 3, 8, **values)(embeddings, labels)), (name, values)


def test_the_sampler_gives_the_pair_losses_equal_classes_and_proxy_losses_their_own_batches(small_params):
    """PML's Smooth-AP needs the same number of images of every class in a batch: the protocol's
    ``m_per_class`` batches (``MPerClassSampler``) are ``batch_size / samples_per_class`` distinct
    classes x ``samples_per_class`` images, whatever ``classification_samples_per_class`` says."""
    from dmlbench.train.sampling import epoch_batches

    protocol = small_params.protocol
    per_class = protocol.sampling_for(LOSSES["smooth_ap"].sampler)
    assert per_class == protocol.samples_per_class == 4
    labels = np.repeat(np.arange(10), [3, 5, 9, 4, 4, 6, 2, 8, 4, 7])  # classes smaller than m too
    np.random.seed(0)
    for batch in epoch_batches(labels, protocol.batch_size, per_class, iterations=20):
        counts = np.bincount(labels[batch])
        assert sorted(set(counts[counts > 0])) == [per_class]


# --------------------------------------------------------------------------- SupCon


def test_supcon_closed_form():
    """Two classes of two identical unit vectors, orthogonal to the other class: for every anchor,
    L = -log(e^(1/t) / (e^(1/t) + 2 e^0)) = log(1 + 2 e^(-1/t))."""
    embeddings = _unit(0, 0, 90, 90)
    value = _build("supcon", temperature=1.0)(embeddings, torch.tensor([0, 0, 1, 1]))
    assert value.item() == pytest.approx(math.log(1 + 2 / math.e))


def test_supcon_equals_the_papers_equation_on_four_embeddings():
    """Khosla et al. eq. 2 (L^sup_out) in a loop over anchors, positives and the batch."""
    angles, labels, t = [0.0, 40.0, 100.0, 200.0], [0, 0, 1, 1], 0.5
    per_anchor = []
    for i, a in enumerate(angles):
        others = [j for j in range(4) if j != i]
        positives = [j for j in others if labels[j] == labels[i]]
        denominator = sum(math.exp(_cos(a, angles[j]) / t) for j in others)
        log_probs = [math.log(math.exp(_cos(a, angles[p]) / t) / denominator) for p in positives]
        per_anchor.append(-sum(log_probs) / len(positives))
    value = _build("supcon", temperature=t)(_unit(*angles), torch.tensor(labels))
    assert value.item() == pytest.approx(sum(per_anchor) / 4)


# --------------------------------------------------------------------------- Tuplet Margin


def test_tuplet_margin_equals_the_papers_equation_on_four_embeddings():
    """Yu & Tao: per positive pair (a, p), log(1 + sum_n exp(s (cos theta_an - cos(theta_ap - beta)))),
    averaged over the ordered positive pairs."""
    angles, labels, beta, s = [0.0, 40.0, 100.0, 200.0], [0, 0, 1, 1], 10.0, 4.0
    per_pair = []
    for a in range(4):
        for p in range(4):
            if p == a or labels[p] != labels[a]:
                continue
            theta_ap = abs(angles[a] - angles[p])
            negatives = [n for n in range(4) if labels[n] != labels[a]]
            inside = [s * (_cos(angles[a], angles[n]) - math.cos(math.radians(theta_ap - beta))) for n in negatives]
            per_pair.append(math.log(1 + sum(math.exp(x) for x in inside)))
    value = _build("tuplet_margin", margin=beta, scale=s)(_unit(*angles), torch.tensor(labels))
    assert len(per_pair) == 4 and value.item() == pytest.approx(sum(per_pair) / 4)


def test_tuplet_margin_stays_finite_on_two_copies_of_an_image():
    """A class with fewer images than samples_per_class is drawn with replacement: PML's acos of a
    cosine rounded to 1 is NaN; the clamped loss is finite and otherwise PML's."""
    from pytorch_metric_learning.losses import TupletMarginLoss

    torch.manual_seed(0)
    x = F.normalize(torch.randn(4, 8), dim=1)
    copies, labels = torch.cat([x, x]), torch.arange(4).repeat(2)
    pml = copies.clone().requires_grad_(True)
    TupletMarginLoss()(pml, labels).backward()
    assert not torch.isfinite(pml.grad).all()  # why the guard exists
    ours = copies.clone().requires_grad_(True)
    value = _build("tuplet_margin")(ours, labels)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(ours.grad).all()
    distinct = F.normalize(torch.randn(12, 8), dim=1), torch.arange(3).repeat_interleave(4)
    assert _build("tuplet_margin")(*distinct).item() == pytest.approx(TupletMarginLoss()(*distinct).item())


# --------------------------------------------------------------------------- Smooth-AP


def _smooth_ap_by_hand(embeddings: torch.Tensor, labels: list[int], t: float) -> float:
    """Brown et al.'s Smooth-AP in loops, the query among its own positives (authors' code)."""
    s = (embeddings @ embeddings.T).tolist()
    n, total = len(labels), 0.0
    for q in range(n):
        positives = [i for i in range(n) if labels[i] == labels[q]]

        def sg(j, i, q=q):
            return 1 / (1 + math.exp(-(s[q][j] - s[q][i]) / t))

        ratios = [
            (1 + sum(sg(j, i) for j in positives if j != i)) / (1 + sum(sg(j, i) for j in range(n) if j != i))
            for i in positives
        ]
        total += 1 - sum(ratios) / len(positives)
    return total / n


def test_smooth_ap_hand_computed_ranks():
    """A near-step sigmoid (t = 1e-4) makes the smoothed ranks exact. Angles 0, 90 (class 0) and
    50, 150 (class 1): query 0 ranks itself, 50 (neg), 90 (pos), 150 -> AP = (1 + 2/3) / 2 = 5/6;
    query 90: itself, 50, 150, 0 (pos 4th) -> 3/4; query 50: itself, 90, 0, 150 (pos 4th) -> 3/4;
    query 150: itself, 90, 50 (pos 3rd), 0 -> 5/6. L = 1 - 19/24 = 5/24."""
    from pytorch_metric_learning.losses import SmoothAPLoss

    embeddings, labels = _unit(0, 90, 50, 150), torch.tensor([0, 0, 1, 1])
    assert _build("smooth_ap", temperature=1e-4)(embeddings, labels).item() == pytest.approx(5 / 24)
    assert SmoothAPLoss(temperature=1e-4)(embeddings, labels).item() == pytest.approx(5 / 24)  # square: PML right


@pytest.mark.parametrize("classes, per_class", [(3, 3), (2, 3), (3, 2), (8, 4)])
def test_smooth_ap_equals_the_equation_on_any_batch_layout_and_pml_on_square_ones(classes, per_class):
    from pytorch_metric_learning.losses import SmoothAPLoss

    torch.manual_seed(0)
    embeddings = F.normalize(torch.randn(classes * per_class, 5, dtype=torch.float64), dim=1)
    labels = torch.arange(classes).repeat_interleave(per_class)
    ours = _build("smooth_ap", temperature=0.1)(embeddings, labels).item()
    assert ours == pytest.approx(_smooth_ap_by_hand(embeddings, labels.tolist(), 0.1))
    shuffled = torch.randperm(len(labels))
    assert _build("smooth_ap", temperature=0.1)(embeddings[shuffled], labels[shuffled]).item() == pytest.approx(ours)
    pml = SmoothAPLoss(temperature=0.1)(embeddings, labels).item()
    if classes == per_class:
        assert pml == pytest.approx(ours, rel=1e-6)
    else:  # PML 2.9 groups the batch by the number of classes (module docstring)
        assert abs(pml - ours) > 1e-3


def test_smooth_ap_refuses_batches_with_one_image_of_a_class():
    embeddings = F.normalize(torch.randn(4, 5), dim=1)
    with pytest.raises(ConfigError, match=r"smooth_ap needs >= 2 images of each class .*samples_per_class >= 2"):
        _build("smooth_ap")(embeddings, torch.arange(4))


# --------------------------------------------------------------------------- Sub-center ArcFace


def test_subcenter_arcface_takes_the_nearest_sub_centre_of_each_class():
    """K = 2 sub-centres per class at 0 and 90 degrees (class 0), 180 and 270 (class 1); m = 10
    degrees, s = 2. x at 60 (class 0): cos theta_0 = max(cos 60, cos 30), theta_0 = 30;
    cos theta_1 = max(cos 120, cos 210) = -0.5. x at 200 (class 1): theta_1 = 20, cos theta_0 =
    max(cos 200, cos 110). L = mean CE(s cos(theta_y + m), s cos theta_other)."""
    loss = _build("subcenter_arcface", num_classes=2, dim=2, margin=10.0, scale=2.0, sub_centers=2)
    with torch.no_grad():  # W: embedding_size x (classes x K), class c's sub-centres in columns cK..cK+K-1
        loss.W.copy_(_unit(0, 90, 180, 270).T.float())
    s = 2.0

    def ce(target_angle: float, other_cos: float) -> float:
        target = s * math.cos(math.radians(target_angle + 10.0))
        return -target + math.log(math.exp(target) + math.exp(s * other_cos))

    expected = (ce(30.0, -0.5) + ce(20.0, math.cos(math.radians(110)))) / 2
    assert loss(_unit(60, 200).float(), torch.tensor([0, 1])).item() == pytest.approx(expected, rel=1e-5)


def test_subcenter_arcface_trains_its_sub_centres_with_their_own_optimiser(small_raw_params):
    """Training's parts: the model's optimiser holds the model, the loss optimiser the sub-centres at
    100 x the protocol lr (a proxy's, as Proxy-Anchor's); stepping both lowers the loss on a fixed batch."""
    from dmlbench.grid import RunSpec
    from dmlbench.params.load import parse_params
    from dmlbench.params.run import run_config
    from dmlbench.train.optim import make_loss_optimizer, make_optimizer

    raw = copy.deepcopy(small_raw_params)
    raw["losses"] = {"subcenter_arcface": {}}
    config = run_config(parse_params(raw), RunSpec("glyphs", "tiny_cnn", "subcenter_arcface", 32, 0))
    protocol = config.protocol
    torch.manual_seed(0)
    loss_fn = config.loss_spec.build(config.loss_params, 6, 16)
    points = torch.nn.Parameter(torch.randn(24, 16))
    model_optimiser = make_optimizer(protocol.optimizer, [points], protocol.optimizer.lr)
    loss_optimiser = make_loss_optimizer(protocol, config.loss_params, loss_fn.parameters())
    (group,) = loss_optimiser.param_groups
    assert [p is loss_fn.W for p in group["params"]] == [True] and group["lr"] == 100 * protocol.optimizer.lr
    assert loss_fn.W.shape == (16, 6 * 3)
    assert all(p is not loss_fn.W for g in model_optimiser.param_groups for p in g["params"])
    labels = torch.arange(6).repeat_interleave(4)
    before = loss_fn.W.detach().clone()
    values = []
    for _ in range(10):
        value = loss_fn(F.normalize(points, dim=1), labels)
        model_optimiser.zero_grad()
        loss_optimiser.zero_grad()
        value.backward()
        model_optimiser.step()
        loss_optimiser.step()
        values.append(value.item())
    assert not torch.equal(before, loss_fn.W.detach()) and values[-1] < values[0]
