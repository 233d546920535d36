"""Multi-Similarity loss without its pair miner (the Reality Check's "MS" row, beside "MS+Miner"):
L = 1/alpha log(1 + sum_p exp(-alpha (S_ip - base))) + 1/beta log(1 + sum_n exp(beta (S_in - base)))
over every pair of the batch, S = cosine similarity (PML ``MultiSimilarityLoss``). Defaults as
``multi_similarity`` (thesis Table 4: alpha 2, beta 50, base 0.5)."""

from pydantic import PositiveFloat

from dmlbench.losses.base import LossModule, LossParams, LossSpec
from dmlbench.losses.search import FloatRange


class MultiSimilarityWithoutMinerParams(LossParams):
    alpha: PositiveFloat = 2.0
    beta: PositiveFloat = 50.0
    base: float = 0.5  # the margin lambda of the paper


def build(p: MultiSimilarityWithoutMinerParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import MultiSimilarityLoss

    return MultiSimilarityLoss(alpha=p.alpha, beta=p.beta, base=p.base)


# The Reality Check's "MS" bounds, all linear: alpha [0.01, 100] (CUB: from 1e-3), beta [0.01, 100],
# base [0, 1] (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_multi_similarity.html)
SEARCH_SPACE = {"alpha": FloatRange(1e-3, 100.0), "beta": FloatRange(0.01, 100.0), "base": FloatRange(0.0, 1.0)}

SPEC = LossSpec(
    name="multi_similarity_without_miner",
    params=MultiSimilarityWithoutMinerParams,
    build=build,
    reference="Wang et al., CVPR 2019 (loss only, as the Reality Check's 'MS')",
    search_space=SEARCH_SPACE,
)
