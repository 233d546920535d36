"""CosFace (Wang et al., CVPR 2018): softmax over s (cos(theta_j) - m [j = y]), class weights W
learnable (PML ``CosFaceLoss``). Not in the thesis; margin 0.35 and scale 64 are the paper's
values (= PML defaults); weights at the protocol lr."""

from pydantic import PositiveFloat

from dmlbench.losses.base import LossModule, LossSpec, ParametricLossParams
from dmlbench.losses.search import PARAM_LR, FloatRange


class CosFaceParams(ParametricLossParams):
    margin: PositiveFloat = 0.35
    scale: PositiveFloat = 64.0


def build(p: CosFaceParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import CosFaceLoss

    return CosFaceLoss(num_classes, dim, margin=p.margin, scale=p.scale)


# The Reality Check's bounds, the same on CUB200/Cars196/SOP (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_cosface.html): margin [0, 1], clipped to 1e-3 (PositiveFloat);
# scale [0.01, 200]; weights lr PARAM_LR
SEARCH_SPACE = {"margin": FloatRange(1e-3, 1.0), "scale": FloatRange(0.01, 200.0), "param_lr": PARAM_LR}

SPEC = LossSpec(
    name="cosface",
    params=CosFaceParams,
    build=build,
    sampler="any",
    reference="Wang et al., CVPR 2018",
    search_space=SEARCH_SPACE,
)
