"""timm architectures with weights pinned through the weights lock: the modern backbones.

A module per backbone declares its timm model name (architecture + pretrained tag: its
``pretrained_cfg`` gives mean, std, interpolation and native resolution), the Hub file of its
weights and its ``create_model`` arguments (:func:`pinned_spec`); :func:`build_pinned` loads the pinned file
(:func:`dmlbench.models.hub.pinned_file`) into timm's model, run through its pre-logits path
(:mod:`dmlbench.models.timm_models`). Every ViT is built at its weights' native position grid
(e.g. 518 px for DINOv2), never resampled at load; ``dynamic_img_size=True`` interpolates the
position embeddings to the protocol's crop at each forward (DINOv3's rotary embeddings need
none), and ``dynamic_img_pad=True`` pads a crop that is not a multiple of the patch size."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dmlbench.errors import ConfigError
from dmlbench.models.base import BackboneParams, BackboneSpec, HubFile, InputNorm, Trunk, WeightsFile
from dmlbench.models.hub import pinned_file
from dmlbench.models.timm_models import create_timm, hub_weights_file, timm_trunk

VIT_KWARGS: dict[str, Any] = {"dynamic_img_size": True, "dynamic_img_pad": True}
CNN_KWARGS: dict[str, Any] = {}


class PinnedTimmParams(BackboneParams):
    """``weights_path``: a copy of the Hub file (used instead of the Hub cache; checked against the lock)."""

    HUB_FILE: ClassVar[HubFile | None] = None
    weights_path: str | None = None

    def weights_files(self, backbone: str) -> list[WeightsFile]:
        if self.HUB_FILE is None:
            return []
        return [hub_weights_file(backbone, self.HUB_FILE, self.weights_path)]


def build_pinned(
    backbone: str,
    model_name: str,
    kwargs: dict[str, Any],
    params: BackboneParams,
    pretrained: bool,
    projection: bool = False,
) -> Trunk:
    """``timm.create_model(model_name, num_classes=0, **kwargs)`` (the config's classes with
    ``projection``) as a pre-logits trunk, with the pinned weights when ``pretrained``."""
    if not isinstance(params, PinnedTimmParams):
        raise TypeError(f"backbones.{backbone}: expected PinnedTimmParams, got {type(params).__name__}")
    weights = None
    if pretrained:
        if params.HUB_FILE is None:
            raise ConfigError(f"backbones.{backbone}: has no pretrained weights; set the protocol's pretrained: false")
        copy = Path(params.weights_path).expanduser() if params.weights_path else None
        weights = pinned_file(backbone, params.HUB_FILE, copy)
    return timm_trunk(create_timm(backbone, model_name, kwargs, weights, projection), projection)


@dataclass(frozen=True)
class PinnedBuild:
    """A pinned backbone's ``build(params, pretrained, **architecture)``: ``architecture`` overrides
    ``kwargs`` of ``create_model`` (e.g. a tiny depth for tests); a ``projection`` param is passed on."""

    backbone: str
    model_name: str
    kwargs: dict[str, Any]

    def __call__(self, params: BackboneParams, pretrained: bool, **architecture: Any) -> Trunk:
        kwargs = {**self.kwargs, **architecture}
        projection = bool(getattr(params, "projection", False))
        return build_pinned(self.backbone, self.model_name, kwargs, params, pretrained, projection)


def pinned_spec(
    name: str,
    model_name: str,
    params: type[PinnedTimmParams],
    description: str,
    kwargs: dict[str, Any] = VIT_KWARGS,
    input_norm: InputNorm | None = None,
) -> BackboneSpec:
    """The registry entry of timm's ``model_name`` (architecture.tag) as backbone ``name``; without
    ``input_norm``, the model's pretrained_cfg mean/std (:attr:`Trunk.input_norm`) normalise."""
    return BackboneSpec(name, params, PinnedBuild(name, model_name, kwargs), input_norm or InputNorm(), description)
