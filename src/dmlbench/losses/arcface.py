"""ArcFace (Deng et al., CVPR 2019): softmax over s cos(theta_j), with the target angle
theta_y + m (additive angular margin, m in degrees), class weights W learnable (PML
``ArcFaceLoss``). Thesis Table 4: margin 28.6 deg (= 0.5 rad), scale 64, weights lr 1e-4 (1x)."""

from pydantic import PositiveFloat

from dmlbench.losses.base import LossSpec, ParametricLossParams


class ArcFaceParams(ParametricLossParams):
    margin: PositiveFloat = 28.6  # degrees
    scale: PositiveFloat = 64.0


def build(p: ArcFaceParams, num_classes: int, dim: int):
    from pytorch_metric_learning.losses import ArcFaceLoss

    return ArcFaceLoss(num_classes, dim, margin=p.margin, scale=p.scale)


SPEC = LossSpec(
    name="arcface",
    params=ArcFaceParams,
    build=build,
    sampler="any",
    has_parameters=True,
    reference="Deng, Guo, Xue & Zafeiriou, CVPR 2019",
)
