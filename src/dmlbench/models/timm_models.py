"""Any timm model as a trunk: ``timm: {model_name: convnext_tiny.fb_in1k}`` or, for several in one
grid, a key ``timm_<model_name>`` (e.g. ``timm_resnet50.tv_in1k: {}``).

The trunk is timm's pre-logits path, ``forward_head(forward_features(x), pre_logits=True)`` of
``create_model(model_name, num_classes=0)``: the features timm and the weights' authors read
(including a head's norm or attention pooling). The protocol's pooling sets timm's
``global_pool`` (:data:`TIMM_POOLS`; ``native`` keeps the model's), refused in one line where the
model cannot do it; timm's ``avgmax`` is half of ``gap+gmp``, a scale the head and L2
normalisation absorb. ``projection``: the classifier is the feature (CLIP's image projection).
Mean, std and interpolation come from ``pretrained_cfg``; layer groups from ``group_matcher``
(:func:`layer_groups`, head last, as timm's ``param_groups_layer_decay``). Weights: the Hub file,
pinned by the weights lock (:mod:`dmlbench.models.hub`), else timm's URL download, or
``weights_path``; ``model_kwargs`` go to ``create_model``."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, create_model
from torch import nn

from dmlbench.errors import ConfigError, WeightsError
from dmlbench.models.base import INTERPOLATIONS, BackboneParams, BackboneSpec, HubFile, InputNorm, Trunk, WeightsFile
from dmlbench.models.hub import pinned_file, snapshot_path, url
from dmlbench.models.weights import hub_checkpoint_path
from dmlbench.weights_lock import locked

PREFIX = "timm_"
TIMM_POOLS = {"gap": "avg", "gmp": "max", "gap+gmp": "avgmax", "cls": "token"}  # protocol -> timm global_pool


def hub_file_of(model_name: str) -> HubFile | None:
    """The Hub file timm loads ``model_name``'s weights from (``hf_hub_id``, ``hf_hub_filename``), or None."""
    import timm

    cfg = timm.models.get_pretrained_cfg(model_name)
    if cfg is None or not cfg.hf_hub_id:
        return None
    repo = cfg.hf_hub_id if cfg.hf_hub_id != "timm/" else f"timm/{model_name}"
    return HubFile(repo, cfg.hf_hub_filename or "model.safetensors")


def hub_weights_file(backbone: str, hub: HubFile, weights_path: str | None) -> WeightsFile:
    """What the pre-flight and ``make fetch`` are told about a pinned Hub file."""
    entry = locked(hub.name)
    if weights_path:
        path = Path(weights_path).expanduser()
        return WeightsFile(backbone, path, entry and entry.url, entry and entry.sha256, local_only=True, hub=hub)
    if entry is None:  # not pinned yet: the pre-flight pins it (commit of "main")
        return WeightsFile(backbone, snapshot_path(hub, "main"), url(hub, "main"), hub=hub)
    return WeightsFile(backbone, snapshot_path(hub, entry.revision), entry.url, entry.sha256, hub=hub)


class TimmParams(BackboneParams):
    model_name: str = Field(min_length=1)
    weights_path: str | None = None
    model_kwargs: dict[str, Any] = Field(default_factory=dict)

    def weights_files(self, backbone: str) -> list[WeightsFile]:
        """``weights_path`` when set; else the model's Hub file (pinned), or its URL (timm's own download)."""
        if self.weights_path:
            return [WeightsFile(backbone, Path(self.weights_path).expanduser(), local_only=True)]
        import timm

        if not timm.is_model(self.model_name):
            return []
        hub = hub_file_of(self.model_name)
        if hub is not None:
            return [hub_weights_file(backbone, hub, None)]
        cfg = timm.models.get_pretrained_cfg(self.model_name)
        if cfg is not None and cfg.url:
            return [WeightsFile(backbone, hub_checkpoint_path(cfg.url), cfg.url)]
        return []


def has_class_token(net: nn.Module) -> bool:
    return bool(getattr(net, "has_class_token", False) or getattr(net, "cls_token", None) is not None)


def current_pool(net: nn.Module) -> str:
    """timm's ``global_pool`` of ``net`` (a ViT's string, or a CNN's pooling module's type)."""
    pool = getattr(net, "global_pool", None)
    if pool is None:
        pool = getattr(getattr(net, "head", None), "global_pool", None)
    return pool if isinstance(pool, str) else str(getattr(pool, "pool_type", ""))


class TimmTrunk(nn.Module):
    """timm's pre-logits features of ``net`` (N x C), or its classifier's output with ``projection``."""

    def __init__(self, net: nn.Module, projection: bool = False):
        super().__init__()
        self.net = net
        self.projection = projection

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net.forward_head(self.net.forward_features(images), pre_logits=not self.projection)

    def set_pooling(self, pooling: str) -> None:
        """Pool as the protocol says (``native``: as the model does); ValueError when it cannot."""
        if pooling == "native":
            return
        if pooling not in TIMM_POOLS:
            raise ValueError(f"pooling must be one of {', '.join([*TIMM_POOLS, 'native'])}, got {pooling!r}")
        target = TIMM_POOLS[pooling]
        if target == current_pool(self.net):
            return
        if self.projection:
            raise ValueError(
                f"the projection embeds the model's {current_pool(self.net)!r} pooling (CLIP: the class token); "
                "set pooling: cls or native, or the backbone's projection: false"
            )
        if target == "token" and not has_class_token(self.net):
            raise ValueError("pooling cls reads a class token, which this model has none of; use native or gap")
        try:
            self.net.reset_classifier(0, global_pool=target)
        except (AssertionError, TypeError, ValueError, NotImplementedError) as exc:
            raise ValueError(f"timm cannot pool this model with global_pool={target!r} ({exc})") from None


