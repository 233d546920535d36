"""CosFace (Wang et al., CVPR 2018): softmax over s (cos(theta_j) - m [j = y]), class weights W
learnable (PML ``CosFaceLoss``). Not in the thesis; margin 0.35 and scale 64 are the paper's
values (= PML defaults); weights at the protocol lr."""

from pydantic import PositiveFloat

from dmlbench.losses.base import LossSpec, ParametricLossParams


class CosFaceParams(ParametricLossParams):
    margin: PositiveFloat = 0.35
    scale: PositiveFloat = 64.0


def build(p: CosFaceParams, num_classes: int, dim: int):
    from pytorch_metric_learning.losses import CosFaceLoss

    return CosFaceLoss(num_classes, dim, margin=p.margin, scale=p.scale)


SPEC = LossSpec(
    name="cosface",
    params=CosFaceParams,
    build=build,
    sampler="any",
    has_parameters=True,
    reference="Wang et al., CVPR 2018",
)
