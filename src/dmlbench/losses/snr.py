"""Signal-to-noise-ratio contrastive loss (Yuan et al., CVPR 2019): contrastive loss with
d(a, x) = Var(a - x) / Var(a), L = [d_ap - m_pos]_+ + [m_neg - d_an]_+, plus the paper's
zero-mean embedding regulariser (PML ``SignalToNoiseRatioContrastiveLoss`` +
``ZeroMeanRegularizer``; margins and weight 1 = PML defaults). No mining."""

from pydantic import NonNegativeFloat

from dmlbench.losses.base import LossParams, LossSpec


class SNRParams(LossParams):
    pos_margin: NonNegativeFloat = 0.0
    neg_margin: NonNegativeFloat = 1.0
    zero_mean_reg_weight: NonNegativeFloat = 1.0


def build(p: SNRParams, num_classes: int, dim: int):
    from pytorch_metric_learning.losses import SignalToNoiseRatioContrastiveLoss
    from pytorch_metric_learning.regularizers import ZeroMeanRegularizer

    regularizer = {}
    if p.zero_mean_reg_weight > 0:
        regularizer = {"embedding_regularizer": ZeroMeanRegularizer(), "embedding_reg_weight": p.zero_mean_reg_weight}
    return SignalToNoiseRatioContrastiveLoss(pos_margin=p.pos_margin, neg_margin=p.neg_margin, **regularizer)


SPEC = LossSpec(name="snr", params=SNRParams, build=build, reference="Yuan et al., CVPR 2019")
