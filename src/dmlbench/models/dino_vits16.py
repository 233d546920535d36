"""DINO ViT-S/16 (Caron et al., "Emerging Properties in Self-Supervised Vision Transformers", ICCV 2021;
github.com/facebookresearch/dino), the backbone of Hyp-ViT (Ermolov et al., CVPR 2022).

Feature: the class token after the final norm, as DINO's ``eval_knn.py`` embeds images.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import HubFile
from dmlbench.models.pinned_timm import PinnedTimmParams, pinned_spec

MODEL_NAME = "vit_small_patch16_224.dino"
HUB_FILE = HubFile("timm/vit_small_patch16_224.dino")


class DINOViTS16Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = pinned_spec(
    "dino_vits16",
    MODEL_NAME,
    DINOViTS16Params,
    "DINO ViT-S/16 (Caron et al. 2021), timm vit_small_patch16_224.dino, locked Hub weights",
)
