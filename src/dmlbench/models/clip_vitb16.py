"""CLIP ViT-B/16 image tower (Radford et al., "Learning Transferable Visual Models From Natural
Language Supervision", ICML 2021; github.com/openai/CLIP).

Weights: timm's Hub conversion ``timm/vit_base_patch16_clip_224.openai`` of OpenAI's
``ViT-B-16.pt`` (whose URL, openaipublic.azureedge.net/clip/models/5806e77c.../ViT-B-16.pt, carries
its full sha256; that file is a TorchScript archive of both towers, so the timm conversion is used
and pinned by the weights lock). Preprocessing from its timm config: CLIP's mean
(0.4815, 0.4578, 0.4082) and std (0.2686, 0.2613, 0.2758), bicubic. Trunk output: tokens after
``ln_post`` (timm's final norm), before CLIP's 512-d projection; CLS pooling, as CLIP embeds.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import BackboneSpec, InputNorm
from dmlbench.models.pinned_timm import VIT_KWARGS, HubFile, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std and interpolation
MODEL_NAME = "vit_base_patch16_clip_224.openai"
HUB_FILE = HubFile("timm/vit_base_patch16_clip_224.openai")


class CLIPViTB16Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = BackboneSpec(
    name="clip_vitb16",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=CLIPViTB16Params,
    build=lambda params, pretrained: build_pinned("clip_vitb16", MODEL_NAME, VIT_KWARGS, params, pretrained),
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="CLIP ViT-B/16 image tower (Radford et al. 2021), timm vit_base_patch16_clip_224.openai, locked",
)
