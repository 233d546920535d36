"""The class of :mod:`dmlbench.losses.smooth_ap`: PML's Smooth-AP with positives from the labels (see there)."""

from __future__ import annotations

from typing import Any

import torch
from pytorch_metric_learning.losses import SmoothAPLoss
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from dmlbench.errors import ConfigError


class LabelledSmoothAPLoss(SmoothAPLoss):
    """PML's ``SmoothAPLoss`` with each query's positives read from the labels, any batch layout."""

    checked = False  # the batch layout is checked once: every batch of a run has the same one

    def compute_loss(
        self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any, ref_emb: Any, ref_labels: Any
    ) -> dict[str, Any]:
        c_f.labels_required(labels)
        c_f.ref_not_supported(embeddings, labels, ref_emb, ref_labels)
        same = (labels.unsqueeze(0) == labels.unsqueeze(1)).to(embeddings.dtype)  # [q, j]: j in P_q
        if not self.checked:
            if int(same.sum(dim=1).min()) < 2:
                raise ConfigError(
                    "smooth_ap needs >= 2 images of each class in a batch (protocol samples_per_class >= 2)"
                )
            self.checked = True
        sims = self.distance(embeddings)  # s_qj
        diff = sims.unsqueeze(1) - sims.unsqueeze(2)  # [q, i, j] = s_qj - s_qi
        others = 1.0 - torch.eye(len(labels), dtype=sims.dtype, device=sims.device)  # [i, j]: j != i
        soft = torch.sigmoid(diff / self.temperature) * others
        rank_all = 1.0 + soft.sum(dim=-1)  # [q, i]
        rank_pos = 1.0 + (soft * same.unsqueeze(1)).sum(dim=-1)
        ap = (same * rank_pos / rank_all).sum(dim=1) / same.sum(dim=1)
        loss = (1.0 - ap) * lmu.convert_to_weights(indices_tuple, labels, dtype=ap.dtype)
        indices = c_f.torch_arange_from_size(loss)
        return {"ap_loss": {"losses": loss, "indices": indices, "reduction_type": "element"}}
