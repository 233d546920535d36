"""DINOv2 ViT-B/14 with 4 registers (Darcet et al., "Vision Transformers Need Registers", ICLR
2024, arXiv 2309.16588; github.com/facebookresearch/dinov2 ``dinov2_vitb14_reg``).

Weights: timm's Hub copy ``timm/vit_base_patch14_reg4_dinov2.lvd142m`` of Meta's
``dinov2_vitb14_reg4_pretrain.pth``, pinned by the weights lock. ImageNet mean/std, bicubic;
native 518 px grid, interpolated per forward. Feature: the class token after the final norm.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dmlbench.models.base import BackboneParams, BackboneSpec, HubFile, InputNorm, Trunk
from dmlbench.models.pinned_timm import VIT_KWARGS, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std, interpolation and native resolution
MODEL_NAME = "vit_base_patch14_reg4_dinov2.lvd142m"
HUB_FILE = HubFile("timm/vit_base_patch14_reg4_dinov2.lvd142m")
KWARGS: dict[str, Any] = VIT_KWARGS


class DINOv2ViTB14Reg4Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


def build(params: BackboneParams, pretrained: bool, **architecture: Any) -> Trunk:
    """The trunk (``architecture``: ``create_model`` overrides, e.g. a tiny depth for tests)."""
    return build_pinned("dinov2_vitb14_reg4", MODEL_NAME, {**KWARGS, **architecture}, params, pretrained)


SPEC = BackboneSpec(
    name="dinov2_vitb14_reg4",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=DINOv2ViTB14Reg4Params,
    build=build,
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="DINOv2 ViT-B/14 + 4 registers (Darcet et al. 2024), timm vit_base_patch14_reg4_dinov2.lvd142m",
)
