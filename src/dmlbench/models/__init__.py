"""Backbones (trunks) and the shared embedding head.

Adding a backbone = one module declaring a :class:`~dmlbench.models.base.BackboneSpec` named
``SPEC`` plus one entry below. Keys ``timm_<model_name>`` resolve to any timm model.
"""

from __future__ import annotations

from dmlbench.errors import ConfigError
from dmlbench.models import (
    bn_inception,
    clip_vitb16,
    convnext_tiny,
    dino_vits16,
    dinov2_vitb14,
    dinov2_vitb14_reg4,
    dinov2_vits14,
    dinov2_vits14_reg4,
    dinov3_vitb16,
    dinov3_vits16,
    efficientnet_lite0,
    googlenet,
    in21k_vitb16,
    in21k_vits16,
    resnet50,
    siglip2_vitb16,
    timm_models,
    tiny_cnn,
    tiny_vit,
)
from dmlbench.models.base import BackboneParams, BackboneSpec, InputNorm, Trunk
from dmlbench.models.embedding import EmbeddingModel


class BackboneRegistry(dict):
    """The registered backbones, plus ``timm_<model_name>`` for any timm model."""

    def __missing__(self, key: str) -> BackboneSpec:
        if timm_models.is_timm_key(key):
            return timm_models.spec_for(key)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key) or timm_models.is_timm_key(key)


BACKBONES: dict[str, BackboneSpec] = BackboneRegistry(
    {
        spec.name: spec
        for spec in (
            tiny_cnn.SPEC,
            resnet50.SPEC,
            googlenet.SPEC,
            bn_inception.SPEC,
            efficientnet_lite0.SPEC,
            timm_models.SPEC,
            dinov2_vits14.SPEC,
            dinov2_vitb14.SPEC,
            dinov2_vits14_reg4.SPEC,
            dinov2_vitb14_reg4.SPEC,
            dinov3_vits16.SPEC,
            dinov3_vitb16.SPEC,
            dino_vits16.SPEC,
            clip_vitb16.SPEC,
            siglip2_vitb16.SPEC,
            in21k_vits16.SPEC,
            in21k_vitb16.SPEC,
            convnext_tiny.SPEC,
            tiny_vit.SPEC,
        )
    }
)


def build_model(
    backbone: str,
    params: BackboneParams,
    dim: int,
    pooling: str = "gap",
    pretrained: bool = False,
    frozen_bn: bool = False,
) -> EmbeddingModel:
    """Trunk of the registered ``backbone`` + pooling + linear head to ``dim`` + L2 norm.

    A timm trunk pools itself, set here to ``pooling``. ``pooling: cls`` on a trunk without a class
    token, or a pooling a timm model cannot do: one-line ConfigError."""
    spec = BACKBONES[backbone]
    trunk = spec.build(params, pretrained)
    if pooling == "cls" and not trunk.cls_token:
        raise ConfigError(
            f"protocol pooling: cls reads a class token, which backbone {backbone} has none of "
            "(DINO, DINOv2, DINOv3 and CLIP ViTs have one); use gap, or native for the trunk's own pooling"
        )
    if trunk.set_pooling is not None:
        try:
            trunk.set_pooling(pooling)
        except ValueError as exc:
            raise ConfigError(f"protocol pooling: {pooling} on backbone {backbone}: {exc}") from None
    norm = trunk.input_norm or spec.input_norm
    return EmbeddingModel(trunk, norm, dim, pooling=pooling, frozen_bn=frozen_bn)


__all__ = ["BACKBONES", "BackboneParams", "BackboneSpec", "EmbeddingModel", "InputNorm", "Trunk", "build_model"]
