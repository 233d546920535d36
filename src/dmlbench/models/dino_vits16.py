"""DINO ViT-S/16 (Caron et al., "Emerging Properties in Self-Supervised Vision Transformers", ICCV 2021;
github.com/facebookresearch/dino), the backbone of Hyp-ViT (Ermolov et al., CVPR 2022).

Weights: timm's Hub copy ``timm/vit_small_patch16_224.dino`` of
``dl.fbaipublicfiles.com/dino/dino_deitsmall16_pretrain/dino_deitsmall16_pretrain.pth`` (no published
digest: pinned by the weights lock). Preprocessing from its timm config: ImageNet mean/std,
bicubic. CLS pooling, as DINO's ``eval_knn.py`` embeds images.
"""

from __future__ import annotations

from typing import ClassVar

from dmlbench.models.base import BackboneSpec, InputNorm
from dmlbench.models.pinned_timm import VIT_KWARGS, HubFile, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std and interpolation
MODEL_NAME = "vit_small_patch16_224.dino"
HUB_FILE = HubFile("timm/vit_small_patch16_224.dino")


class DINOViTS16Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


SPEC = BackboneSpec(
    name="dino_vits16",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=DINOViTS16Params,
    build=lambda params, pretrained: build_pinned("dino_vits16", MODEL_NAME, VIT_KWARGS, params, pretrained),
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="DINO ViT-S/16 (Caron et al. 2021), timm vit_small_patch16_224.dino, locked Hub weights",
)
