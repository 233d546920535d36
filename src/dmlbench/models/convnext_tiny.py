"""ConvNeXt-T (Liu et al., "A ConvNet for the 2020s", CVPR 2022; github.com/facebookresearch/ConvNeXt),
ImageNet-1k supervised.

Weights: timm's Hub copy ``timm/convnext_tiny.fb_in1k`` of ``convnext_tiny_1k_224_ema.pth``, pinned
by the weights lock. Preprocessing from its timm config: ImageNet mean/std, bicubic, 224 px.
Feature: timm's pre-logits, the LayerNorm of the global average of the stage-4 map (the paper's
classifier input: ``head.norm`` after pooling; 768-d).
"""

from __future__ import annotations

from typing import Any, ClassVar

from dmlbench.models.base import BackboneParams, BackboneSpec, HubFile, InputNorm, Trunk
from dmlbench.models.pinned_timm import CNN_KWARGS, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std, interpolation and native resolution
MODEL_NAME = "convnext_tiny.fb_in1k"
HUB_FILE = HubFile("timm/convnext_tiny.fb_in1k")
KWARGS: dict[str, Any] = CNN_KWARGS


class ConvNeXtTinyParams(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


def build(params: BackboneParams, pretrained: bool, **architecture: Any) -> Trunk:
    """The trunk (``architecture``: ``create_model`` overrides, e.g. a tiny depth for tests)."""
    return build_pinned("convnext_tiny", MODEL_NAME, {**KWARGS, **architecture}, params, pretrained)


SPEC = BackboneSpec(
    name="convnext_tiny",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=ConvNeXtTinyParams,
    build=build,
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="ConvNeXt-T (Liu et al. 2022), timm convnext_tiny.fb_in1k, pre-logits (LayerNorm of the pooled map)",
)
