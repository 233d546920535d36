"""SoftTriple (Qian et al., ICCV 2019): K centres per class, class similarity
S_c = sum_k softmax_k(s_k / gamma) s_k, L = CE(la (S - delta [c = y])) plus tau x the paper's
centre regulariser (PML ``SoftTripleLoss`` + ``SparseCentersRegularizer``).

Thesis Table 4: la 20, 1/gamma 10 (gamma 0.1), tau 0.2, margin 0.1, centres lr 1e-4 (1x); the
paper and the thesis code use delta 0.01. K = 10 centres per class (paper, PML default)."""

from pydantic import NonNegativeFloat, PositiveFloat, PositiveInt

from dmlbench.losses.base import LossSpec, ParametricLossParams


class SoftTripleParams(ParametricLossParams):
    centers_per_class: PositiveInt = 10
    la: PositiveFloat = 20.0  # scale lambda
    gamma: PositiveFloat = 0.1  # the paper's gamma; Table 4 lists 1/gamma = 10
    margin: NonNegativeFloat = 0.1  # delta; thesis Table 4
    tau: NonNegativeFloat = 0.2  # weight of the centre regulariser


def build(p: SoftTripleParams, num_classes: int, dim: int):
    from pytorch_metric_learning.losses import SoftTripleLoss
    from pytorch_metric_learning.regularizers import SparseCentersRegularizer

    regularizer = {}
    if p.tau > 0 and p.centers_per_class > 1:
        regularizer = {
            "weight_regularizer": SparseCentersRegularizer(num_classes, p.centers_per_class),
            "weight_reg_weight": p.tau,
        }
    return SoftTripleLoss(
        num_classes, dim, centers_per_class=p.centers_per_class, la=p.la, gamma=p.gamma, margin=p.margin, **regularizer
    )


SPEC = LossSpec(
    name="soft_triple",
    params=SoftTripleParams,
    build=build,
    sampler="any",
    has_parameters=True,
    reference="Qian et al., ICCV 2019",
)
