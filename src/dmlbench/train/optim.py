"""Optimisers and per-epoch learning-rate schedules from the protocol's settings: parameter groups
(layer-wise lr decay, no weight decay where timm skips it), frozen trunk modules."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from dmlbench.errors import ConfigError
from dmlbench.losses.base import ParametricLossParams
from dmlbench.models.embedding import EmbeddingModel
from dmlbench.params.protocol import OptimizerConfig, Protocol, SchedulerConfig


def make_optimizer(
    config: OptimizerConfig, parameters: Iterable[torch.nn.Parameter] | Sequence[dict[str, Any]], lr: float
) -> torch.optim.Optimizer:
    """``parameters``: tensors, or param groups (dicts with ``params`` and their own ``lr``)."""
    items = list(parameters)
    if items and isinstance(items[0], dict):
        parameters = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in items]
    else:
        parameters = [p for p in items if p.requires_grad]
    if config.name == "adamw":
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=config.weight_decay)
    if config.name == "adam":
        return torch.optim.Adam(parameters, lr=lr, weight_decay=config.weight_decay)
    if config.name == "rmsprop":
        return torch.optim.RMSprop(parameters, lr=lr, weight_decay=config.weight_decay, momentum=config.momentum)
    if config.name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, weight_decay=config.weight_decay, momentum=config.momentum)
    raise ValueError(f"unknown optimizer {config.name!r}")


# The embedding head enters timm's grouping under a name no ``group_matcher`` pattern matches, as the
# classifier of a timm model does: timm gives unmatched parameters the top layer (ordinal inf).
HEAD_SENTINEL = "\x00embedding_head"


def _timm_net(trunk: nn.Module) -> tuple[str, nn.Module] | None:
    """The trunk's timm model (the first submodule with a ``group_matcher``) and its name prefix."""
    for name, module in trunk.named_modules():
        if callable(getattr(module, "group_matcher", None)):
            return (f"{name}." if name else ""), module
    return None


def layer_ids(model: EmbeddingModel) -> tuple[dict[str, int], int]:
    """Layer id of each parameter name (0 = input side) and the number of layers, as timm 1.0's
    ``param_groups_layer_decay`` with the embedding head as classifier: the trunk's ``group_matcher``
    order (final ``norm`` with the last block, timm's ``MATCH_PREV_GROUP``), unmatched names with the
    head on top; without a matcher: its ``layer_groups`` (or one group), the head above."""
    trunk_names = [f"trunk.{name}" for name, _ in model.trunk.named_parameters()]
    head_names = [f"head.{name}" for name, _ in model.head.named_parameters()]
    found = _timm_net(model.trunk)
    if found is not None:
        from timm.models._manipulate import group_with_matcher

        prefix, net = found
        named = [(name, None) for name, _ in net.named_parameters()] + [(HEAD_SENTINEL, None)]
        mapping = group_with_matcher(named, net.group_matcher(coarse=False), reverse=True)
        top = mapping[HEAD_SENTINEL]
        ids = {f"trunk.{prefix}{name}": lid for name, lid in mapping.items() if name != HEAD_SENTINEL}
    else:
        ids = {f"trunk.{name}": lid for lid, names in enumerate(model.layer_groups) for name in names}
        top = len(model.layer_groups) if model.layer_groups else 1
        ids = ids or dict.fromkeys(trunk_names, 0)
    layers = {name: ids.get(name, top) for name in trunk_names}  # outside the timm net: with the head
    layers.update(dict.fromkeys(head_names, top))
    return layers, top + 1


def _no_decay_names(model: EmbeddingModel) -> set[str]:
    """Parameter names timm trains without weight decay: 1-D tensors (biases, norm weights) and the
    trunk's ``no_weight_decay()`` names (``fnmatch`` patterns of its own parameter names)."""
    import fnmatch

    names = {name for name, p in model.named_parameters() if p.ndim <= 1}
    found = _timm_net(model.trunk)
    if found is not None and callable(getattr(found[1], "no_weight_decay", None)):
        prefix, net = found
        patterns = set(net.no_weight_decay())
        names |= {
            f"trunk.{prefix}{name}"
            for name, _ in net.named_parameters()
            if any(fnmatch.fnmatch(name, pattern) for pattern in patterns)
        }
    return names


