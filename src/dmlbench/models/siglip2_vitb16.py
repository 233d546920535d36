"""SigLIP 2 ViT-B/16 image tower (Tschannen et al., "SigLIP 2", arXiv 2502.14786;
github.com/google-research/big_vision), at 224 px.

Weights: timm's Hub copy ``timm/vit_base_patch16_siglip_224.v2_webli`` of the big_vision
checkpoint, pinned by the weights lock. Preprocessing from its timm config: mean = std = 0.5,
bicubic, 224 px. No class token: the image embedding is the attention-pooling head's output
(MAP, timm's ``attn_pool``; ``pooling: native``), which is SigLIP's embedding (the image tower has
no projection after it); ``pooling: gap`` averages the patch tokens instead, ``cls`` is refused.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dmlbench.models.base import BackboneParams, BackboneSpec, HubFile, InputNorm, Trunk
from dmlbench.models.pinned_timm import VIT_KWARGS, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std, interpolation and native resolution
MODEL_NAME = "vit_base_patch16_siglip_224.v2_webli"
HUB_FILE = HubFile("timm/vit_base_patch16_siglip_224.v2_webli")
KWARGS: dict[str, Any] = VIT_KWARGS


class SigLIP2ViTB16Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


def build(params: BackboneParams, pretrained: bool, **architecture: Any) -> Trunk:
    """The trunk (``architecture``: ``create_model`` overrides, e.g. a tiny depth for tests)."""
    return build_pinned("siglip2_vitb16", MODEL_NAME, {**KWARGS, **architecture}, params, pretrained)


SPEC = BackboneSpec(
    name="siglip2_vitb16",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=SigLIP2ViTB16Params,
    build=build,
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="SigLIP 2 ViT-B/16 (Tschannen et al. 2025), timm vit_base_patch16_siglip_224.v2_webli, MAP pooling",
)
