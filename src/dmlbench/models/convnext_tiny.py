"""ConvNeXt-T (Liu et al., "A ConvNet for the 2020s", CVPR 2022; github.com/facebookresearch/ConvNeXt),
ImageNet-1k supervised. Feature: timm's pre-logits, the LayerNorm of the global average of the
stage-4 map (the paper's classifier input: ``head.norm`` after pooling; 768-d).
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import HubFile
from dmlbench.models.pinned_timm import CNN_KWARGS, PinnedTimmParams, pinned_spec

MODEL_NAME = "convnext_tiny.fb_in1k"
HUB_FILE = HubFile("timm/convnext_tiny.fb_in1k")


class ConvNeXtTinyParams(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = pinned_spec(
    "convnext_tiny",
    MODEL_NAME,
    ConvNeXtTinyParams,
    "ConvNeXt-T (Liu et al. 2022), timm convnext_tiny.fb_in1k, pre-logits (LayerNorm of the pooled map)",
    kwargs=CNN_KWARGS,
)
