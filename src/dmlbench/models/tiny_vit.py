"""A tiny ViT for CI on the CPU: every modern code path (patch embedding, a class token,
preprocessing and interpolation from a timm ``pretrained_cfg``, CLS pooling, layer groups for
layer-wise learning rates, the locked-weights loader) at demo cost.

timm's ``test_vit`` (6 blocks of width 64, ``timm.models.vision_transformer``, made for timm's own
tests) built at 32 px with 4 px patches (8 x 8 tokens + CLS, ~0.26 M parameters), random init by
default. Its config ``test_vit.r160_in1k`` (mean = std = 0.5, bicubic) is what the transforms and
the input normalisation read. ``pretrained: true`` loads timm's Hub file ``timm/test_vit.r160_in1k``
(160 px, 16 px patches: timm resamples the position and patch embeddings) through the weights lock;
the tests serve such a file from a stand-in Hub on 127.0.0.1 to run the pinning and loading offline.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dmlbench.models.base import HubFile, InputNorm
from dmlbench.models.pinned_timm import PinnedTimmParams, pinned_spec

MODEL_NAME = "test_vit.r160_in1k"
HUB_FILE = HubFile("timm/test_vit.r160_in1k")
KWARGS: dict[str, Any] = {"img_size": 32, "patch_size": 4, "dynamic_img_size": True}


class TinyViTParams(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = pinned_spec(
    "tiny_vit",
    MODEL_NAME,
    TinyViTParams,
    "6-block width-64 ViT (timm test_vit) at 32 px with 4 px patches, for CPU tests",
    kwargs=KWARGS,
    input_norm=InputNorm(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
)
