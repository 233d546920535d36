"""Triplet margin loss: L = [d_ap - d_an + m]_+ on semi-hard triplets (thesis Table 5),
d = Euclidean distance of L2-normalised embeddings, averaged over the triplets with a non-zero
loss (PML ``TripletMarginLoss``). ``miner: false`` uses every triplet of the batch (the Reality
Check ran it without a miner)."""

from pydantic import NonNegativeFloat

from dmlbench.losses.base import LossParams, LossSpec


class TripletParams(LossParams):
    margin: NonNegativeFloat = 0.1  # thesis Table 4
    miner: bool = True
    miner_margin: NonNegativeFloat = 0.1  # semi-hard band; keep equal to margin (PML #466)


def build(p: TripletParams, num_classes: int, dim: int):
    from pytorch_metric_learning.losses import TripletMarginLoss

    return TripletMarginLoss(margin=p.margin)


def build_miner(p: TripletParams):
    from pytorch_metric_learning.miners import TripletMarginMiner

    if not p.miner:
        return None
    return TripletMarginMiner(margin=p.miner_margin, type_of_triplets="semihard")


SPEC = LossSpec(
    name="triplet",
    params=TripletParams,
    build=build,
    build_miner=build_miner,
    reference="Weinberger & Saul, JMLR 2009; Schroff et al. (semi-hard mining), CVPR 2015",
)
