"""DINOv2 ViT-S/14 (Oquab et al., "DINOv2: Learning Robust Visual Features without Supervision",
TMLR 2024, arXiv 2304.07193; github.com/facebookresearch/dinov2), self-supervised on LVD-142M.

Weights: timm's Hub copy ``timm/vit_small_patch14_dinov2.lvd142m`` of Meta's
``dinov2_vits14_pretrain.pth`` (no published digest: pinned by the weights lock). Preprocessing from
its timm config: ImageNet mean/std, bicubic. Built at 224 px (16 x 16 patches), not timm's 518;
CLS pooling as the paper's linear and kNN evaluations read the class token.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import BackboneSpec, InputNorm
from dmlbench.models.pinned_timm import VIT_KWARGS, HubFile, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std and interpolation
MODEL_NAME = "vit_small_patch14_dinov2.lvd142m"
HUB_FILE = HubFile("timm/vit_small_patch14_dinov2.lvd142m")


class DINOv2ViTS14Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = BackboneSpec(
    name="dinov2_vits14",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=DINOv2ViTS14Params,
    build=lambda params, pretrained: build_pinned("dinov2_vits14", MODEL_NAME, VIT_KWARGS, params, pretrained),
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="DINOv2 ViT-S/14 (Oquab et al. 2024), timm vit_small_patch14_dinov2.lvd142m, locked Hub weights",
)