class TimmFeatureMap(nn.Module):
    """``forward_features`` of a timm model as an N x C x h x w map (tokens: N x C x L x 1, prefix
    tokens first), pooled by the shared pooling: for models built here from other weights."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.nhwc = getattr(net, "output_fmt", "NCHW") == "NHWC"

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.net.forward_features(images)
        if features.dim() == 3:  # tokens N x L x C (prefix tokens first) -> N x C x L x 1
            return features.transpose(1, 2).unsqueeze(-1)
        return features.permute(0, 3, 1, 2) if self.nhwc else features


def layer_groups(net: nn.Module) -> tuple[tuple[str, ...], ...]:
    """Parameter names of ``TimmTrunk(net)`` by depth, from timm's ``group_matcher(coarse=False)``
    (ViT: embeddings, each block, final norm; ConvNeXt: stem, each block; parameters no pattern
    matches, e.g. a head norm or CLIP's projection, last); () without a matcher."""
    from timm.models import group_parameters

    matcher = getattr(net, "group_matcher", None)
    if matcher is None:
        return ()
    groups = group_parameters(net, matcher(coarse=False))
    return tuple(tuple(f"net.{name}" for name in groups[layer]) for layer in sorted(groups))


def timm_trunk(net: nn.Module, projection: bool = False) -> Trunk:
    """The trunk of a timm model built with ``num_classes=0`` (or its projection head with
    ``projection``): its pre-logits features, and the preprocessing and layer groups its config declares."""
    cfg = net.pretrained_cfg
    norm = InputNorm(mean=tuple(cfg.get("mean", InputNorm.mean)), std=tuple(cfg.get("std", InputNorm.std)))
    trunk = TimmTrunk(net, projection)
    width = int(net.num_classes) if projection else int(getattr(net, "head_hidden_size", None) or net.num_features)
    return Trunk(
        trunk,
        width,
        input_norm=norm,
        cls_token=has_class_token(net),
        interpolation=cfg.get("interpolation") if cfg.get("interpolation") in INTERPOLATIONS else "bilinear",
        layer_groups=layer_groups(net),
        set_pooling=trunk.set_pooling,
        pretrained_cfg=dict(cfg),
    )


def create_timm(
    backbone: str, model_name: str, kwargs: dict[str, Any], weights: Path | None, projection: bool = False
) -> nn.Module:
    """``timm.create_model(model_name, num_classes=0 (the config's with projection), **kwargs)``,
    loading ``weights`` (a local file; timm adapts it: position embeddings, checkpoint layouts)."""
    import timm

    if not timm.is_model(model_name):
        raise ConfigError(f"backbones.{backbone}.model_name: timm has no model {model_name!r} (see timm.list_models())")
    classes = int(timm.models.get_pretrained_cfg(model_name).num_classes) if projection else 0
    overlay = {"file": str(weights)} if weights is not None else None
    try:
        return timm.create_model(
            model_name, pretrained=weights is not None, num_classes=classes, pretrained_cfg_overlay=overlay, **kwargs
        )
    except Exception as exc:  # noqa: BLE001 - any reader's error means: a file that is not these weights
        if weights is None:
            raise
        raise WeightsError(
            f"backbones.{backbone}: {weights} does not load into timm {model_name} ({type(exc).__name__}: "
            f"{str(exc)[:200]})"
        ) from None


def build_timm(key: str, params: TimmParams, pretrained: bool) -> Trunk:
    import timm

    if not timm.is_model(params.model_name):
        raise ConfigError(
            f"backbones.{key}.model_name: timm has no model {params.model_name!r} (see timm.list_models())"
        )
    hub = hub_file_of(params.model_name)
    if not pretrained:
        weights = None
    elif params.weights_path:
        weights = Path(params.weights_path).expanduser()
        if not weights.is_file():
            raise WeightsError(
                f"backbones.{key}: cannot load ImageNet weights of timm model {params.model_name} from {weights} "
                f"(no such file); download them and set backbones.{key}.weights_path to the file (or set the "
                "protocol's pretrained: false)"
            )
    elif hub is not None:
        weights = pinned_file(key, hub)
    else:  # weights only at a URL: timm downloads them into torch's hub cache (make fetch does it ahead)
        try:
            net = timm.create_model(params.model_name, pretrained=True, num_classes=0, **params.model_kwargs)
        except (OSError, RuntimeError, ValueError) as exc:
            cfg = timm.models.get_pretrained_cfg(params.model_name)
            raise WeightsError(
                f"backbones.{key}: cannot load ImageNet weights of timm model {params.model_name} from "
                f"{cfg.url if cfg else '?'} ({type(exc).__name__}: {str(exc)[:200]}); download them and set "
                f"backbones.{key}.weights_path to the file (or set the protocol's pretrained: false)"
            ) from None
        return timm_trunk(net)
    return timm_trunk(create_timm(key, params.model_name, params.model_kwargs, weights))


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
