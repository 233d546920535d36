"""DINOv2 ViT-S/14 (Oquab et al., "DINOv2: Learning Robust Visual Features without Supervision",
TMLR 2024, arXiv 2304.07193; github.com/facebookresearch/dinov2), self-supervised on LVD-142M.

Feature: the class token after the final norm, as the paper's kNN evaluation and ``hubconf`` models
embed (``x_norm_clstoken``); weights, preprocessing and resolution: docs/modern.md.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import HubFile
from dmlbench.models.pinned_timm import PinnedTimmParams, pinned_spec

MODEL_NAME = "vit_small_patch14_dinov2.lvd142m"
HUB_FILE = HubFile("timm/vit_small_patch14_dinov2.lvd142m")


class DINOv2ViTS14Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = pinned_spec(
    "dinov2_vits14",
    MODEL_NAME,
    DINOv2ViTS14Params,
    "DINOv2 ViT-S/14 (Oquab et al. 2024), timm vit_small_patch14_dinov2.lvd142m, native 518 px grid",
)
