"""Hyp-ViT's pairwise cross-entropy on the sphere (Ermolov, Mirvakhabova, Khrulkov, Sebe & Oseledets,
"Hyperbolic Vision Transformers: Combining Improvements in Metric Learning", CVPR 2022): the loss of
its "Sph-" rows (``--hyp_c 0 --t 0.1``, htdt/hyp_metric ``README.md``), ``contrastive_loss`` of
``train.py`` with ``hyp_c == 0``.

A batch of C classes x m images, every class with the same count m >= 2 (Hyp-ViT's class-pass
sampler gives m = ``samples_per_class`` of C distinct classes). With z_c^i the unit-norm embedding of
class c's i-th image in the batch, s = cosine similarity and t the temperature, each ordered pair of
views (i, j), i != j, scores every class c against the other view's images and its own view's others:

  l_ij(c) = -log( exp(s(z_c^i, z_c^j) / t) /
                  (sum_k exp(s(z_c^i, z_k^j) / t) + sum_{k != c} exp(s(z_c^i, z_k^i) / t)) ),

  L = sum_{i != j} 1/C sum_c l_ij(c)      (a sum over the m(m - 1) ordered view pairs).

A view's images of other classes are negatives; the other images of c's own class in views other
than i and j take no part in l_ij. Images of one class are taken as views in their batch order.
t = 0.1: the sphere version's (``README.md``: "add --hyp_c 0 --t 0.1 for sphere version"; ``train.py``'s
default 0.2 is the hyperbolic one's). No miner; no parameters of its own.
"""

from __future__ import annotations

from pydantic import PositiveFloat

from dmlbench.losses.base import LossModule, LossParams, LossSpec
from dmlbench.losses.search import FloatRange


class HypViTSphereParams(LossParams):
    temperature: PositiveFloat = 0.1  # t; README.md's sphere version


def build(p: HypViTSphereParams, num_classes: int, dim: int) -> LossModule:
    from dmlbench.losses._impl.hyp_vit_sphere import HypViTSphereLoss

    return HypViTSphereLoss(temperature=p.temperature)


# Not searched by the Reality Check; its only temperature range, NT-Xent's, by analogy: temperature
# log [1e-5, 100] (powerful-benchmarker (branch metric-learning), docs/papers/mlrc_plots/{cub,cars,sop}_ntxent.html)
SEARCH_SPACE = {"temperature": FloatRange(1e-5, 100.0, log=True)}

SPEC = LossSpec(
    name="hyp_vit_sphere",
    params=HypViTSphereParams,
    build=build,
    reference="Ermolov, Mirvakhabova, Khrulkov, Sebe & Oseledets, CVPR 2022 (sphere version)",
    search_space=SEARCH_SPACE,
)
