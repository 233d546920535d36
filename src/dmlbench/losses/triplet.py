"""Triplet margin loss: L = [d_ap - d_an + m]_+ on semi-hard triplets (thesis Table 5),
d = Euclidean distance of L2-normalised embeddings, averaged over the triplets with a non-zero
loss (PML ``TripletMarginLoss``). ``miner: false`` uses every triplet of the batch (the Reality
Check ran it without a miner)."""

from __future__ import annotations

from pydantic import NonNegativeFloat

from dmlbench.losses.base import LossModule, LossParams, LossSpec, Miner
from dmlbench.losses.search import FloatRange


class TripletParams(LossParams):
    margin: NonNegativeFloat = 0.1  # thesis Table 4
    miner: bool = True
    miner_margin: NonNegativeFloat | None = None  # semi-hard band; None = margin (PML #466: keep them equal)


def build(p: TripletParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import TripletMarginLoss

    return TripletMarginLoss(margin=p.margin)


def build_miner(p: TripletParams) -> Miner | None:
    from pytorch_metric_learning.miners import TripletMarginMiner

    if not p.miner:
        return None
    margin = p.margin if p.miner_margin is None else p.miner_margin
    return TripletMarginMiner(margin=margin, type_of_triplets="semihard")


# The Reality Check's bound, the same on CUB200/Cars196/SOP: margin [-0.2, 2], clipped to 0
# (NonNegativeFloat) (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_triplet.html); RC ran no miner, and ``miner`` is not searched
SEARCH_SPACE = {"margin": FloatRange(0.0, 2.0)}

SPEC = LossSpec(
    name="triplet",
    params=TripletParams,
    build=build,
    build_miner=build_miner,
    reference="Weinberger & Saul, JMLR 2009; Schroff et al. (semi-hard mining), CVPR 2015",
    search_space=SEARCH_SPACE,
)
