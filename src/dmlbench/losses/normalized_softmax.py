"""Normalized Softmax (Zhai & Wu, BMVC 2019): softmax cross-entropy over W^T x / t with
normalised class weights W (learnable) and embeddings x (PML ``NormalizedSoftmaxLoss``).
Temperature 0.05 = the paper's value (PML default); weights at the protocol lr."""

from pydantic import PositiveFloat

from dmlbench.losses.base import LossSpec, ParametricLossParams


class NormalizedSoftmaxParams(ParametricLossParams):
    temperature: PositiveFloat = 0.05


def build(p: NormalizedSoftmaxParams, num_classes: int, dim: int):
    from pytorch_metric_learning.losses import NormalizedSoftmaxLoss

    return NormalizedSoftmaxLoss(num_classes, dim, temperature=p.temperature)


SPEC = LossSpec(
    name="normalized_softmax",
    params=NormalizedSoftmaxParams,
    build=build,
    sampler="any",
    has_parameters=True,
    reference="Zhai & Wu, BMVC 2019",
)
