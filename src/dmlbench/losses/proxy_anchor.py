"""Proxy-Anchor loss (Kim et al., CVPR 2020): one learnable proxy per training class,
L = 1/|P+| sum_p log(1 + sum_{x in X_p+} exp(-alpha (s(x,p) - delta)))
  + 1/|P|  sum_p log(1 + sum_{x in X_p-} exp( alpha (s(x,p) + delta))),  s = cosine.
The proxies get their own optimiser at 100x the protocol lr (the paper's recipe)."""

from pydantic import NonNegativeFloat, PositiveFloat

from dmlbench.losses.base import LossSpec, ParametricLossParams


class ProxyAnchorParams(ParametricLossParams):
    margin: NonNegativeFloat = 0.1  # delta; thesis Table 4
    alpha: PositiveFloat = 32.0
    param_lr_multiplier: PositiveFloat = 100.0


def build(p: ProxyAnchorParams, num_classes: int, dim: int):
    from pytorch_metric_learning.losses import ProxyAnchorLoss

    return ProxyAnchorLoss(num_classes, dim, margin=p.margin, alpha=p.alpha)


SPEC = LossSpec(
    name="proxy_anchor",
    params=ProxyAnchorParams,
    build=build,
    sampler="any",
    has_parameters=True,
    reference="Kim, Kim, Cho & Kwak, CVPR 2020",
)
