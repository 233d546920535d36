"""Supervised contrastive loss (Khosla et al., NeurIPS 2020), the paper's L^sup_out (its eq. 2):
for each anchor i of the batch, with P(i) the other samples of its class and A(i) = batch minus i,
L_i = -1/|P(i)| sum_{p in P(i)} log( exp(s_ip / t) / sum_{a in A(i)} exp(s_ia / t) ),
s = cosine similarity, averaged over the anchors with a non-zero loss (PML ``SupConLoss``, reducer
``AvgNonZeroReducer``: an anchor without a positive in the batch adds nothing). Unlike NT-Xent
(``ntxent``: one term per positive pair, with only that positive beside the negatives in its
denominator), every other sample of the batch is in the denominator. Temperature 0.1 = the
paper's (PML docs/losses.md, SupConLoss: "The paper uses 0.1") = PML's default. The paper forms
positives from two augmented views of each image; here they are the batch's other images of the
class (``m_per_class`` batches), as PML computes it. No mining."""

from pydantic import PositiveFloat

from dmlbench.losses.base import LossModule, LossParams, LossSpec
from dmlbench.losses.search import FloatRange


class SupConParams(LossParams):
    temperature: PositiveFloat = 0.1


def build(p: SupConParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import SupConLoss

    return SupConLoss(temperature=p.temperature)


# Not searched by the Reality Check; the same kind of temperature as NT-Xent's, so RC's NT-Xent bound:
# temperature log [1e-5, 100] (powerful-benchmarker (branch metric-learning),
# docs/papers/mlrc_plots/{cub,cars,sop}_ntxent.html)
SEARCH_SPACE = {"temperature": FloatRange(1e-5, 100.0, log=True)}

SPEC = LossSpec(
    name="supcon",
    params=SupConParams,
    build=build,
    reference="Khosla et al., NeurIPS 2020",
    search_space=SEARCH_SPACE,
)
