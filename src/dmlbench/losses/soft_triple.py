"""SoftTriple (Qian et al., ICCV 2019): K centres per class, class similarity
S_c = sum_k softmax_k(s_k / gamma) s_k, L = CE(la (S - delta [c = y])) plus tau x the paper's
centre regulariser (PML ``SoftTripleLoss`` + ``SparseCentersRegularizer``).

Thesis Table 4: la 20, 1/gamma 10 (gamma 0.1), tau 0.2, margin 0.1, centres ("weights") lr 1e-4,
absolute (whatever the base lr); the paper and the thesis code use delta 0.01. K = 10 centres per
class (paper, PML default). The thesis code differs from Table 4: K = 2, tau 0.4 and the centres
at 100 x the lr (billpsomas/deep_metric_learning_benchmark ``losses.py`` ``SoftTripleLoss``,
``train.py``); we follow Table 4."""

from pydantic import NonNegativeFloat, PositiveFloat, PositiveInt

from dmlbench.losses.base import LossModule, LossSpec, ParametricLossParams
from dmlbench.losses.search import PARAM_LR, FloatRange


class SoftTripleParams(ParametricLossParams):
    centers_per_class: PositiveInt = 10
    la: PositiveFloat = 20.0  # scale lambda
    gamma: PositiveFloat = 0.1  # the paper's gamma; Table 4 lists 1/gamma = 10
    margin: NonNegativeFloat = 0.1  # delta; thesis Table 4
    tau: NonNegativeFloat = 0.2  # weight of the centre regulariser
    param_lr: PositiveFloat | None = 1e-4  # centres lr, absolute (thesis Table 4)


def build(p: SoftTripleParams, num_classes: int, dim: int) -> LossModule:
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


# The Reality Check's bounds, all linear (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_soft_triple.html): la [0.01, 100] (SOP: up to 200), gamma [0.01, 100]
# (CUB: from 1e-4), margin [0, 1], centres lr PARAM_LR; tau = 2 x RC's reg_weight [0, 1] (CUB, Cars; SOP
# did not search it). centers_per_class was fixed.
SEARCH_SPACE = {
    "la": FloatRange(0.01, 200.0),
    "gamma": FloatRange(1e-4, 100.0),
    "tau": FloatRange(0.0, 2.0),
    "margin": FloatRange(0.0, 1.0),
    "param_lr": PARAM_LR,
}

SPEC = LossSpec(
    name="soft_triple",
    params=SoftTripleParams,
    build=build,
    sampler="any",
    reference="Qian et al., ICCV 2019",
    search_space=SEARCH_SPACE,
)
