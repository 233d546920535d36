"""Hyp-ViT's pairwise cross-entropy on the sphere (Ermolov, Mirvakhabova, Khrulkov, Sebe & Oseledets,
"Hyperbolic Vision Transformers: Combining Improvements in Metric Learning", CVPR 2022): the loss of
its "Sph-" rows (``--hyp_c 0 --t 0.1``, htdt/hyp_metric ``README.md``), ``contrastive_loss`` of
``train.py`` with ``hyp_c == 0``.

A batch of C classes x m images, every class with the same count m >= 2 (Hyp-ViT's class-pass
sampler gives m = ``samples_per_class`` of C distinct classes). With z_c^i the unit-norm embedding of
class c's i-th image in the batch, s = cosine similarity and t the temperature, each ordered pair of
views (i, j), i != j, scores every class c against the other view's images and its own view's others:

  l_ij(c) = -log( exp(s(z_c^i, z_c^j) / t) /
                  (sum_k exp(s(z_c^i, z_k^j) / t) + sum_{k != c} exp(s(z_c^i, z_k^i) / t)) ),

  L = sum_{i != j} 1/C sum_c l_ij(c)      (a sum over the m(m - 1) ordered view pairs).

A view's images of other classes are negatives; the other images of c's own class in views other
than i and j take no part in l_ij. Images of one class are taken as views in their batch order.
t = 0.1: the sphere version's (``README.md``: "add --hyp_c 0 --t 0.1 for sphere version"; ``train.py``'s
default 0.2 is the hyperbolic one's). No miner; no parameters of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import PositiveFloat

from dmlbench.errors import ConfigError
from dmlbench.losses.base import LossParams, LossSpec, lazy_loss_class
from dmlbench.losses.search import FloatRange

if TYPE_CHECKING:
    import torch
    from torch import nn


def _define() -> type:
    """Define the loss on first use, so that validating params.yaml does not import PML."""
    import torch
    import torch.nn.functional as F
    from pytorch_metric_learning.losses import BaseMetricLossFunction
    from pytorch_metric_learning.utils import common_functions as c_f

    class HypViTSphereLoss(BaseMetricLossFunction):
        """The pairwise cross-entropy of the module docstring (PML's loss interface)."""

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
            return {
                "loss": {"losses": per_pair[off_diagonal].sum(), "indices": None, "reduction_type": "already_reduced"}
            }

    return HypViTSphereLoss


def class_views(embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``m x C x d``: the batch's embeddings by view (a class's i-th image in batch order) and class
    (label order); a :class:`ConfigError` unless every class has the same count m >= 2."""
    import torch

    classes, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    m = int(counts[0])
    if m < 2 or bool((counts != m).any()):
        raise ConfigError(
            "hyp_vit_sphere needs the same number (>= 2) of images of every class in a batch (protocol "
            f"samples_per_class >= 2, sampler class_pass or pml); this batch has {sorted(set(counts.tolist()))}"
        )
    order = torch.argsort(inverse * len(labels) + torch.arange(len(labels), device=labels.device))
    return embeddings[order].view(len(classes), m, -1).transpose(0, 1)


# the class, defined on first use; and the module's __getattr__ (PEP 562), so it imports by name
_define_loss_class, __getattr__ = lazy_loss_class(__name__, "HypViTSphereLoss", _define)


class HypViTSphereParams(LossParams):
    temperature: PositiveFloat = 0.1  # t; README.md's sphere version


def build(p: HypViTSphereParams, num_classes: int, dim: int) -> nn.Module:
    return _define_loss_class()(temperature=p.temperature)


# Not searched by the Reality Check; its only temperature range, NT-Xent's, by analogy: temperature
# log [1e-5, 100] (powerful-benchmarker (branch metric-learning), docs/papers/mlrc_plots/{cub,cars,sop}_ntxent.html)
SEARCH_SPACE = {"temperature": FloatRange(1e-5, 100.0, log=True)}

SPEC = LossSpec(
    name="hyp_vit_sphere",
    params=HypViTSphereParams,
    build=build,
    reference="Ermolov, Mirvakhabova, Khrulkov, Sebe & Oseledets, CVPR 2022 (sphere version)",
    search_space=SEARCH_SPACE,
)
