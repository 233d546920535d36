"""Smooth-AP (Brown, Xie, Kalogeiton & Zisserman, ECCV 2020): 1 - a smoothed average precision of
each query's ranking of the batch. With s = cosine similarity, sg(x) = sigmoid(x / t),
P_q = the batch samples of q's class (q included, as in the authors' code) and B the batch,

  R_all(q, i) = 1 + sum_{j in B, j != i} sg(s_qj - s_qi)     (i's smoothed rank among the batch),
  R_pos(q, i) = 1 + sum_{j in P_q, j != i} sg(s_qj - s_qi)   (among q's positives),
  AP_q = 1/|P_q| sum_{i in P_q} R_pos(q, i) / R_all(q, i),    L = mean_q (1 - AP_q).

t 0.01: the authors' code's example (Andrew-Brown1/Smooth_AP ``src/Smooth_AP_loss.py``,
``SmoothAP(0.01, 60, 6, 256)``) and PML's default, "values that resemble a heaviside step
function, as suggested by the authors" (pytorch-metric-learning PR #721). No mining; batches of
several images per class (``m_per_class``: ``batch_size / samples_per_class`` classes x
``samples_per_class`` images, PML ``MPerClassSampler``).

Why not PML 2.9's ``SmoothAPLoss`` as it is: it reshapes the batch into ``batch_size / C`` groups of
C consecutive samples (C = the number of classes in the batch) and takes each group as one class,
which is right only when C equals the images per class (a square batch, e.g. 3 x 3). On the 8 x 4
batches of the demo protocol it ranks the wrong positives (tests/test_losses_newer.py). PML's own
test hides it: it feeds the authors' code ``num_id = 6`` on labels of 10 classes x 6 images, so both
group by 10. Here the positives come from the labels (any order, any count per class); the rest is
PML's class (temperature, cosine only, reducer). It equals PML's value on square batches.

A batch needs >= 2 images of each class, or the query is its class's only member and AP_q is
about 1 whatever the embedding: a protocol with ``samples_per_class: 1`` is refused in one line at
the first batch (the loss does not see the protocol when it is built)."""

from __future__ import annotations

from pydantic import PositiveFloat

from dmlbench.losses.base import LossParams, LossSpec
from dmlbench.losses.search import FloatRange


class SmoothAPParams(LossParams):
    temperature: PositiveFloat = 0.01  # t of the sigmoid


def build(p: SmoothAPParams, num_classes: int, dim: int):
    from dmlbench.losses._impl.smooth_ap import LabelledSmoothAPLoss

    return LabelledSmoothAPLoss(temperature=p.temperature)


# Not searched by the Reality Check; its only temperature range, NT-Xent's, by analogy: temperature
# log [1e-5, 100] (powerful-benchmarker (branch metric-learning), docs/papers/mlrc_plots/{cub,cars,sop}_ntxent.html)
SEARCH_SPACE = {"temperature": FloatRange(1e-5, 100.0, log=True)}

SPEC = LossSpec(
    name="smooth_ap",
    params=SmoothAPParams,
    build=build,
    reference="Brown, Xie, Kalogeiton & Zisserman, ECCV 2020",
    search_space=SEARCH_SPACE,
)
