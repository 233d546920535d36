"""FastAP (Cakir, He, Xia, Kulis & Sclaroff, CVPR 2019): 1 - a histogram approximation of the
average precision of each anchor's ranking, distances binned into ``num_bins`` soft bins (PML
``FastAPLoss``). 10 bins = the paper's and PML's default. No mining."""

from pydantic import Field

from dmlbench.losses.base import LossParams, LossSpec


class FastAPParams(LossParams):
    num_bins: int = Field(10, ge=2)


def build(p: FastAPParams, num_classes: int, dim: int):
    from pytorch_metric_learning.losses import FastAPLoss

    return FastAPLoss(num_bins=p.num_bins)


SPEC = LossSpec(name="fastap", params=FastAPParams, build=build, reference="Cakir et al., CVPR 2019")
