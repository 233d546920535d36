"""The class of :mod:`dmlbench.losses.thesis_proxy` (eq. 6.1/6.2 of the thesis: see there)."""

from __future__ import annotations

from typing import Any

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.losses.mixins import WeightRegularizerMixin
from pytorch_metric_learning.reducers import DivisorReducer
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu


class ThesisProxyLoss(WeightRegularizerMixin, BaseMetricLossFunction):
    """Eq. 6.1 (``variant=1``) or 6.2 (``variant=2``) of the thesis, one learnable proxy per class."""

    def __init__(
        self, num_classes: int, embedding_size: int, margin: float = 0.1, alpha: float = 32, variant: int = 2, **kw: Any
    ) -> None:
        super().__init__(**kw)
        c_f.assert_distance_type(self, CosineSimilarity)
        if variant not in (1, 2):
            raise ValueError(f"variant must be 1 (eq. 6.1) or 2 (eq. 6.2), got {variant!r}")
        self.proxies = torch.nn.Parameter(torch.Tensor(num_classes, embedding_size))
        self.weight_init_func(self.proxies)
        self.num_classes, self.margin, self.alpha, self.variant = num_classes, margin, alpha, variant
        self.add_to_recordable_attributes(list_of_names=["num_classes", "alpha", "margin"], is_stat=False)

    def compute_loss(
        self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any, ref_emb: Any, ref_labels: Any
    ) -> dict[str, Any]:
        c_f.labels_required(labels)
        c_f.ref_not_supported(embeddings, labels, ref_emb, ref_labels)
        if indices_tuple is not None:
            raise ValueError("ThesisProxyLoss uses the whole batch; it takes no miner output")
        self.proxies.data = c_f.to_device(self.proxies.data, device=embeddings.device, dtype=embeddings.dtype)
        sample_proxy = self.distance(embeddings, self.proxies)  # B x C, w.x
        pos_mask = torch.nn.functional.one_hot(labels, self.num_classes).bool()
        if self.variant == 1:
            proxy_proxy = self.distance(self.proxies, self.proxies)  # C x C, w.w-
        else:
            proxy_proxy = sample_proxy.t() @ sample_proxy  # C x C, sum_x (w.x)(x.w-)
        others = ~torch.eye(self.num_classes, dtype=torch.bool, device=embeddings.device)
        pos_term = lmu.logsumexp(-self.alpha * (sample_proxy - self.margin), keep_mask=pos_mask, add_one=True, dim=0)
        neg_term = lmu.logsumexp(self.alpha * (proxy_proxy + self.margin), keep_mask=others, add_one=True, dim=1)
        indices = c_f.torch_arange_from_size(self.proxies)
        loss_dict = {
            "pos_loss": {
                "losses": pos_term.squeeze(0),
                "indices": indices,
                "reduction_type": "element",
                "divisor": int(pos_mask.any(dim=0).sum()),
            },
            "neg_loss": {
                "losses": neg_term.squeeze(1),
                "indices": indices,
                "reduction_type": "element",
                "divisor": self.num_classes,
            },
        }
        self.add_weight_regularization_to_loss_dict(loss_dict, self.proxies)
        return loss_dict

    def get_default_reducer(self) -> Any:
        return DivisorReducer()

    def get_default_distance(self) -> Any:
        return CosineSimilarity()

    def get_default_weight_init_func(self) -> Any:
        return c_f.TorchInitWrapper(torch.nn.init.kaiming_normal_, mode="fan_out")

    def _sub_loss_names(self) -> list[str]:
        return ["pos_loss", "neg_loss"]
