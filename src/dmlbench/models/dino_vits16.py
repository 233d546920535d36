"""DINO ViT-S/16 (Caron et al., "Emerging Properties in Self-Supervised Vision Transformers", ICCV 2021;
github.com/facebookresearch/dino), the backbone of Hyp-ViT (Ermolov et al., CVPR 2022).

Weights: timm's Hub copy ``timm/vit_small_patch16_224.dino`` of
``dl.fbaipublicfiles.com/dino/dino_deitsmall16_pretrain/dino_deitsmall16_pretrain.pth``, pinned by
the weights lock. Preprocessing from its timm config: ImageNet mean/std, bicubic; native 224 px
grid. Feature: the class token after the final norm, as DINO's ``eval_knn.py`` embeds images.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dmlbench.models.base import BackboneParams, BackboneSpec, HubFile, InputNorm, Trunk
from dmlbench.models.pinned_timm import VIT_KWARGS, PinnedTimmParams, build_pinned

# timm architecture.tag: its pretrained_cfg gives mean, std, interpolation and native resolution
MODEL_NAME = "vit_small_patch16_224.dino"
HUB_FILE = HubFile("timm/vit_small_patch16_224.dino")
KWARGS: dict[str, Any] = VIT_KWARGS


class DINOViTS16Params(PinnedTimmParams):
    HUB_FILE: ClassVar[HubFile | None] = HUB_FILE


def build(params: BackboneParams, pretrained: bool, **architecture: Any) -> Trunk:
    """The trunk (``architecture``: ``create_model`` overrides, e.g. a tiny depth for tests)."""
    return build_pinned("dino_vits16", MODEL_NAME, {**KWARGS, **architecture}, params, pretrained)


SPEC = BackboneSpec(
    name="dino_vits16",  # a literal: tests/test_dvc_deps.py reads registry names from the source
    params=DINOViTS16Params,
    build=build,
    input_norm=InputNorm(),  # replaced by the model's pretrained_cfg mean/std (Trunk.input_norm)
    description="DINO ViT-S/16 (Caron et al. 2021), timm vit_small_patch16_224.dino, locked Hub weights",
)
