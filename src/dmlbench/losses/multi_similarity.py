"""Multi-Similarity loss with its pair miner (Wang et al., CVPR 2019):
L = 1/alpha log(1 + sum_p exp(-alpha (S_ip - base))) + 1/beta log(1 + sum_n exp(beta (S_in - base))),
S = cosine similarity; the miner keeps negatives with S_in > min_p S_ip - epsilon and
positives with S_ip < max_n S_in + epsilon. Defaults thesis Table 4; the committed thesis code
hard-codes alpha 17.97, beta 75.66, base 0.77, epsilon 0.39 instead (near its Table 15 optimum;
billpsomas/deep_metric_learning_benchmark ``losses.py``, Table 4's values commented out)."""

from __future__ import annotations

from pydantic import NonNegativeFloat, PositiveFloat

from dmlbench.losses.base import LossModule, LossParams, LossSpec, Miner
from dmlbench.losses.search import FloatRange


class MultiSimilarityParams(LossParams):
    alpha: PositiveFloat = 2.0  # thesis Table 4
    beta: PositiveFloat = 50.0
    base: float = 0.5  # the margin lambda of the paper
    miner_epsilon: NonNegativeFloat = 0.1


def build(p: MultiSimilarityParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import MultiSimilarityLoss

    return MultiSimilarityLoss(alpha=p.alpha, beta=p.beta, base=p.base)


def build_miner(p: MultiSimilarityParams) -> Miner | None:
    from pytorch_metric_learning.miners import MultiSimilarityMiner

    return MultiSimilarityMiner(epsilon=p.miner_epsilon)


# The Reality Check's "MS+Miner" bounds, all linear: alpha [0.01, 100], beta [0.01, 100] (SOP: up to
# 200), base [0, 1], miner epsilon [0, 1] (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_multi_similarity_with_ms_miner.html)
SEARCH_SPACE = {
    "alpha": FloatRange(0.01, 100.0),
    "beta": FloatRange(0.01, 200.0),
    "base": FloatRange(0.0, 1.0),
    "miner_epsilon": FloatRange(0.0, 1.0),
}

SPEC = LossSpec(
    name="multi_similarity",
    params=MultiSimilarityParams,
    build=build,
    build_miner=build_miner,
    reference="Wang et al., CVPR 2019",
    search_space=SEARCH_SPACE,
)