def model_param_groups(protocol: Protocol, model: EmbeddingModel) -> list[dict[str, Any]]:
    """Param groups of an :class:`~dmlbench.models.embedding.EmbeddingModel` (what trains: parameters
    with ``requires_grad``, so frozen BatchNorm and ``freeze``-d modules are in none).

    lr = ``lr x layer_decay ** (layers - 1 - layer)`` over :func:`layer_ids` (BEiT), trunk also x
    ``backbone_lr_multiplier``; weight decay 0 for :func:`_no_decay_names` with ``no_weight_decay: timm``.
    Equal to timm's ``param_groups_weight_decay`` / ``param_groups_layer_decay``; head group first."""
    config = protocol.optimizer
    layers, count = layer_ids(model)
    skip = _no_decay_names(model) if config.no_weight_decay == "timm" else set()
    groups: dict[tuple[int, bool, bool], dict[str, Any]] = {}
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    head_first = sorted(trainable, key=lambda item: not item[0].startswith("head."))
    for name, parameter in head_first:
        layer, in_trunk, decays = layers[name], name.startswith("trunk."), name not in skip
        key = (layer, in_trunk, decays)
        if key not in groups:
            scale = protocol.layer_decay ** (count - 1 - layer)
            groups[key] = {
                "params": [],
                "lr": config.lr * scale * (protocol.backbone_lr_multiplier if in_trunk else 1.0),
                "weight_decay": config.weight_decay if decays else 0.0,
                "lr_scale": scale,
                "name": f"{'trunk' if in_trunk else 'head'}.layer{layer}.{'decay' if decays else 'no_decay'}",
            }
        groups[key]["params"].append(parameter)
    return list(groups.values())


def make_model_optimizer(protocol: Protocol, model: EmbeddingModel) -> torch.optim.Optimizer:
    """The embedding model's optimiser: one group at ``optimizer.lr`` with the defaults, else the
    groups of :func:`model_param_groups`."""
    simple = protocol.backbone_lr_multiplier == 1.0 and protocol.layer_decay == 1.0
    if simple and protocol.optimizer.no_weight_decay == "none":
        return make_optimizer(protocol.optimizer, model.parameters(), protocol.optimizer.lr)
    if protocol.layer_decay < 1.0 and _timm_net(model.trunk) is None and not model.layer_groups:
        raise ConfigError(
            f"protocol: layer_decay {protocol.layer_decay:g} needs a trunk with layer groups (a timm model with a "
            "group_matcher, e.g. a ViT or ConvNeXt); this trunk has none: set layer_decay: 1"
        )
    return make_optimizer(protocol.optimizer, model_param_groups(protocol, model), protocol.optimizer.lr)


def freeze_modules(protocol: Protocol, model: EmbeddingModel) -> list[str]:
    """Stop the gradient of trunk parameters inside modules named in ``protocol.freeze`` (dotted, e.g.
    Hyp-ViT's ``patch_embed``); the frozen names. A name matching nothing: :class:`ConfigError`."""
    frozen = []
    for module in protocol.freeze:
        hits = [
            (name, p) for name, p in model.trunk.named_parameters() if f".{module}." in f".{name.rsplit('.', 1)[0]}."
        ]
        if not hits:
            raise ConfigError(
                f"protocol: freeze: the trunk has no module {module!r} (a ViT has patch_embed, blocks.0, ...)"
            )
        for name, parameter in hits:
            parameter.requires_grad_(False)
            frozen.append(name)
    return frozen


def make_loss_optimizer(
    protocol: Protocol, loss_params: ParametricLossParams, parameters: Iterable[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """The optimiser of a loss's own parameters: the protocol's kind, at ``loss_params.optimizer_lr``
    (``param_weight_decay`` when set)."""
    config = protocol.optimizer
    if loss_params.param_weight_decay is not None:
        config = config.model_copy(update={"weight_decay": loss_params.param_weight_decay})
    return make_optimizer(config, parameters, loss_params.optimizer_lr(config.lr, protocol.loss_lr_multiplier))


def make_scheduler(
    config: SchedulerConfig, optimizer: torch.optim.Optimizer, epochs: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """Stepped once per epoch. ``step``: StepLR(step_size, gamma); ``cosine``: to 0 over ``epochs``."""
    if config.name == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=config.step_size, gamma=config.gamma)
    if config.name == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0)
