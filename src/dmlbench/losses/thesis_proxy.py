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

from typing import Literal

from pydantic import NonNegativeFloat, PositiveFloat

from dmlbench.losses.base import LossModule, LossSpec, ParametricLossParams
from dmlbench.losses.search import PARAM_LR, FloatRange


class ThesisProxyParams(ParametricLossParams):
    alpha: PositiveFloat = 32.0  # scale a
    margin: NonNegativeFloat = 0.1  # l
    variant: Literal[1, 2] = 2  # eq. 6.1 or 6.2
    param_lr_multiplier: PositiveFloat = 100.0


def build(p: ThesisProxyParams, num_classes: int, dim: int) -> LossModule:
    from dmlbench.losses._impl.thesis_proxy import ThesisProxyLoss

    return ThesisProxyLoss(num_classes, dim, margin=p.margin, alpha=p.alpha, variant=p.variant)


# Not searched by the Reality Check; as proxy_anchor, by analogy with its ranges (powerful-benchmarker
# (branch metric-learning), docs/papers/mlrc_plots/): alpha [0.01, 100] linear as its log-sum-exp scales,
# margin [0, 1] as its cosine margins, the proxies' lr PARAM_LR. ``variant`` picks a formulation: not searched
SEARCH_SPACE = {"alpha": FloatRange(0.01, 100.0), "margin": FloatRange(0.0, 1.0), "param_lr": PARAM_LR}

SPEC = LossSpec(
    name="thesis_proxy",
    params=ThesisProxyParams,
    build=build,
    sampler="any",
    reference="Psomas, Metric Learning: A Deep Dive, diploma thesis, NTUA/UoA 2020, ch. 6",
    search_space=SEARCH_SPACE,
)
