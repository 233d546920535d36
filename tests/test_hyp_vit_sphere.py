"""Hyp-ViT's sphere loss (``hyp_vit_sphere``): values by hand from the formula of htdt/hyp_metric
``train.py`` ``contrastive_loss`` (``hyp_c == 0``) summed over the ordered view pairs, its batch
layout rule, and that training lowers it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dmlbench.errors import ConfigError
from dmlbench.losses import LOSSES


def _loss(temperature: float = 0.1):
    spec = LOSSES["hyp_vit_sphere"]
    return spec.build(spec.params(temperature=temperature), 0, 2)


def _unit(*degrees: float) -> torch.Tensor:
    return torch.tensor([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in degrees], dtype=torch.float64)


def _row(s_pos: float, others_cross: list[float], others_own: list[float], t: float) -> float:
    """-log softmax of the positive among the other view (all classes) and the own view (others)."""
    terms = [s_pos, *others_cross, *others_own]
    return -s_pos / t + math.log(sum(math.exp(s / t) for s in terms))


def test_two_classes_two_views_by_hand():
    # class 0 at 0 and 20 degrees, class 1 at 90 and 80 (batch order: 0, 1, 0, 1)
    embeddings, labels = _unit(0, 90, 20, 80), torch.tensor([0, 1, 0, 1])
    cos = lambda a, b: math.cos(math.radians(a - b))  # noqa: E731
    t = 0.1
    view = {0: (0.0, 20.0), 1: (90.0, 80.0)}  # class -> (view 1, view 2)
    total = 0.0
    for i, j in ((0, 1), (1, 0)):
        rows = []
        for c in (0, 1):
            k = 1 - c
            rows.append(
                _row(cos(view[c][i], view[c][j]), [cos(view[c][i], view[k][j])], [cos(view[c][i], view[k][i])], t)
            )
        total += sum(rows) / 2
    assert _loss(t)(embeddings, labels).item() == pytest.approx(total, rel=1e-12)
    assert total == pytest.approx(0.0125374, rel=1e-5)  # the number itself, written out (by hand: 1.108e-3 + 1.143e-2)


def test_three_views_sum_six_ordered_pairs_and_views_of_one_class_are_not_negatives():
    """m = 3: six (i, j) terms; class c's third image is no negative of l_12(c)."""
    torch.manual_seed(0)
    embeddings = F.normalize(torch.randn(9, 4, dtype=torch.float64), dim=1)
    labels = torch.tensor([2, 0, 1, 0, 2, 1, 1, 2, 0])
    views = {c: embeddings[labels == c] for c in (0, 1, 2)}  # batch order within a class
    t = 0.2
    total = 0.0
    for i in range(3):
        for j in range(3):
            if i == j:
                continue
            rows = []
            for c in (0, 1, 2):
                others = [k for k in (0, 1, 2) if k != c]
                s = lambda a, b: float(a @ b)  # noqa: E731
                rows.append(
                    _row(
                        s(views[c][i], views[c][j]),
                        [s(views[c][i], views[k][j]) for k in others],
                        [s(views[c][i], views[k][i]) for k in others],
                        t,
                    )
                )
            total += sum(rows) / 3
    assert _loss(t)(embeddings, labels).item() == pytest.approx(total, rel=1e-12)


def test_a_batch_with_unequal_class_counts_is_refused_in_one_line():
    with pytest.raises(ConfigError) as caught:
        _loss()(_unit(0, 10, 20, 30, 40), torch.tensor([0, 0, 1, 1, 1]))
    assert "\n" not in str(caught.value) and "same number (>= 2) of images of every class" in str(caught.value)
    with pytest.raises(ConfigError, match=r"this batch has \[1\]"):
        _loss()(_unit(0, 10), torch.tensor([0, 1]))


def test_gradient_steps_lower_it():
    torch.manual_seed(1)
    points = torch.nn.Parameter(torch.randn(12, 8))
    labels = torch.arange(4).repeat(3)
    loss_fn = _loss()
    optimiser = torch.optim.SGD([points], lr=0.05)
    values = []
    for _ in range(20):
        value = loss_fn(F.normalize(points, dim=1), labels)
        optimiser.zero_grad()
        value.backward()
        optimiser.step()
        values.append(value.item())
    assert values[-1] < 0.5 * values[0]
