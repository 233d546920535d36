"""The ``thesis_code`` formulation of :mod:`dmlbench.losses.lifted_structure` (see there)."""

from __future__ import annotations

from typing import Any

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu


class ThesisLiftedStructureLoss(BaseMetricLossFunction):
    """The thesis code's log-sum-exp Lifted Structure over a miner's pairs (a PML loss)."""

    def __init__(self, alpha: float = 40.0, beta: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        c_f.assert_distance_type(self, CosineSimilarity)
        self.alpha, self.beta = alpha, beta
        self.add_to_recordable_attributes(list_of_names=["alpha", "beta"], is_stat=False)

    def compute_loss(
        self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any, ref_emb: Any, ref_labels: Any
    ) -> dict[str, Any]:
        c_f.labels_required(labels)
        c_f.ref_not_supported(embeddings, labels, ref_emb, ref_labels)
        a1, p, a2, n = lmu.convert_to_pairs(indices_tuple, labels)
        similarity = self.distance(embeddings)
        positives = torch.zeros_like(similarity, dtype=torch.bool)
        negatives = torch.zeros_like(similarity, dtype=torch.bool)
        positives[a1, p] = True
        negatives[a2, n] = True
        pos_term = lmu.logsumexp(-self.beta * similarity, keep_mask=positives, add_one=False, dim=1)
        neg_term = lmu.logsumexp(self.alpha * similarity, keep_mask=negatives, add_one=False, dim=1)
        valid = (positives.any(dim=1) & negatives.any(dim=1)).to(similarity.dtype)
        losses = (2.0 / self.beta * pos_term + 2.0 / self.alpha * neg_term).squeeze(1) * valid
        return {
            "loss": {
                "losses": losses,
                "indices": c_f.torch_arange_from_size(embeddings),
                "reduction_type": "element",
            }
        }

    def get_default_distance(self) -> Any:
        return CosineSimilarity()
