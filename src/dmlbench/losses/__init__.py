"""Loss registry over pytorch-metric-learning 2.9 (plus our own losses).

Adding a loss = one module named like the loss (``losses/<name>.py``, so DVC re-runs only
that loss's stages when it changes) declaring ``SPEC``, plus one entry below. A loss class of
our own goes to ``losses/_impl/<name>.py``, which the module imports inside its ``build()``.
"""

from dmlbench.losses import (
    arcface,
    circle,
    contrastive,
    cosface,
    fastap,
    hyp_vit_sphere,
    lifted_structure,
    margin,
    margin_per_class,
    multi_similarity,
    multi_similarity_without_miner,
    normalized_softmax,
    npair,
    ntxent,
    proxy_anchor,
    proxy_nca,
    smooth_ap,
    snr,
    soft_triple,
    subcenter_arcface,
    supcon,
    thesis_proxy,
    triplet,
    tuplet_margin,
)
from dmlbench.losses.base import LossParams, LossSpec, ParametricLossParams

LOSSES: dict[str, LossSpec] = {
    spec.name: spec
    for spec in (
        contrastive.SPEC,
        triplet.SPEC,
        lifted_structure.SPEC,
        npair.SPEC,
        proxy_nca.SPEC,
        margin.SPEC,
        margin_per_class.SPEC,
        arcface.SPEC,
        cosface.SPEC,
        multi_similarity.SPEC,
        multi_similarity_without_miner.SPEC,
        soft_triple.SPEC,
        proxy_anchor.SPEC,
        circle.SPEC,
        ntxent.SPEC,
        fastap.SPEC,
        snr.SPEC,
        normalized_softmax.SPEC,
        thesis_proxy.SPEC,
        smooth_ap.SPEC,
        supcon.SPEC,
        tuplet_margin.SPEC,
        subcenter_arcface.SPEC,
        hyp_vit_sphere.SPEC,
    )
}

__all__ = ["LOSSES", "LossParams", "LossSpec", "ParametricLossParams"]
