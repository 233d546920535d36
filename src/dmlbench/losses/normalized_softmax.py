"""Normalized Softmax (Zhai & Wu, BMVC 2019): softmax cross-entropy over W^T x / t with
normalised class weights W (learnable) and embeddings x (PML ``NormalizedSoftmaxLoss``).
Temperature 0.05 = the paper's value (PML default); weights at the protocol lr."""

from pydantic import PositiveFloat

from dmlbench.losses.base import LossModule, LossSpec, ParametricLossParams
from dmlbench.losses.search import PARAM_LR, FloatRange


class NormalizedSoftmaxParams(ParametricLossParams):
    temperature: PositiveFloat = 0.05


def build(p: NormalizedSoftmaxParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import NormalizedSoftmaxLoss

    return NormalizedSoftmaxLoss(num_classes, dim, temperature=p.temperature)


# The Reality Check's bounds, the same on CUB200/Cars196/SOP: temperature log [0.01, 100], weights lr
# PARAM_LR (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_normalized_softmax.html)
SEARCH_SPACE = {"temperature": FloatRange(0.01, 100.0, log=True), "param_lr": PARAM_LR}

SPEC = LossSpec(
    name="normalized_softmax",
    params=NormalizedSoftmaxParams,
    build=build,
    sampler="any",
    reference="Zhai & Wu, BMVC 2019",
    search_space=SEARCH_SPACE,
)
