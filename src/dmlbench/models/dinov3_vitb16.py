"""DINOv3 ViT-B/16 (Siméoni et al., "DINOv3", arXiv 2508.10104; github.com/facebookresearch/dinov3)."""

from __future__ import annotations

from typing import Any, ClassVar

from dmlbench.models.base import HubFile
from dmlbench.models.pinned_timm import VIT_KWARGS, PinnedTimmParams, pinned_spec

MODEL_NAME = "vit_base_patch16_dinov3.lvd1689m"
HUB_FILE = HubFile("timm/vit_base_patch16_dinov3.lvd1689m")
# upstream DINOv3 embeds the class token; timm's default pooling is the patch-token average
KWARGS: dict[str, Any] = {**VIT_KWARGS, "global_pool": "token"}


class DINOv3ViTB16Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = pinned_spec(
    "dinov3_vitb16",
    MODEL_NAME,
    DINOv3ViTB16Params,
    "DINOv3 ViT-B/16 (Simeoni et al. 2025), timm vit_base_patch16_dinov3.lvd1689m, CLS, 256 px config",
    kwargs=KWARGS,
)
