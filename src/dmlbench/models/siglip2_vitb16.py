"""SigLIP 2 ViT-B/16 image tower (Tschannen et al., "SigLIP 2", arXiv 2502.14786;
github.com/google-research/big_vision), at 224 px.

No class token: the image embedding is the attention-pooling head's output (MAP, timm's
``attn_pool``; ``pooling: native``), which is SigLIP's embedding (the image tower has no projection
after it); ``pooling: gap`` averages the patch tokens instead, ``cls`` is refused.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import HubFile
from dmlbench.models.pinned_timm import PinnedTimmParams, pinned_spec

MODEL_NAME = "vit_base_patch16_siglip_224.v2_webli"
HUB_FILE = HubFile("timm/vit_base_patch16_siglip_224.v2_webli")


class SigLIP2ViTB16Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = pinned_spec(
    "siglip2_vitb16",
    MODEL_NAME,
    SigLIP2ViTB16Params,
    "SigLIP 2 ViT-B/16 (Tschannen et al. 2025), timm vit_base_patch16_siglip_224.v2_webli, MAP pooling",
)
