"""ArcFace (Deng et al., CVPR 2019): softmax over s cos(theta_j), with the target angle
theta_y + m (additive angular margin, m in degrees), class weights W learnable (PML
``ArcFaceLoss``). Thesis Table 4: margin 28.6 deg (= 0.5 rad), scale 64, weights lr 1e-4, absolute
(whatever the base lr). The thesis code differs: scale 220 (``ArcFaceLoss(scale=220)``) and the
class weights never reach its optimiser (billpsomas/deep_metric_learning_benchmark ``train.py``);
we follow Table 4."""

from pydantic import PositiveFloat

from dmlbench.losses.base import LossModule, LossSpec, ParametricLossParams
from dmlbench.losses.search import PARAM_LR, FloatRange


class ArcFaceParams(ParametricLossParams):
    margin: PositiveFloat = 28.6  # degrees
    scale: PositiveFloat = 64.0
    param_lr: PositiveFloat | None = 1e-4  # weights lr, absolute (thesis Table 4)


def build(p: ArcFaceParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import ArcFaceLoss

    return ArcFaceLoss(num_classes, dim, margin=p.margin, scale=p.scale)


# The Reality Check's bounds (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_arcface.html): margin [0, 90] degrees, clipped to 0.5 (PositiveFloat);
# scale [0.01, 200] (SOP: up to 300); weights lr PARAM_LR
SEARCH_SPACE = {"margin": FloatRange(0.5, 90.0), "scale": FloatRange(0.01, 300.0), "param_lr": PARAM_LR}

SPEC = LossSpec(
    name="arcface",
    params=ArcFaceParams,
    build=build,
    sampler="any",
    reference="Deng, Guo, Xue & Zafeiriou, CVPR 2019",
    search_space=SEARCH_SPACE,
)
