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

from dmlbench.errors import ConfigError
from dmlbench.losses.base import LossParams, LossSpec, lazy_loss_class
from dmlbench.losses.search import FloatRange


def _define() -> type:
    """Define the loss on first use, so that validating params.yaml does not import PML."""
    import torch
    from pytorch_metric_learning.losses import SmoothAPLoss
    from pytorch_metric_learning.utils import common_functions as c_f
    from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

    class LabelledSmoothAPLoss(SmoothAPLoss):
        """PML's ``SmoothAPLoss`` with each query's positives read from the labels (module docstring)."""

        checked = False  # the batch layout is checked once: every batch of a run has the same one

        def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
            c_f.labels_required(labels)
            c_f.ref_not_supported(embeddings, labels, ref_emb, ref_labels)
            same = (labels.unsqueeze(0) == labels.unsqueeze(1)).to(embeddings.dtype)  # [q, j]: j in P_q
            if not self.checked:
                if int(same.sum(dim=1).min()) < 2:
                    raise ConfigError(
                        "smooth_ap needs >= 2 images of each class in a batch (protocol samples_per_class >= 2)"
                    )
                self.checked = True
            sims = self.distance(embeddings)  # s_qj
            diff = sims.unsqueeze(1) - sims.unsqueeze(2)  # [q, i, j] = s_qj - s_qi
            others = 1.0 - torch.eye(len(labels), dtype=sims.dtype, device=sims.device)  # [i, j]: j != i
            soft = torch.sigmoid(diff / self.temperature) * others
            rank_all = 1.0 + soft.sum(dim=-1)  # [q, i]
            rank_pos = 1.0 + (soft * same.unsqueeze(1)).sum(dim=-1)
            ap = (same * rank_pos / rank_all).sum(dim=1) / same.sum(dim=1)
            loss = (1.0 - ap) * lmu.convert_to_weights(indices_tuple, labels, dtype=ap.dtype)
            indices = c_f.torch_arange_from_size(loss)
            return {"ap_loss": {"losses": loss, "indices": indices, "reduction_type": "element"}}

    return LabelledSmoothAPLoss


# the class, defined on first use; and the module's __getattr__ (PEP 562), so it imports by name
_define_loss_class, __getattr__ = lazy_loss_class(__name__, "LabelledSmoothAPLoss", _define)


class SmoothAPParams(LossParams):
    temperature: PositiveFloat = 0.01  # t of the sigmoid


def build(p: SmoothAPParams, num_classes: int, dim: int):
    return _define_loss_class()(temperature=p.temperature)


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
