"""The thesis's own proxy loss (Psomas 2020, §6), as a PML loss: one learnable proxy w per class;
samples are pulled to their class proxy with Multi-Similarity's log-sum-exp, and proxies are
pushed away from each other. With cosine similarities, W+ = proxies of classes in the batch,
X_w+ = the batch samples of w's class, W- = the other proxies of w:

  eq. 6.1: L = 1/|W+| sum_{w in W+} log(1 + sum_{x in X_w+} exp(-a (w.x - l)))
             + 1/|W|  sum_{w in W}  log(1 + sum_{w- in W-} exp( a (w.w- + l)))
  eq. 6.2: the same with w.w- replaced by sum_{x in X} (w.x)(x.w-) (proxy similarity seen
           through the whole batch X); the variant the thesis trained (Tables 17-19).

The text of eq. 6.1 averages its second term over "W-"; the thesis code
(billpsomas/deep_metric_learning_benchmark ``losses.py``, class ``Proxy_Anchor``: ``N_one_hot =
1 - eye``, ``neg_term = ... / nb_classes``) averages over all proxies, for both variants; we
follow the code. a = 32, l = 0.1 and proxies at 100x the lr are that code's defaults.
log(1 + sum exp) is computed with PML's stable ``logsumexp(add_one=True)``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import NonNegativeFloat, PositiveFloat

from dmlbench.losses.base import LossSpec, ParametricLossParams, lazy_loss_class
from dmlbench.losses.search import PARAM_LR, FloatRange


def _define() -> type:
    """Define the loss on first use, so that validating params.yaml does not import PML."""
    import torch
    from pytorch_metric_learning.distances import CosineSimilarity
    from pytorch_metric_learning.losses import BaseMetricLossFunction
    from pytorch_metric_learning.losses.mixins import WeightRegularizerMixin
    from pytorch_metric_learning.reducers import DivisorReducer
    from pytorch_metric_learning.utils import common_functions as c_f
    from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

    class ThesisProxyLoss(WeightRegularizerMixin, BaseMetricLossFunction):
        """Eq. 6.1 (``variant=1``) or 6.2 (``variant=2``) of the thesis; see the module docstring."""

        def __init__(
            self, num_classes: int, embedding_size: int, margin: float = 0.1, alpha: float = 32, variant=2, **kw
        ):
            super().__init__(**kw)
            c_f.assert_distance_type(self, CosineSimilarity)
            if variant not in (1, 2):
                raise ValueError(f"variant must be 1 (eq. 6.1) or 2 (eq. 6.2), got {variant!r}")
            self.proxies = torch.nn.Parameter(torch.Tensor(num_classes, embedding_size))
            self.weight_init_func(self.proxies)
            self.num_classes, self.margin, self.alpha, self.variant = num_classes, margin, alpha, variant
            self.add_to_recordable_attributes(list_of_names=["num_classes", "alpha", "margin"], is_stat=False)

        def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
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
            pos_term = lmu.logsumexp(
                -self.alpha * (sample_proxy - self.margin), keep_mask=pos_mask, add_one=True, dim=0
            )
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

        def get_default_reducer(self):
            return DivisorReducer()

        def get_default_distance(self):
            return CosineSimilarity()

        def get_default_weight_init_func(self):
            return c_f.TorchInitWrapper(torch.nn.init.kaiming_normal_, mode="fan_out")

        def _sub_loss_names(self):
            return ["pos_loss", "neg_loss"]

    return ThesisProxyLoss


# the class, defined on first use; and the module's __getattr__ (PEP 562), so it imports by name
_define_loss_class, __getattr__ = lazy_loss_class(__name__, "ThesisProxyLoss", _define)


class ThesisProxyParams(ParametricLossParams):
    alpha: PositiveFloat = 32.0  # scale a
    margin: NonNegativeFloat = 0.1  # l
    variant: Literal[1, 2] = 2  # eq. 6.1 or 6.2
    param_lr_multiplier: PositiveFloat = 100.0


def build(p: ThesisProxyParams, num_classes: int, dim: int) -> Any:
    loss_class = _define_loss_class()
    return loss_class(num_classes, dim, margin=p.margin, alpha=p.alpha, variant=p.variant)


# Not searched by the Reality Check; as proxy_anchor, by analogy with its ranges (powerful-benchmarker
# (branch metric-learning), docs/papers/mlrc_plots/): alpha [0.01, 100] linear as its log-sum-exp scales,
# margin [0, 1] as its cosine margins, the proxies' lr PARAM_LR. ``variant`` picks a formulation: not searched
SEARCH_SPACE = {"alpha": FloatRange(0.01, 100.0), "margin": FloatRange(0.0, 1.0), "param_lr": PARAM_LR}

SPEC = LossSpec(
    name="thesis_proxy",
    params=ThesisProxyParams,
    build=build,
    sampler="any",
    has_parameters=True,
    reference="Psomas, Metric Learning: A Deep Dive, diploma thesis, NTUA/UoA 2020, ch. 6",
    search_space=SEARCH_SPACE,
)
