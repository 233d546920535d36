"""FastAP (Cakir, He, Xia, Kulis & Sclaroff, CVPR 2019): 1 - a histogram approximation of the
average precision of each anchor's ranking, distances binned into ``num_bins`` soft bins (PML
``FastAPLoss``). 10 bins = the paper's and PML's default. No mining."""

from pydantic import Field

from dmlbench.losses.base import LossModule, LossParams, LossSpec
from dmlbench.losses.search import IntRange


class FastAPParams(LossParams):
    num_bins: int = Field(10, ge=2)


def build(p: FastAPParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import FastAPLoss

    return FastAPLoss(num_bins=p.num_bins)


# The Reality Check searched every number of bins 2..32 as a grid (batch 32; powerful-benchmarker
# (branch metric-learning), docs/papers/mlrc_plots/{cub,cars,sop}_fast_ap.png)
SEARCH_SPACE = {"num_bins": IntRange(2, 32)}

SPEC = LossSpec(
    name="fastap", params=FastAPParams, build=build, reference="Cakir et al., CVPR 2019", search_space=SEARCH_SPACE
)
