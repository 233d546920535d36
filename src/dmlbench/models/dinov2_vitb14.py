"""DINOv2 ViT-B/14 (Oquab et al., TMLR 2024, arXiv 2304.07193; github.com/facebookresearch/dinov2).

Weights: timm's Hub copy ``timm/vit_base_patch14_dinov2.lvd142m`` of Meta's
``dinov2_vitb14_pretrain.pth`` (no published digest: pinned by the weights lock). Preprocessing from
its timm config: ImageNet mean/std, bicubic. Built at 224 px, not timm's 518; CLS pooling.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import BackboneSpec, InputNorm
from dmlbench.models.pinned_timm import VIT_KWARGS, HubFile, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std and interpolation
MODEL_NAME = "vit_base_patch14_dinov2.lvd142m"
HUB_FILE = HubFile("timm/vit_base_patch14_dinov2.lvd142m")


class DINOv2ViTB14Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = BackboneSpec(
    name="dinov2_vitb14",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=DINOv2ViTB14Params,
    build=lambda params, pretrained: build_pinned("dinov2_vitb14", MODEL_NAME, VIT_KWARGS, params, pretrained),
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="DINOv2 ViT-B/14 (Oquab et al. 2024), timm vit_base_patch14_dinov2.lvd142m, locked Hub weights",
)
