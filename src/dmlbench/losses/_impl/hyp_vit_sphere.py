"""The class of :mod:`dmlbench.losses.hyp_vit_sphere`: Hyp-ViT's pairwise cross-entropy (see there)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.utils import common_functions as c_f

from dmlbench.errors import ConfigError


class HypViTSphereLoss(BaseMetricLossFunction):
    """The pairwise cross-entropy over views of a class (PML's loss interface; no miner)."""

    def __init__(self, temperature: float = 0.1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.temperature = temperature

    def compute_loss(
        self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any, ref_emb: Any, ref_labels: Any
    ) -> dict[str, Any]:
        c_f.labels_required(labels)
        c_f.ref_not_supported(embeddings, labels, ref_emb, ref_labels)
        views = class_views(F.normalize(embeddings, dim=1), labels)  # m x C x d
        m, count = views.shape[0], views.shape[1]
        sims = torch.einsum("icd,jkd->ijck", views, views) / self.temperature  # [i, j, c, k] = s(z_c^i, z_k^j)/t
        own = torch.diagonal(sims, dim1=0, dim2=1).permute(2, 0, 1)  # [i, c, k] = s(z_c^i, z_k^i)/t
        eye = torch.eye(count, dtype=torch.bool, device=sims.device)
        own = own.masked_fill(eye, float("-inf")).unsqueeze(1).expand(m, m, count, count)
        logits = torch.cat([sims, own], dim=-1)  # [i, j, c, :] the row of l_ij(c)
        positive = torch.diagonal(sims, dim1=2, dim2=3)  # [i, j, c] = s(z_c^i, z_c^j)/t
        per_pair = (torch.logsumexp(logits, dim=-1) - positive).mean(dim=-1)  # [i, j]
        off_diagonal = ~torch.eye(m, dtype=torch.bool, device=sims.device)
        return {"loss": {"losses": per_pair[off_diagonal].sum(), "indices": None, "reduction_type": "already_reduced"}}


def class_views(embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``m x C x d``: the batch's embeddings by view (a class's i-th image in batch order) and class
    (label order); a :class:`ConfigError` unless every class has the same count m >= 2."""
    classes, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    m = int(counts[0])
    if m < 2 or bool((counts != m).any()):
        raise ConfigError(
            "hyp_vit_sphere needs the same number (>= 2) of images of every class in a batch (protocol "
            f"samples_per_class >= 2, sampler class_pass or pml); this batch has {sorted(set(counts.tolist()))}"
        )
    order = torch.argsort(inverse * len(labels) + torch.arange(len(labels), device=labels.device))
    return embeddings[order].view(len(classes), m, -1).transpose(0, 1)
