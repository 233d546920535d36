"""Loss registry over pytorch-metric-learning 2.9 (plus our own losses).

Adding a loss = one module named like the loss (``losses/<name>.py``, so DVC re-runs only
that loss's stages when it changes) declaring ``SPEC``, plus one entry below.
"""

from dmlbench.losses import contrastive, multi_similarity, proxy_anchor, triplet
from dmlbench.losses.base import LossParams, LossSpec, ParametricLossParams

LOSSES: dict[str, LossSpec] = {
    spec.name: spec
    for spec in (
        contrastive.SPEC,
        triplet.SPEC,
        multi_similarity.SPEC,
        proxy_anchor.SPEC,
    )
}

__all__ = ["LOSSES", "LossParams", "LossSpec", "ParametricLossParams"]
