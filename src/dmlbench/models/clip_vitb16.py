"""CLIP ViT-B/16 image tower (Radford et al., "Learning Transferable Visual Models From Natural
Language Supervision", ICML 2021; github.com/openai/CLIP), run as CLIP runs it.

timm's ``vit_base_patch16_clip_quickgelu_224`` (CLIP's QuickGELU, not the plain variant's GELU);
``projection: true`` (default) embeds ``ln_post(CLS) @ proj`` (512-d, CLIP's ``encode_image``),
``projection: false`` the 768-d ``ln_post(CLS)`` before it. Details: docs/modern.md.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import HubFile
from dmlbench.models.pinned_timm import PinnedTimmParams, pinned_spec

MODEL_NAME = "vit_base_patch16_clip_quickgelu_224.openai"
HUB_FILE = HubFile("timm/vit_base_patch16_clip_224.openai")  # the quickgelu variant's hf_hub_id


class CLIPViTB16Params(PinnedTimmParams):
    """``projection``: CLIP's 512-d image embedding (true) or the 768-d feature before it (false)."""

    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE
    projection: bool = True


SPEC = pinned_spec(
    "clip_vitb16",
    MODEL_NAME,
    CLIPViTB16Params,
    "CLIP ViT-B/16 image tower (Radford et al. 2021), QuickGELU, ln_post(CLS) @ proj (512-d), locked",
)
