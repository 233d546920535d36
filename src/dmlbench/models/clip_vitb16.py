"""CLIP ViT-B/16 image tower (Radford et al., "Learning Transferable Visual Models From Natural
Language Supervision", ICML 2021; github.com/openai/CLIP), run as CLIP runs it.

Architecture: timm's ``vit_base_patch16_clip_quickgelu_224``, CLIP's own MLP activation (QuickGELU,
``x * sigmoid(1.702 x)``; timm's plain ``vit_base_patch16_clip_224`` uses GELU: its config notes
"natively QuickGELU, use quickgelu model variant for original results"), pre-norm (``ln_pre``).
Weights: timm's Hub conversion ``timm/vit_base_patch16_clip_224.openai`` of OpenAI's ``ViT-B-16.pt``
(the same file for both variants; OpenAI's own file is a TorchScript archive of both towers),
pinned by the weights lock. timm maps CLIP's ``ln_post`` to ``norm`` and its ``proj`` (768 x 512)
to the classifier ``head`` (transposed, zero bias), so the image embedding, ``ln_post(CLS) @ proj``
(512-d, CLIP's ``encode_image``), is ``forward_head`` with the head: ``projection: true`` (default).
``projection: false``: the 768-d ``ln_post(CLS)`` before the projection (timm's pre-logits).
Preprocessing from its timm config: CLIP's mean (0.4815, 0.4578, 0.4082) and std
(0.2686, 0.2613, 0.2758), bicubic, 224 px.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import HubFile
from dmlbench.models.pinned_timm import PinnedTimmParams, pinned_spec

MODEL_NAME = "vit_base_patch16_clip_quickgelu_224.openai"
HUB_FILE = HubFile("timm/vit_base_patch16_clip_224.openai")  # the quickgelu variant's hf_hub_id


class CLIPViTB16Params(PinnedTimmParams):
    """``projection``: CLIP's 512-d image embedding (true) or the 768-d feature before it (false)."""

    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE
    projection: bool = True


SPEC = pinned_spec(
    "clip_vitb16",
    MODEL_NAME,
    CLIPViTB16Params,
    "CLIP ViT-B/16 image tower (Radford et al. 2021), QuickGELU, ln_post(CLS) @ proj (512-d), locked",
)
