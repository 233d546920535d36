"""Any timm model as a trunk: ``timm: {model_name: convnext_tiny.fb_in1k}`` or, to list several
in one grid, a key ``timm_<model_name>`` (e.g. ``timm_resnet50.tv_in1k: {}``).

The trunk is ``forward_features`` of ``timm.create_model(model_name, num_classes=0,
global_pool="")``: the unpooled feature map (N x C x h x w; NHWC outputs are permuted;
transformer token sequences become an N x C x (prefix + L) x 1 map, prefix tokens first, which
GAP skips, so GAP is the mean patch token as timm's ``global_pool="avg"``, and ``pooling: cls``
reads the class token). Input normalisation (mean, std) and the resize interpolation come from
the model's ``pretrained_cfg``; layer groups for layer-wise learning rates from its
``group_matcher`` (:func:`timm_trunk`). ImageNet weights are
timm's own (Hugging Face Hub), or a local file given as ``weights_path`` (.pth or .safetensors).
``model_kwargs`` go to ``create_model`` (e.g. ``{dynamic_img_size: true}`` for ViTs).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, create_model
from torch import nn

from dmlbench.errors import ConfigError
from dmlbench.models.base import INTERPOLATIONS, BackboneParams, BackboneSpec, InputNorm, Trunk, WeightsFile
from dmlbench.models.weights import WeightsError

PREFIX = "timm_"


class TimmParams(BackboneParams):
    model_name: str = Field(min_length=1)
    weights_path: str | None = None
    model_kwargs: dict[str, Any] = Field(default_factory=dict)

    def weights_files(self, backbone: str) -> list[WeightsFile]:
        """``weights_path`` when set (timm's own Hub weights are not pinned: timm fetches them)."""
        if not self.weights_path:
            return []
        return [WeightsFile(backbone, Path(self.weights_path).expanduser(), local_only=True)]


class TimmTrunk(nn.Module):
    """``forward_features`` of a timm model, always as an N x C x h x w map (tokens: N x C x L x 1)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.prefix_tokens = int(getattr(net, "num_prefix_tokens", 0) or 0)
        self.nhwc = getattr(net, "output_fmt", "NCHW") == "NHWC"

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.net.forward_features(images)
        if features.dim() == 3:  # tokens N x L x C (prefix tokens first) -> N x C x L x 1
            return features.transpose(1, 2).unsqueeze(-1)
        return features.permute(0, 3, 1, 2) if self.nhwc else features


def layer_groups(net: nn.Module) -> tuple[tuple[str, ...], ...]:
    """Parameter names of ``TimmTrunk(net)`` by depth, from timm's ``group_matcher(coarse=False)``
    (ViT: embeddings, each block, final norm; ConvNeXt: stem, each block); () without a matcher."""
    from timm.models import group_parameters

    matcher = getattr(net, "group_matcher", None)
    if matcher is None:
        return ()
    groups = group_parameters(net, matcher(coarse=False))
    return tuple(tuple(f"net.{name}" for name in groups[layer]) for layer in sorted(groups))


def timm_trunk(net: nn.Module) -> Trunk:
    """The trunk of a timm model built with ``num_classes=0, global_pool=""``: its feature map,
    and the preprocessing, token layout and layer groups its config declares."""
    cfg = net.pretrained_cfg
    norm = InputNorm(mean=tuple(cfg.get("mean", InputNorm.mean)), std=tuple(cfg.get("std", InputNorm.std)))
    trunk = TimmTrunk(net)
    return Trunk(
        trunk,
        int(net.num_features),
        input_norm=norm,
        prefix_tokens=trunk.prefix_tokens,
        cls_token=bool(getattr(net, "has_class_token", False) or getattr(net, "cls_token", None) is not None),
        interpolation=cfg.get("interpolation") if cfg.get("interpolation") in INTERPOLATIONS else "bilinear",
        layer_groups=layer_groups(net),
    )


def build_timm(key: str, params: TimmParams, pretrained: bool) -> Trunk:
    import timm

    if not timm.is_model(params.model_name):
        raise ConfigError(
            f"backbones.{key}.model_name: timm has no model {params.model_name!r} (see timm.list_models())"
        )
    overlay = {"file": params.weights_path} if pretrained and params.weights_path else None
    try:
        net = timm.create_model(
            params.model_name,
            pretrained=pretrained,
            num_classes=0,
            global_pool="",
            pretrained_cfg_overlay=overlay,
            **params.model_kwargs,
        )
    except (OSError, RuntimeError, ValueError) as exc:  # hub unreachable, missing file, bad weights
        if not pretrained:
            raise
        cfg = timm.models.get_pretrained_cfg(params.model_name)
        source = (cfg.hf_hub_id and f"hf-hub:{cfg.hf_hub_id}") or cfg.url if cfg else "?"
        raise WeightsError(
            f"backbones.{key}: cannot load ImageNet weights of timm model {params.model_name} from "
            f"{params.weights_path or source} ({type(exc).__name__}: {str(exc)[:200]}); download them and set "
            f"backbones.{key}.weights_path to the file (or set the protocol's pretrained: false)"
        ) from None
    return timm_trunk(net)


SPEC = BackboneSpec(
    name="timm",
    params=TimmParams,
    build=lambda params, pretrained: build_timm("timm", params, pretrained),
    input_norm=InputNorm(),
    description="any timm model by name (model_name param)",
)


def is_timm_key(name: object) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX) and len(name) > len(PREFIX)


@cache
def spec_for(key: str) -> BackboneSpec:
    """The registry entry of ``timm_<model_name>``: ``TimmParams`` with that model name as default."""
    params = create_model(
        f"TimmParams_{key}", __base__=TimmParams, model_name=(str, Field(key[len(PREFIX) :], min_length=1))
    )
    return BackboneSpec(
        name=key,
        params=params,
        build=lambda p, pretrained: build_timm(key, p, pretrained),
        input_norm=InputNorm(),
        description=f"timm model {key[len(PREFIX) :]}",
    )
