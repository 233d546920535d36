"""Tuplet margin loss (Yu & Tao, ICCV 2019): for every positive pair (a, p) of the batch, with
theta the angle between L2-normalised embeddings and N_a the batch samples of other classes,
L_ap = log(1 + sum_{n in N_a} exp(s (cos theta_an - cos(theta_ap - beta)))),
averaged over the positive pairs (PML ``TupletMarginLoss``; cosine similarity only). beta, the
slack margin on the positives, 0.1 rad = 5.73 degrees is the paper's (PML docs/losses.md,
TupletMarginLoss); s 64 is PML's default. The paper adds an intra-pair variance term
(PML ``IntraPairVarianceLoss``); this entry is the tuplet margin term alone, as PML's class is.
No mining.

One guard: PML takes ``acos`` of the positive pairs' cosines, which is NaN when rounding puts a
cosine above 1 and has an infinite gradient at 1, as for two copies of one image
(``MPerClassSampler`` draws with replacement from a class with fewer than ``samples_per_class``
images). Cosines are clamped to [-1 + eps, 1 - eps] (eps = the dtype's machine epsilon) first;
elsewhere the loss is PML's, unchanged."""

from __future__ import annotations

from pydantic import NonNegativeFloat, PositiveFloat

from dmlbench.losses.base import LossModule, LossParams, LossSpec
from dmlbench.losses.search import FloatRange


class TupletMarginParams(LossParams):
    margin: NonNegativeFloat = 5.73  # beta, degrees (0.1 rad, the paper's)
    scale: PositiveFloat = 64.0  # s (PML's default)


def build(p: TupletMarginParams, num_classes: int, dim: int) -> LossModule:
    from dmlbench.losses._impl.tuplet_margin import ClampedTupletMarginLoss

    return ClampedTupletMarginLoss(margin=p.margin, scale=p.scale)


# Not searched by the Reality Check; an angular margin in degrees on a scaled cosine, as ArcFace's, so
# RC's ArcFace bounds (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_arcface.html): margin [0, 90] degrees, scale [0.01, 200] (SOP: up to 300)
SEARCH_SPACE = {"margin": FloatRange(0.0, 90.0), "scale": FloatRange(0.01, 300.0)}

SPEC = LossSpec(
    name="tuplet_margin",
    params=TupletMarginParams,
    build=build,
    reference="Yu & Tao, ICCV 2019",
    search_space=SEARCH_SPACE,
)
