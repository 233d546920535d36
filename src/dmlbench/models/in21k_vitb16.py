"""ViT-B/16 supervised on ImageNet-21k and fine-tuned on ImageNet-1k (AugReg: Steiner et al.,
"How to train your ViT?", TMLR 2022; github.com/google-research/vision_transformer): the ViT-B of
the same release as Hyp-ViT's supervised ViT-S (:mod:`dmlbench.models.in21k_vits16`), timm's
``vit_base_patch16_224.augreg_in21k_ft_in1k`` (its Hub copy, pinned by the weights lock).
Preprocessing from its timm config: mean = std = 0.5, bicubic, 224 px. Feature: the class token
after the final norm.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dmlbench.models.base import BackboneParams, BackboneSpec, HubFile, InputNorm, Trunk
from dmlbench.models.pinned_timm import VIT_KWARGS, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std, interpolation and native resolution
MODEL_NAME = "vit_base_patch16_224.augreg_in21k_ft_in1k"
HUB_FILE = HubFile("timm/vit_base_patch16_224.augreg_in21k_ft_in1k")
KWARGS: dict[str, Any] = VIT_KWARGS


class In21kViTB16Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


def build(params: BackboneParams, pretrained: bool, **architecture: Any) -> Trunk:
    """The trunk (``architecture``: ``create_model`` overrides, e.g. a tiny depth for tests)."""
    return build_pinned("in21k_vitb16", MODEL_NAME, {**KWARGS, **architecture}, params, pretrained)


SPEC = BackboneSpec(
    name="in21k_vitb16",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=In21kViTB16Params,
    build=build,
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="ViT-B/16 ImageNet-21k + 1k (AugReg), timm vit_base_patch16_224.augreg_in21k_ft_in1k",
)
