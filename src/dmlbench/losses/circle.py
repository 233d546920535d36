"""Circle loss (Sun et al., CVPR 2020): pair similarities re-weighted by their distance to the
optimum, L = softplus(logsumexp_n(gamma a_n (s_n - m)) + logsumexp_p(-gamma a_p (s_p - 1 + m))),
a_n = [s_n + m]_+, a_p = [1 + m - s_p]_+ (PML ``CircleLoss``). m 0.4 and gamma 80 are the
paper's fine-grained retrieval settings (= PML defaults). No mining."""

from pydantic import PositiveFloat

from dmlbench.losses.base import LossModule, LossParams, LossSpec
from dmlbench.losses.search import FloatRange


class CircleParams(LossParams):
    m: PositiveFloat = 0.4  # relaxation margin
    gamma: PositiveFloat = 80.0  # scale


def build(p: CircleParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import CircleLoss

    return CircleLoss(m=p.m, gamma=p.gamma)


# Not searched by the Reality Check; by analogy with its CosFace ranges (powerful-benchmarker (branch
# metric-learning), docs/papers/mlrc_plots/{cub,cars,sop}_cosface.html), as m is a cosine margin and gamma
# a scale like CosFace's: m [0, 1], clipped to 1e-3 (PositiveFloat); gamma [0.01, 200]
SEARCH_SPACE = {"m": FloatRange(1e-3, 1.0), "gamma": FloatRange(0.01, 200.0)}

SPEC = LossSpec(
    name="circle", params=CircleParams, build=build, reference="Sun et al., CVPR 2020", search_space=SEARCH_SPACE
)
