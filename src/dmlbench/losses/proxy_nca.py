"""ProxyNCA (Movshovitz-Attias et al., ICCV 2017): one learnable proxy per class,
L = -log(exp(-s d(x, p_y)) / sum_z exp(-s d(x, p_z))), d = squared Euclidean distance of
normalised vectors, s = ``softmax_scale`` (PML ``ProxyNCALoss``: a softmax over every proxy, the
own class's included; the paper's denominator leaves it out).

Proxy lr 1e-5, absolute (thesis Table 4, "proxy lr 0.00001"): the same under the thesis's base lr
1e-4 (CUB200, Cars196) and 6e-4 (SOP). ``softmax_scale`` 32 is the thesis code's value
(``Proxy_NCA(scale=32)``, inherited from the Proxy-Anchor code). The thesis code itself never trains
the proxies: its ``train.py`` adds only Proxy-Anchor's and SoftTriple's loss parameters to the
optimiser (billpsomas/deep_metric_learning_benchmark); we follow Table 4."""

from pydantic import PositiveFloat

from dmlbench.losses.base import LossModule, LossSpec, ParametricLossParams
from dmlbench.losses.search import PARAM_LR, FloatRange


class ProxyNCAParams(ParametricLossParams):
    softmax_scale: PositiveFloat = 32.0
    param_lr: PositiveFloat | None = 1e-5  # absolute (thesis Table 4)


def build(p: ProxyNCAParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import ProxyNCALoss

    return ProxyNCALoss(num_classes, dim, softmax_scale=p.softmax_scale)


# The Reality Check's bounds, the same on CUB200/Cars196/SOP: softmax_scale [0.01, 100] linear, proxy lr
# PARAM_LR (powerful-benchmarker (branch metric-learning), docs/papers/mlrc_plots/{cub,cars,sop}_proxy_nca.html)
SEARCH_SPACE = {"softmax_scale": FloatRange(0.01, 100.0), "param_lr": PARAM_LR}

SPEC = LossSpec(
    name="proxy_nca",
    params=ProxyNCAParams,
    build=build,
    sampler="any",
    reference="Movshovitz-Attias et al., ICCV 2017",
    search_space=SEARCH_SPACE,
)
