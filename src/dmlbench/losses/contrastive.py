"""Contrastive loss: L = [d_p - m_pos]_+ + [m_neg - d_n]_+ over all pairs in the batch,
d = Euclidean distance of L2-normalised embeddings. No mining (thesis Table 5)."""

from pydantic import NonNegativeFloat

from dmlbench.losses.base import LossParams, LossSpec


class ContrastiveParams(LossParams):
    pos_margin: NonNegativeFloat = 0.0
    neg_margin: NonNegativeFloat = 0.5  # thesis Table 4: margin 0.5


def build(p: ContrastiveParams, num_classes: int, dim: int):
    from pytorch_metric_learning.losses import ContrastiveLoss

    return ContrastiveLoss(pos_margin=p.pos_margin, neg_margin=p.neg_margin)


SPEC = LossSpec(
    name="contrastive", params=ContrastiveParams, build=build, reference="Hadsell, Chopra & LeCun, CVPR 2006"
)
