"""Smooth-AP (Brown, Xie, Kalogeiton & Zisserman, ECCV 2020): 1 - a smoothed average precision of
each query's ranking of the batch. With s = cosine similarity, sg(x) = sigmoid(x / t),
P_q = the batch samples of q's class (q included, as in the authors' code) and B the batch,

  R_all(q, i) = 1 + sum_{j in B, j != i} sg(s_qj - s_qi)     (i's smoothed rank among the batch),
  R_pos(q, i) = 1 + sum_{j in P_q, j != i} sg(s_qj - s_qi)   (among q's positives),
  AP_q = 1/|P_q| sum_{i in P_q} R_pos(q, i) / R_all(q, i),    L = mean_q (1 - AP_q).

t 0.01: the authors' example (Andrew-Brown1/Smooth_AP ``src/Smooth_AP_loss.py``) and PML's
default (pytorch-metric-learning PR #721). No mining; ``m_per_class`` batches.

Why not PML 2.9's ``SmoothAPLoss`` as it is: it takes each run of C consecutive samples (C = the
classes in the batch) as one class, right only for square batches (C = images per class); on the
demo's 8 x 4 batches it ranks the wrong positives (tests/test_losses_newer.py). Here positives
come from the labels; the rest is PML's class, and equals it on square batches. A protocol with
``samples_per_class: 1`` (AP_q ~ 1 whatever the embedding) is refused in one line at the first batch."""

from __future__ import annotations

from pydantic import PositiveFloat

from dmlbench.losses.base import LossModule, LossParams, LossSpec
from dmlbench.losses.search import FloatRange


class SmoothAPParams(LossParams):
    temperature: PositiveFloat = 0.01  # t of the sigmoid


def build(p: SmoothAPParams, num_classes: int, dim: int) -> LossModule:
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
