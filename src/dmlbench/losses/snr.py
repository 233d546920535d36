"""Signal-to-noise-ratio contrastive loss (Yuan et al., CVPR 2019): contrastive loss with
d(a, x) = Var(a - x) / Var(a), L = [d_ap - m_pos]_+ + [m_neg - d_an]_+, plus the paper's
zero-mean embedding regulariser (PML ``SignalToNoiseRatioContrastiveLoss`` +
``ZeroMeanRegularizer``; margins and weight 1 = PML defaults). No mining."""

from pydantic import NonNegativeFloat

from dmlbench.losses.base import LossModule, LossParams, LossSpec
from dmlbench.losses.search import FloatRange


class SNRParams(LossParams):
    pos_margin: NonNegativeFloat = 0.0
    neg_margin: NonNegativeFloat = 1.0
    zero_mean_reg_weight: NonNegativeFloat = 1.0


def build(p: SNRParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import SignalToNoiseRatioContrastiveLoss
    from pytorch_metric_learning.regularizers import ZeroMeanRegularizer

    regularizer = {}
    if p.zero_mean_reg_weight > 0:
        regularizer = {"embedding_regularizer": ZeroMeanRegularizer(), "embedding_reg_weight": p.zero_mean_reg_weight}
    return SignalToNoiseRatioContrastiveLoss(pos_margin=p.pos_margin, neg_margin=p.neg_margin, **regularizer)


# The Reality Check's bounds, the same on CUB200/Cars196/SOP: pos_margin, neg_margin [0, 2], regulariser
# weight [0, 1] (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_snr_contrastive.html)
SEARCH_SPACE = {
    "pos_margin": FloatRange(0.0, 2.0),
    "neg_margin": FloatRange(0.0, 2.0),
    "zero_mean_reg_weight": FloatRange(0.0, 1.0),
}

SPEC = LossSpec(
    name="snr", params=SNRParams, build=build, reference="Yuan et al., CVPR 2019", search_space=SEARCH_SPACE
)
