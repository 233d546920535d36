"""Lifted Structure loss (Song et al., CVPR 2016) on hard-mined pairs (thesis Table 5: "hard"):
J_ij = log(sum_{(i,k) neg} exp(m - d_ik) + sum_{(j,l) neg} exp(m - d_jl)) + d_ij over positive
pairs (i, j), L = 1/(2|P|) sum [J_ij]_+^2 (PML ``LiftedStructureLoss``), d = Euclidean distance.

"Hard" mining is the thesis code's rule (billpsomas/deep_metric_learning_benchmark,
``losses.py``): keep negatives with s_n + eps > min s_p and positives with s_p - eps < max s_n,
eps = 0.1, which is PML's ``MultiSimilarityMiner``."""

from pydantic import NonNegativeFloat

from dmlbench.losses.base import LossParams, LossSpec


class LiftedStructureParams(LossParams):
    neg_margin: NonNegativeFloat = 0.5  # thesis Table 4: margin 0.5
    pos_margin: NonNegativeFloat = 0.0
    miner_epsilon: NonNegativeFloat = 0.1  # hard pair mining band (thesis code)


def build(p: LiftedStructureParams, num_classes: int, dim: int):
    from pytorch_metric_learning.losses import LiftedStructureLoss

    return LiftedStructureLoss(neg_margin=p.neg_margin, pos_margin=p.pos_margin)


def build_miner(p: LiftedStructureParams):
    from pytorch_metric_learning.miners import MultiSimilarityMiner

    return MultiSimilarityMiner(epsilon=p.miner_epsilon)


SPEC = LossSpec(
    name="lifted_structure",
    params=LiftedStructureParams,
    build=build,
    build_miner=build_miner,
    reference="Oh Song, Xiang, Jegelka & Savarese, CVPR 2016",
)
