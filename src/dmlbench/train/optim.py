"""Optimisers and per-epoch learning-rate schedules from the protocol's settings."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

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


def layer_lrs(lr: float, groups: int, multiplier: float = 1.0, decay: float = 1.0) -> list[float]:
    """Learning rates of a trunk's ``groups`` layer groups, input layer first: ``lr x multiplier x
    decay ** (groups - 1 - i)`` (BEiT's layer-wise decay: the top group gets ``lr x multiplier``).

    >>> layer_lrs(1.0, 3, multiplier=0.5, decay=0.5)
    [0.125, 0.25, 0.5]
    """
    return [lr * multiplier * decay ** (groups - 1 - index) for index in range(groups)]


def model_param_groups(protocol: Protocol, model: EmbeddingModel) -> list[dict[str, Any]]:
    """Param groups of an :class:`~dmlbench.models.embedding.EmbeddingModel`: the head at the
    protocol's lr first (the logged ``train/lr``), then the trunk's layer groups, input layer first,
    at :func:`layer_lrs` (``backbone_lr_multiplier``, ``layer_decay``). Parameters that do not train
    (frozen BatchNorm) are in none; every other one in exactly one group."""
    lr = protocol.optimizer.lr
    trunk = model.trunk_layer_groups() if protocol.layer_decay < 1.0 else [model.trunk_parameters()]
    lrs = layer_lrs(lr, len(trunk), protocol.backbone_lr_multiplier, protocol.layer_decay)
    groups = [{"params": model.head_parameters(), "lr": lr, "name": "head"}]
    for index, (params, group_lr) in enumerate(zip(trunk, lrs, strict=True)):
        groups.append({"params": params, "lr": group_lr, "name": f"trunk.{index}"})
    return groups


def make_model_optimizer(protocol: Protocol, model: EmbeddingModel) -> torch.optim.Optimizer:
    """The optimiser of the embedding model: the head at ``optimizer.lr``; with the default
    ``backbone_lr_multiplier: 1`` and ``layer_decay: 1`` every parameter at that lr."""
    if protocol.backbone_lr_multiplier == 1.0 and protocol.layer_decay == 1.0:
        return make_optimizer(protocol.optimizer, model.parameters(), protocol.optimizer.lr)
    return make_optimizer(protocol.optimizer, model_param_groups(protocol, model), protocol.optimizer.lr)


def make_loss_optimizer(
    protocol: Protocol, loss_params: ParametricLossParams, parameters: Iterable[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """The optimiser of a loss's own parameters: the protocol's kind, momentum and weight decay
    (``param_weight_decay`` when set), at ``loss_params.optimizer_lr`` (absolute ``param_lr``,
    else the protocol lr x ``loss_lr_multiplier`` or ``param_lr_multiplier``)."""
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
