"""N-pair loss (Sohn, NeurIPS 2016): one positive pair per class in the batch,
L = CE(softmax_j(f_i . f_j^+), i) over the N anchors (PML ``NPairsLoss``), no mining (thesis
Table 5). The l2 embedding penalty (thesis Table 4: 0.02) is PML's ``LpRegularizer``; on the
L2-normalised embeddings every dmlbench model outputs it is a constant, as in the thesis code."""

from pydantic import NonNegativeFloat

from dmlbench.losses.base import LossModule, LossParams, LossSpec


class NPairParams(LossParams):
    l2_reg_weight: NonNegativeFloat = 0.02  # thesis Table 4


def build(p: NPairParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import NPairsLoss
    from pytorch_metric_learning.regularizers import LpRegularizer

    if p.l2_reg_weight == 0:
        return NPairsLoss()
    return NPairsLoss(embedding_regularizer=LpRegularizer(), embedding_reg_weight=p.l2_reg_weight)


# No search space: the only hyperparameter, l2_reg_weight, has no effect on the L2-normalised embeddings
# (see above), and PML's NPairsLoss has no other. The Reality Check did not run N-pair.
SPEC = LossSpec(name="npair", params=NPairParams, build=build, reference="Sohn, NeurIPS 2016")
