"""One run's configuration, resolved from ``params.yaml`` once: what a per-run stage hands down.

:func:`run_config` checks the run against the grid, applies the protocol's overrides for its
dataset and backbone, validates its loss hyperparameters and hashes the resolved config;
training and embedding read the run's settings from the :class:`RunConfig`, not from ``Params``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from dmlbench.config import Params, config_hash
from dmlbench.data import DATASETS, DatasetSpec
from dmlbench.grid import RunSpec
from dmlbench.losses import LOSSES, LossSpec
from dmlbench.models import EmbeddingModel, build_model
from dmlbench.protocol import Protocol


@dataclass(frozen=True, eq=False)
class RunConfig:
    """The resolved settings of one run (``resolved``: what is logged and hashed)."""

    run: RunSpec
    protocol_name: str
    protocol: Protocol  # the active protocol with the run's dataset/backbone overrides applied
    dataset_params: BaseModel
    backbone_params: BaseModel
    loss_params: BaseModel  # the loss's defaults, then the protocol's values, then losses.<name>
    loss_source: str  # protocol, params or defaults (see Params.loss_source)
    recall_ks: tuple[int, ...]  # the K of Recall@K in validation scores
    resolved: dict[str, Any]
    config_hash: str

    @property
    def dataset(self) -> str:
        return self.run.dataset

    @property
    def backbone(self) -> str:
        return self.run.backbone

    @property
    def loss(self) -> str:
        return self.run.loss

    @property
    def dim(self) -> int:
        return self.run.dim

    @property
    def seed(self) -> int:
        return self.run.seed

    @property
    def dataset_spec(self) -> DatasetSpec:
        return DATASETS[self.run.dataset]

    @property
    def loss_spec(self) -> LossSpec:
        return LOSSES[self.run.loss]

    def build_model(self, pretrained: bool | None = None) -> EmbeddingModel:
        """The run's embedding model (``pretrained``: None = the protocol's; False where trained
        weights are loaded next)."""
        protocol = self.protocol
        return build_model(
            self.backbone,
            self.backbone_params,
            self.dim,
            pooling=protocol.pooling,
            pretrained=protocol.pretrained if pretrained is None else pretrained,
            frozen_bn=protocol.frozen_bn,
        )


def run_config(params: Params, run: RunSpec) -> RunConfig:
    """Resolve ``run`` (a cell of the grid and a seed) from validated params, hashing it once."""
    params.check_run(run)
    resolved = params.resolved(run)
    return RunConfig(
        run=run,
        protocol_name=params.protocol_name,
        protocol=params.protocol_for(run),
        dataset_params=params.datasets[run.dataset],
        backbone_params=params.backbones[run.backbone],
        loss_params=params.loss_params(run),
        loss_source=params.loss_source(run),
        recall_ks=params.evaluate.recall_ks(run.dataset),
        resolved=resolved,
        config_hash=config_hash(resolved),
    )
