"""DINOv2 ViT-S/14 with 4 registers (Darcet et al., "Vision Transformers Need Registers", ICLR
2024, arXiv 2309.16588; github.com/facebookresearch/dinov2 ``dinov2_vits14_reg``).

timm's conversion folds the class token's position embedding into the token, so neither the class
nor the register tokens overlap the 37 x 37 patch grid; the registers are dropped, as upstream.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import HubFile
from dmlbench.models.pinned_timm import PinnedTimmParams, pinned_spec

MODEL_NAME = "vit_small_patch14_reg4_dinov2.lvd142m"
HUB_FILE = HubFile("timm/vit_small_patch14_reg4_dinov2.lvd142m")


class DINOv2ViTS14Reg4Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = pinned_spec(
    "dinov2_vits14_reg4",
    MODEL_NAME,
    DINOv2ViTS14Reg4Params,
    "DINOv2 ViT-S/14 + 4 registers (Darcet et al. 2024), timm vit_small_patch14_reg4_dinov2.lvd142m",
)
