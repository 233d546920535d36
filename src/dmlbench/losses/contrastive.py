"""Contrastive loss: L = [d_p - m_pos]_+ + [m_neg - d_n]_+ over all pairs in the batch,
d = Euclidean distance of L2-normalised embeddings, each term averaged over its non-zero pairs
(PML ``ContrastiveLoss``). No mining (thesis Table 5).

A negative ``pos_margin`` is allowed: the Reality Check's tuned CUB200 value is -0.2 (its search
range included negative values). Since d_p >= 0, [d_p + 0.2]_+ = d_p + 0.2: the same gradient as
m_pos = 0 for every pair with d_p > 0 (powerful-benchmarker, docs/papers/mlrc.md, FAQ)."""

from pydantic import NonNegativeFloat, model_validator

from dmlbench.losses.base import LossModule, LossParams, LossSpec
from dmlbench.losses.search import FloatRange


class ContrastiveParams(LossParams):
    pos_margin: float = 0.0
    neg_margin: NonNegativeFloat = 0.5  # thesis Table 4: margin 0.5

    @model_validator(mode="after")
    def _ordered(self) -> "ContrastiveParams":
        if self.pos_margin >= self.neg_margin:
            raise ValueError(f"pos_margin ({self.pos_margin}) must be < neg_margin ({self.neg_margin})")
        return self


def build(p: ContrastiveParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import ContrastiveLoss

    return ContrastiveLoss(pos_margin=p.pos_margin, neg_margin=p.neg_margin)


# The Reality Check's bounds, the same on CUB200/Cars196/SOP: pos_margin, neg_margin [-0.2, 2]
# (powerful-benchmarker (branch metric-learning), docs/papers/mlrc_plots/{cub,cars,sop}_contrastive.html);
# neg_margin clipped to 0 (NonNegativeFloat). A trial with pos_margin >= neg_margin is invalid (_ordered).
SEARCH_SPACE = {"pos_margin": FloatRange(-0.2, 2.0), "neg_margin": FloatRange(0.0, 2.0)}

SPEC = LossSpec(
    name="contrastive",
    params=ContrastiveParams,
    build=build,
    reference="Hadsell, Chopra & LeCun, CVPR 2006",
    search_space=SEARCH_SPACE,
)
