"""DINOv2 ViT-S/14 (Oquab et al., "DINOv2: Learning Robust Visual Features without Supervision",
TMLR 2024, arXiv 2304.07193; github.com/facebookresearch/dinov2), self-supervised on LVD-142M.

Weights: timm's Hub copy ``timm/vit_small_patch14_dinov2.lvd142m`` of Meta's
``dinov2_vits14_pretrain.pth``, pinned by the weights lock. Preprocessing from its timm config:
ImageNet mean/std, bicubic (made for 518 px, crop_pct 1.0). Built at its native position grid
(37 x 37 patches, 518 px), interpolated per forward to the protocol's crop (16 x 16 at 224 px).
Feature: the class token after the final norm (timm's pre-logits with ``token`` pooling), as the
paper's kNN evaluation and ``hubconf`` models embed (``x_norm_clstoken``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from dmlbench.models.base import BackboneParams, BackboneSpec, HubFile, InputNorm, Trunk
from dmlbench.models.pinned_timm import VIT_KWARGS, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std, interpolation and native resolution
MODEL_NAME = "vit_small_patch14_dinov2.lvd142m"
HUB_FILE = HubFile("timm/vit_small_patch14_dinov2.lvd142m")
KWARGS: dict[str, Any] = VIT_KWARGS


class DINOv2ViTS14Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


def build(params: BackboneParams, pretrained: bool, **architecture: Any) -> Trunk:
    """The trunk (``architecture``: ``create_model`` overrides, e.g. a tiny depth for tests)."""
    return build_pinned("dinov2_vits14", MODEL_NAME, {**KWARGS, **architecture}, params, pretrained)


SPEC = BackboneSpec(
    name="dinov2_vits14",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=DINOv2ViTS14Params,
    build=build,
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="DINOv2 ViT-S/14 (Oquab et al. 2024), timm vit_small_patch14_dinov2.lvd142m, native 518 px grid",
)
