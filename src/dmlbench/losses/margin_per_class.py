"""Margin loss with one learnable beta per training class (Wu et al., ICCV 2017, §4: "beta^(class)";
the Reality Check's "Margin / class" row): L = [d_ap - beta_y(a) + m]_+ + [beta_y(a) - d_an + m]_+
(PML ``MarginLoss(learn_beta=True, num_classes=C)``), the betas trained by their own optimiser.

No miner by default: the Reality Check ran it on every pair of the batch, and the thesis did not
run it (``miner: true`` adds the distance-weighted miner of ``margin``). Defaults otherwise as
``margin`` (thesis Table 4: margin 0.5, beta 1.2, betas' lr 5e-5 absolute). The module does
not import ``losses/margin.py``: a loss's stages read its own module only (their inputs manifests), so
editing one Margin variant must not leave the other's results stale or re-run them."""

from __future__ import annotations

from pydantic import NonNegativeFloat, PositiveFloat

from dmlbench.losses.base import LossModule, LossSpec, Miner, ParametricLossParams
from dmlbench.losses.search import PARAM_LR, FloatRange


class MarginPerClassParams(ParametricLossParams):
    margin: NonNegativeFloat = 0.5
    beta: float = 1.2  # initial value of every class's beta
    nu: NonNegativeFloat = 0.0
    miner: bool = False
    miner_cutoff: PositiveFloat = 0.5
    miner_nonzero_loss_cutoff: PositiveFloat = 1.4
    param_lr: PositiveFloat | None = 5e-5  # absolute, as margin's beta lr (thesis Table 4)


def build(p: MarginPerClassParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import MarginLoss

    return MarginLoss(margin=p.margin, nu=p.nu, beta=p.beta, learn_beta=True, num_classes=num_classes)


def build_miner(p: MarginPerClassParams) -> Miner | None:
    from pytorch_metric_learning.miners import DistanceWeightedMiner

    if not p.miner:
        return None
    return DistanceWeightedMiner(cutoff=p.miner_cutoff, nonzero_loss_cutoff=p.miner_nonzero_loss_cutoff)


# The Reality Check's bounds, the same on CUB200/Cars196/SOP (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_margin_param_per_class_no_weight_decay.html): margin [-0.2, 2],
# clipped to 0 (NonNegativeFloat); initial beta [-0.2, 2]; betas' lr PARAM_LR. Not searched: nu, the miner
SEARCH_SPACE = {"margin": FloatRange(0.0, 2.0), "beta": FloatRange(-0.2, 2.0), "param_lr": PARAM_LR}

SPEC = LossSpec(
    name="margin_per_class",
    params=MarginPerClassParams,
    build=build,
    build_miner=build_miner,
    reference="Wu, Manmatha, Smola & Kraehenbuehl, ICCV 2017 (one beta per class)",
    search_space=SEARCH_SPACE,
)
