"""Multi-Similarity loss with its pair miner (Wang et al., CVPR 2019):
L = 1/alpha log(1 + sum_p exp(-alpha (S_ip - base))) + 1/beta log(1 + sum_n exp(beta (S_in - base))),
S = cosine similarity; the miner keeps negatives with S_in > min_p S_ip - epsilon and
positives with S_ip < max_n S_in + epsilon."""

from pydantic import NonNegativeFloat, PositiveFloat

from dmlbench.losses.base import LossParams, LossSpec


class MultiSimilarityParams(LossParams):
    alpha: PositiveFloat = 2.0  # thesis Table 4
    beta: PositiveFloat = 50.0
    base: float = 0.5  # the margin lambda of the paper
    miner_epsilon: NonNegativeFloat = 0.1


def build(p: MultiSimilarityParams, num_classes: int, dim: int):
    from pytorch_metric_learning.losses import MultiSimilarityLoss

    return MultiSimilarityLoss(alpha=p.alpha, beta=p.beta, base=p.base)


def build_miner(p: MultiSimilarityParams):
    from pytorch_metric_learning.miners import MultiSimilarityMiner

    return MultiSimilarityMiner(epsilon=p.miner_epsilon)


SPEC = LossSpec(
    name="multi_similarity",
    params=MultiSimilarityParams,
    build=build,
    build_miner=build_miner,
    reference="Wang et al., CVPR 2019",
)
