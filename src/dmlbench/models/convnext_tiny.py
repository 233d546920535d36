"""ConvNeXt-T (Liu et al., "A ConvNet for the 2020s", CVPR 2022; github.com/facebookresearch/ConvNeXt),
ImageNet-1k supervised.

Weights: timm's Hub copy ``timm/convnext_tiny.fb_in1k`` of ``convnext_tiny_1k_224_ema.pth``
(torchvision's ``convnext_tiny-983f1562.pth`` carries a hash prefix but other tensor names; the
timm file is pinned by the weights lock). Preprocessing from its timm config: ImageNet mean/std,
bicubic. Feature map 768 x 7 x 7 at 224 px; GAP (no class token), as the paper's classifier.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import BackboneSpec, InputNorm
from dmlbench.models.pinned_timm import CNN_KWARGS, HubFile, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std and interpolation
MODEL_NAME = "convnext_tiny.fb_in1k"
HUB_FILE = HubFile("timm/convnext_tiny.fb_in1k")


class ConvNeXtTinyParams(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = BackboneSpec(
    name="convnext_tiny",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=ConvNeXtTinyParams,
    build=lambda params, pretrained: build_pinned("convnext_tiny", MODEL_NAME, CNN_KWARGS, params, pretrained),
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="ConvNeXt-T (Liu et al. 2022), timm convnext_tiny.fb_in1k, locked Hub weights",
)
