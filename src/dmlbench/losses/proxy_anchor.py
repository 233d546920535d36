"""Proxy-Anchor loss (Kim et al., CVPR 2020): one learnable proxy per training class,
L = 1/|P+| sum_p log(1 + sum_{x in X_p+} exp(-alpha (s(x,p) - delta)))
  + 1/|P|  sum_p log(1 + sum_{x in X_p-} exp( alpha (s(x,p) + delta))),  s = cosine.
The proxies get their own optimiser at 100 x the protocol lr, a multiplier: the official code
(tjddus9597/Proxy-Anchor-CVPR2020 ``code/train.py``: ``'lr':float(args.lr) * 100``), which the
thesis code keeps; thesis Table 4 gives no proxy lr."""

from pydantic import NonNegativeFloat, PositiveFloat

from dmlbench.losses.base import LossModule, LossSpec, ParametricLossParams
from dmlbench.losses.search import PARAM_LR, FloatRange


class ProxyAnchorParams(ParametricLossParams):
    margin: NonNegativeFloat = 0.1  # delta; thesis Table 4
    alpha: PositiveFloat = 32.0
    param_lr_multiplier: PositiveFloat = 100.0  # x the protocol lr (official code)


def build(p: ProxyAnchorParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import ProxyAnchorLoss

    return ProxyAnchorLoss(num_classes, dim, margin=p.margin, alpha=p.alpha)


# Not searched by the Reality Check; by analogy with its ranges (powerful-benchmarker (branch
# metric-learning), docs/papers/mlrc_plots/): alpha [0.01, 100] linear as its log-sum-exp scales
# (proxy_nca softmax_scale, multi_similarity alpha/beta), margin [0, 1] as its cosine margins
# (cosface margin, multi_similarity base), the proxies' lr as RC's metric_loss_optimizer (PARAM_LR)
SEARCH_SPACE = {"margin": FloatRange(0.0, 1.0), "alpha": FloatRange(0.01, 100.0), "param_lr": PARAM_LR}

SPEC = LossSpec(
    name="proxy_anchor",
    params=ProxyAnchorParams,
    build=build,
    sampler="any",
    reference="Kim, Kim, Cho & Kwak, CVPR 2020",
    search_space=SEARCH_SPACE,
)
