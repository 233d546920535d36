"""NT-Xent / InfoNCE (Sohn 2016; Chen et al., ICML 2020), supervised: for every positive pair,
L = -log(exp(s_ap / t) / (exp(s_ap / t) + sum_n exp(s_an / t))), s = cosine similarity (PML
``NTXentLoss``). Temperature 0.07 = PML default. No mining."""

from pydantic import PositiveFloat

from dmlbench.losses.base import LossModule, LossParams, LossSpec
from dmlbench.losses.search import FloatRange


class NTXentParams(LossParams):
    temperature: PositiveFloat = 0.07


def build(p: NTXentParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import NTXentLoss

    return NTXentLoss(temperature=p.temperature)


# The Reality Check's bound: temperature log [1e-5, 100] (CUB: from 1e-4) (powerful-benchmarker
# (branch metric-learning), docs/papers/mlrc_plots/{cub,cars,sop}_ntxent.html)
SEARCH_SPACE = {"temperature": FloatRange(1e-5, 100.0, log=True)}

SPEC = LossSpec(
    name="ntxent",
    params=NTXentParams,
    build=build,
    reference="Sohn, NeurIPS 2016; Chen et al., ICML 2020",
    search_space=SEARCH_SPACE,
)
