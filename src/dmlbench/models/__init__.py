"""Backbones (trunks) and the shared embedding head.

Adding a backbone = one module declaring a :class:`~dmlbench.models.base.BackboneSpec` named
``SPEC`` plus one entry below.
"""

from __future__ import annotations

from dmlbench.models import tiny_cnn
from dmlbench.models.base import BackboneParams, BackboneSpec, InputNorm, Trunk
from dmlbench.models.embedding import EmbeddingModel

BACKBONES: dict[str, BackboneSpec] = {spec.name: spec for spec in (tiny_cnn.SPEC,)}


def build_model(
    backbone: str,
    params: BackboneParams,
    dim: int,
    pooling: str = "gap",
    pretrained: bool = False,
    frozen_bn: bool = False,
) -> EmbeddingModel:
    """Trunk of the registered ``backbone`` + pooling + linear head to ``dim`` + L2 norm."""
    spec = BACKBONES[backbone]
    return EmbeddingModel(spec.build(params, pretrained), spec.input_norm, dim, pooling=pooling, frozen_bn=frozen_bn)


__all__ = ["BACKBONES", "BackboneParams", "BackboneSpec", "EmbeddingModel", "InputNorm", "Trunk", "build_model"]
