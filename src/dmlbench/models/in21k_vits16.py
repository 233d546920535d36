"""ViT-S/16 supervised on ImageNet-21k and fine-tuned on ImageNet-1k (AugReg: Steiner et al.,
"How to train your ViT?", TMLR 2022; github.com/google-research/vision_transformer), the supervised
ViT-S of Hyp-ViT (Ermolov et al., CVPR 2022); why these weights: docs/modern.md.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import HubFile
from dmlbench.models.pinned_timm import PinnedTimmParams, pinned_spec

MODEL_NAME = "vit_small_patch16_224.augreg_in21k_ft_in1k"
HUB_FILE = HubFile("timm/vit_small_patch16_224.augreg_in21k_ft_in1k")


class In21kViTS16Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = pinned_spec(
    "in21k_vits16",
    MODEL_NAME,
    In21kViTS16Params,
    "ViT-S/16 ImageNet-21k + 1k (AugReg; Hyp-ViT's supervised ViT-S), timm augreg_in21k_ft_in1k",
)
