"""ViT-S/16 supervised on ImageNet-21k and fine-tuned on ImageNet-1k (AugReg: Steiner et al.,
"How to train your ViT?", TMLR 2022; github.com/google-research/vision_transformer), the supervised
ViT-S of Hyp-ViT (Ermolov et al., CVPR 2022).

Hyp-ViT (github.com/htdt/hyp_metric, ``model.py``) builds ``timm.create_model("vit_small_patch16_224",
pretrained=True)``; in the timm of its time (0.4.12) that name's weights were
``S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_224.npz``,
which timm 1.0 calls ``vit_small_patch16_224.augreg_in21k_ft_in1k`` (its Hub copy, pinned by the
weights lock). Preprocessing from its timm config: mean = std = 0.5 (as Hyp-ViT's ``train.py`` for
``vit*`` models), bicubic, 224 px. Feature: the class token after the final norm.
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
