"""Sub-center ArcFace (Deng, Guo, Liu, Gong & Zafeiriou, ECCV 2020): ArcFace with K learnable
sub-centres per class; a sample's cosine to class j is its largest over j's sub-centres,
cos theta_j = max_k cos(x, W_jk), then softmax over s cos(theta_j) with the target angle
theta_y + m (additive angular margin, m in degrees) (PML ``SubCenterArcFaceLoss``). K = 3,
m = 0.5 rad (28.6 degrees) and s = 64 are the paper's (= PML's defaults). The paper's second
stage (drop the non-dominant sub-centres and the samples far from the dominant one, PML
``get_outliers``) is not run: this entry trains the K sub-centres throughout, as PML's loss does.
Not in the thesis. The sub-centres are class proxies: they train at a proxy-sized lr, 100 x the
protocol lr as Proxy-Anchor's proxies (tjddus9597/Proxy-Anchor-CVPR2020 ``code/train.py``:
``'lr': float(args.lr) * 100``; 1e-3 under Hyp-ViT's 1e-5). The paper trains them with the network
(SGD, one lr for all), whose lr a ViT's fine-tuning lr (1e-5) is far below: at multiplier 1 they
barely move from their random initialisation."""

from pydantic import PositiveFloat, PositiveInt

from dmlbench.losses.base import LossModule, LossSpec, ParametricLossParams
from dmlbench.losses.search import PARAM_LR, FloatRange


class SubCenterArcFaceParams(ParametricLossParams):
    margin: PositiveFloat = 28.6  # degrees
    scale: PositiveFloat = 64.0
    sub_centers: PositiveInt = 3  # K
    param_lr_multiplier: PositiveFloat = 100.0  # x the protocol lr, as Proxy-Anchor's proxies


def build(p: SubCenterArcFaceParams, num_classes: int, dim: int) -> LossModule:
    from pytorch_metric_learning.losses import SubCenterArcFaceLoss

    # keyword arguments: PML reads num_classes and embedding_size from **kwargs
    return SubCenterArcFaceLoss(
        num_classes=num_classes, embedding_size=dim, margin=p.margin, scale=p.scale, sub_centers=p.sub_centers
    )


# Not searched by the Reality Check; ArcFace's margin and scale, so RC's ArcFace bounds (powerful-benchmarker
# (branch metric-learning), docs/papers/mlrc_plots/{cub,cars,sop}_arcface.html): margin [0, 90] degrees,
# clipped to 0.5 (PositiveFloat); scale [0.01, 200] (SOP: up to 300); sub-centres lr PARAM_LR. sub_centers
# is fixed, as RC fixed SoftTriple's centres per class
SEARCH_SPACE = {"margin": FloatRange(0.5, 90.0), "scale": FloatRange(0.01, 300.0), "param_lr": PARAM_LR}

SPEC = LossSpec(
    name="subcenter_arcface",
    params=SubCenterArcFaceParams,
    build=build,
    sampler="any",
    reference="Deng, Guo, Liu, Gong & Zafeiriou, ECCV 2020",
    search_space=SEARCH_SPACE,
)
