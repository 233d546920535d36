"""Margin loss (Wu, Manmatha, Smola & Kraehenbuehl, ICCV 2017) with distance-weighted sampling
(thesis Table 5): L = [d_ap - beta + m]_+ + [beta - d_an + m]_+ (PML ``MarginLoss``), one
learnable beta trained by its own optimiser at 5e-5, absolute (thesis Table 4, "beta lr 0.00005",
whatever the base lr). One beta per class is the separate registry entry ``margin_per_class`` (the
Reality Check's "Margin / class").

Defaults thesis Table 4 (margin 0.5, beta 1.2); the thesis code and the paper use margin 0.2, and
the thesis code never trains beta (PML ``MarginLoss`` without ``learn_beta``; its ``train.py`` gives
the optimiser no loss parameters but Proxy-Anchor's and SoftTriple's): we follow Table 4.
Miner: ``DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)`` as in the thesis code;
``miner: false`` uses every pair of the batch (the Reality Check ran it without a miner)."""

from __future__ import annotations

from pydantic import NonNegativeFloat, PositiveFloat

from dmlbench.losses.base import LossModule, LossSpec, Miner, ParametricLossParams
from dmlbench.losses.search import PARAM_LR, FloatRange


class MarginParams(ParametricLossParams):
    margin: NonNegativeFloat = 0.5  # thesis Table 4
    beta: float = 1.2  # initial boundary between positives and negatives
    nu: NonNegativeFloat = 0.0  # beta regularisation
    miner: bool = True
    miner_cutoff: PositiveFloat = 0.5
    miner_nonzero_loss_cutoff: PositiveFloat = 1.4
    param_lr: PositiveFloat | None = 5e-5  # beta lr, absolute (thesis Table 4)


def build(p: MarginParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import MarginLoss

    return MarginLoss(margin=p.margin, nu=p.nu, beta=p.beta, learn_beta=True)


def build_miner(p: MarginParams) -> Miner | None:
    from pytorch_metric_learning.miners import DistanceWeightedMiner

    if not p.miner:
        return None
    return DistanceWeightedMiner(cutoff=p.miner_cutoff, nonzero_loss_cutoff=p.miner_nonzero_loss_cutoff)


# The Reality Check's bounds, the same on CUB200/Cars196/SOP (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_margin_no_weight_decay.html): margin [-0.2, 2], clipped to 0
# (NonNegativeFloat); initial beta [-0.2, 2]; beta lr PARAM_LR. Not searched: nu, the miner switches
SEARCH_SPACE = {"margin": FloatRange(0.0, 2.0), "beta": FloatRange(-0.2, 2.0), "param_lr": PARAM_LR}

SPEC = LossSpec(
    name="margin",
    params=MarginParams,
    build=build,
    build_miner=build_miner,
    reference="Wu, Manmatha, Smola & Kraehenbuehl, ICCV 2017",
    search_space=SEARCH_SPACE,
)
