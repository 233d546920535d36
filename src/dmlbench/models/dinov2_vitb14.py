"""DINOv2 ViT-B/14 (Oquab et al., TMLR 2024, arXiv 2304.07193; github.com/facebookresearch/dinov2).

Weights: timm's Hub copy ``timm/vit_base_patch14_dinov2.lvd142m`` of Meta's
``dinov2_vitb14_pretrain.pth``, pinned by the weights lock. Preprocessing from its timm config:
ImageNet mean/std, bicubic. Built at its native 37 x 37 position grid (518 px), interpolated per
forward to the protocol's crop. Feature: the class token after the final norm.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dmlbench.models.base import BackboneParams, BackboneSpec, HubFile, InputNorm, Trunk
from dmlbench.models.pinned_timm import VIT_KWARGS, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std, interpolation and native resolution
MODEL_NAME = "vit_base_patch14_dinov2.lvd142m"
HUB_FILE = HubFile("timm/vit_base_patch14_dinov2.lvd142m")
KWARGS: dict[str, Any] = VIT_KWARGS


class DINOv2ViTB14Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


def build(params: BackboneParams, pretrained: bool, **architecture: Any) -> Trunk:
    """The trunk (``architecture``: ``create_model`` overrides, e.g. a tiny depth for tests)."""
    return build_pinned("dinov2_vitb14", MODEL_NAME, {**KWARGS, **architecture}, params, pretrained)


SPEC = BackboneSpec(
    name="dinov2_vitb14",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=DINOv2ViTB14Params,
    build=build,
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="DINOv2 ViT-B/14 (Oquab et al. 2024), timm vit_base_patch14_dinov2.lvd142m, native 518 px grid",
)
