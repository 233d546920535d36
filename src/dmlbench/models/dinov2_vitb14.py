"""DINOv2 ViT-B/14 (Oquab et al., TMLR 2024, arXiv 2304.07193; github.com/facebookresearch/dinov2)."""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import HubFile
from dmlbench.models.pinned_timm import PinnedTimmParams, pinned_spec

MODEL_NAME = "vit_base_patch14_dinov2.lvd142m"
HUB_FILE = HubFile("timm/vit_base_patch14_dinov2.lvd142m")


class DINOv2ViTB14Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = pinned_spec(
    "dinov2_vitb14",
    MODEL_NAME,
    DINOv2ViTB14Params,
    "DINOv2 ViT-B/14 (Oquab et al. 2024), timm vit_base_patch14_dinov2.lvd142m, native 518 px grid",
)
