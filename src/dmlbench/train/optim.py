"""Optimisers and per-epoch learning-rate schedules from the protocol's settings."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dmlbench.losses.base import ParametricLossParams
from dmlbench.params.protocol import OptimizerConfig, Protocol, SchedulerConfig


def make_optimizer(
    config: OptimizerConfig, parameters: Iterable[torch.nn.Parameter], lr: float
) -> torch.optim.Optimizer:
    parameters = [p for p in parameters if p.requires_grad]
    if config.name == "adamw":
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=config.weight_decay)
    if config.name == "adam":
        return torch.optim.Adam(parameters, lr=lr, weight_decay=config.weight_decay)
    if config.name == "rmsprop":
        return torch.optim.RMSprop(parameters, lr=lr, weight_decay=config.weight_decay, momentum=config.momentum)
    if config.name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, weight_decay=config.weight_decay, momentum=config.momentum)
    raise ValueError(f"unknown optimizer {config.name!r}")


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
