"""What a loss module declares (PML's style: a loss in a few lines).

PML and torch are imported inside the build functions (a class of our own from
``losses/_impl/``), so that validating ``params.yaml``, which every stage does first, imports
neither.

Each module defines a parameter model (defaults = thesis Table 4, unless noted) and a
``SPEC``: how to build the pytorch-metric-learning loss and its default miner (thesis
Table 5), what batches it needs, and whether it owns parameters (proxies, class weights,
a learnable margin) that are trained by their own optimiser with their own learning rate
(:class:`ParametricLossParams`; powerful-benchmarker's ``metric_loss_optimizer``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pydantic import NonNegativeFloat, PositiveFloat, model_validator

from dmlbench.losses.search import SearchSpace
from dmlbench.schema import StrictModel

if TYPE_CHECKING:
    from pytorch_metric_learning.miners import BaseMiner
    from torch import nn

# What ``build`` and ``build_miner`` return, named without importing torch or PML here
LossModule: TypeAlias = "nn.Module"  # a PML loss: loss(embeddings, labels, indices_tuple) -> scalar
Miner: TypeAlias = "BaseMiner"  # a PML miner: miner(embeddings, labels) -> indices_tuple


class LossParams(StrictModel):
    """Hyperparameters of a loss; modules subclass this."""


class ParametricLossParams(LossParams):
    """For losses with their own parameters (proxies, class weights, a learnable margin), trained
    by a second optimiser of the protocol's kind (powerful-benchmarker's ``metric_loss_optimizer``).

    Its lr, the first that applies (:meth:`optimizer_lr`; docs/pipeline.md): ``param_lr`` given
    (absolute, e.g. the Reality Check's tuned "proxy lr"); the protocol lr x its ``loss_lr_multiplier``
    (e.g. the Proxy-Anchor recipe's x100); the module's default absolute ``param_lr`` (thesis Table 4:
    ProxyNCA 1e-5, Margin 5e-5, ArcFace and SoftTriple 1e-4); the protocol lr x ``param_lr_multiplier``.
    Giving ``param_lr_multiplier`` replaces a default absolute ``param_lr``; giving both is an error.
    Its weight decay: ``param_weight_decay`` if set, else the protocol optimiser's.
    """

    param_lr_multiplier: PositiveFloat = 1.0
    param_lr: PositiveFloat | None = None
    param_weight_decay: NonNegativeFloat | None = None

    @model_validator(mode="before")
    @classmethod
    def _multiplier_replaces_default_lr(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and "param_lr_multiplier" in data
            and "param_lr" not in data
            and cls.model_fields["param_lr"].default is not None
        ):
            return {**data, "param_lr": None}
        return data

    @model_validator(mode="after")
    def _one_lr(self) -> ParametricLossParams:
        if self._given_param_lr() is not None and "param_lr_multiplier" in self.model_fields_set:
            raise ValueError("set param_lr (absolute) or param_lr_multiplier (x the protocol lr), not both")
        return self

    def _given_param_lr(self) -> float | None:
        """``param_lr`` where it was given (not the module's default), else None."""
        return self.param_lr if "param_lr" in self.model_fields_set else None

    def optimizer_lr(self, protocol_lr: float, protocol_multiplier: float | None) -> float:
        """The lr of the loss's own parameters (see the class docstring)."""
        given = self._given_param_lr()
        if given is not None:
            return given
        if protocol_multiplier:
            return protocol_lr * protocol_multiplier
        if self.param_lr is not None:
            return self.param_lr
        return protocol_lr * self.param_lr_multiplier


@dataclass(frozen=True)
class LossSpec:
    """A registry entry.

    ``build(params, num_classes, embedding_size)`` -> PML loss module;
    ``build_miner(params)`` -> PML miner or None (no mining);
    ``sampler``: ``"m_per_class"`` if batches must hold several images per class (pair and
    triplet losses), ``"any"`` if any batch works (proxy and classification losses);
    ``search_space``: the ranges the tuning stage searches (:mod:`dmlbench.losses.search`);
    ``search_space_for``: where the space depends on the values searched from (a loss with two
    formulations), the space for given published params, replacing ``search_space``.
    """

    name: str
    params: type[LossParams]
    build: Callable[[Any, int, int], LossModule]
    reference: str
    build_miner: Callable[[Any], Miner | None] | None = None
    sampler: Literal["m_per_class", "any"] = "m_per_class"
    search_space: SearchSpace = field(default_factory=dict)
    search_space_for: Callable[[Any], SearchSpace] | None = None

    @property
    def has_parameters(self) -> bool:
        """The loss owns trainable parameters, trained by their own optimiser: its params model is a
        :class:`ParametricLossParams`."""
        return issubclass(self.params, ParametricLossParams)

    def space(self, published: LossParams) -> SearchSpace:
        """The space searched around ``published`` (the values trial 0 trains)."""
        return self.search_space if self.search_space_for is None else self.search_space_for(published)

    def miner(self, params: LossParams) -> Miner | None:
        return self.build_miner(params) if self.build_miner is not None else None
