"""The class of :mod:`dmlbench.losses.tuplet_margin`: PML's loss with its cosines clamped (see there)."""

from __future__ import annotations

from typing import Any

import torch
from pytorch_metric_learning.losses import TupletMarginLoss


class ClampedTupletMarginLoss(TupletMarginLoss):
    """PML's ``TupletMarginLoss`` with the positive cosines clamped inside (-1, 1), where acos is finite."""

    def _compute_loss(self, pos_pairs: torch.Tensor, neg_pairs: torch.Tensor, indices_tuple: Any) -> dict[str, Any]:
        eps = torch.finfo(pos_pairs.dtype).eps
        return super()._compute_loss(pos_pairs.clamp(-1 + eps, 1 - eps), neg_pairs, indices_tuple)
