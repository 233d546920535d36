"""One run's configuration, resolved once (overrides applied, loss values validated, hashed): what
training and embedding read instead of ``Params``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch import nn

from dmlbench.data import DATASETS, DatasetSpec
from dmlbench.data.base import DatasetParams
from dmlbench.errors import ConfigError
from dmlbench.grid import RunSpec
from dmlbench.losses import LOSSES, LossSpec
from dmlbench.losses.base import LossParams
from dmlbench.models import EmbeddingModel, build_model
from dmlbench.models.base import BackboneParams
from dmlbench.params.model import Params, config_hash
from dmlbench.params.protocol import Protocol, protocol_values
from dmlbench.params.tuned import tuned_values


@dataclass(frozen=True, eq=False)
class RunConfig:
    """The resolved settings of one run (``resolved``: what is logged and hashed)."""

    run: RunSpec
    protocol_name: str
    protocol: Protocol  # the active protocol with the run's dataset/backbone overrides applied
    dataset_params: DatasetParams
    backbone_params: BackboneParams
    loss_params: LossParams  # the loss's defaults, then the protocol's values, then losses.<name>
    loss_source: str  # protocol, params, defaults (see Params.loss_source), tuned or published (a baseline)
    recall_ks: tuple[int, ...]  # the K of Recall@K in validation scores
    resolved: dict[str, Any]
    config_hash: str

    @property
    def dataset_spec(self) -> DatasetSpec:
        return DATASETS[self.run.dataset]

    @property
    def loss_spec(self) -> LossSpec:
        return LOSSES[self.run.loss]

    def build_model(self, pretrained: bool | None = None) -> EmbeddingModel:
        """The run's embedding model (``pretrained`` None: the protocol's) with its ``head``:
        ``head_init: orthogonal`` as Hyp-ViT ``model.py``; ``head: none`` the identity (Berton et al.
        2025 ``retrieval_model.py``, ``feat_dim None``: ``dim`` = the trunk's width)."""
        protocol = self.protocol
        model = build_model(
            self.run.backbone,
            self.backbone_params,
            self.run.dim,
            pooling=protocol.pooling,
            pretrained=protocol.pretrained if pretrained is None else pretrained,
            frozen_bn=protocol.frozen_bn,
        )
        if protocol.head == "none":
            width = model.head.in_features
            if self.run.dim != width:
                raise ConfigError(
                    f"dims: protocol {self.protocol_name!r} has head: none, so the embedding is the trunk's "
                    f"{width}-d feature; {self.run.backbone} cannot give {self.run.dim} (use dims: [{width}])"
                )
            model.head = nn.Identity()
        elif protocol.head_init == "orthogonal":
            nn.init.orthogonal_(model.head.weight)
            nn.init.zeros_(model.head.bias)
        return model


def run_config(params: Params, run: RunSpec) -> RunConfig:
    """Resolve ``run`` (a cell of the grid and a seed) from validated params, hashing it once.

    ``tuned`` hyperparameters: the tune stage's ``best.yaml`` over the published ones
    (``resolved["tuning"]`` names study and trial). A ``published`` baseline run trains the
    published values with test feedback off."""
    params.check_run(run)
    protocol = params.protocol_for(run)
    values = params.loss_values_for(run)
    tuning = None
    if run.variant == "published":
        protocol = protocol.model_copy(update={"test_feedback": False})
    elif protocol.hyperparameters == "tuned":
        tuned, tuning = tuned_values(run.dataset, run.backbone, run.loss)
        published = params.loss_values_for(run, published_only=True)
        if "param_lr" in tuned:  # a searched absolute lr replaces a published multiplier
            published.pop("param_lr_multiplier", None)
        values = {**published, **tuned, **params.loss_values.get(run.loss, {})}
    return resolve_run(params, run, params.loss_models[run.loss].model_validate(values), protocol, tuning)


def with_loss_params(config: RunConfig, loss_params: LossParams) -> RunConfig:
    """``config`` with other values of its loss (a tuning trial's), re-resolved and re-hashed."""
    resolved = {**config.resolved, "loss": {"name": config.run.loss, **loss_params.model_dump(mode="json")}}
    return dataclasses.replace(
        config, loss_params=loss_params, loss_source="trial", resolved=resolved, config_hash=config_hash(resolved)
    )


def resolve_run(
    params: Params,
    run: RunSpec,
    loss_params: LossParams,
    protocol: Protocol,
    tuning: dict[str, Any] | None = None,
) -> RunConfig:
    """A run's config from explicit loss values and protocol (a tuning trial's run need not be
    a cell of the grid: it trains at ``tuning.dim`` and ``tuning.seed``)."""
    resolved = {
        "dataset": {"name": run.dataset, **params.datasets[run.dataset].model_dump(mode="json")},
        "backbone": {"name": run.backbone, **params.backbones[run.backbone].model_dump(mode="json")},
        "loss": {"name": run.loss, **loss_params.model_dump(mode="json")},
        "dim": run.dim,
        "seed": run.seed,
        "protocol": protocol_values(params.protocol_name, protocol),
    }
    if tuning is not None:
        resolved["tuning"] = dict(tuning)
    if run.variant:
        resolved["variant"] = run.variant
    return RunConfig(
        run=run,
        protocol_name=params.protocol_name,
        protocol=protocol,
        dataset_params=params.datasets[run.dataset],
        backbone_params=params.backbones[run.backbone],
        loss_params=loss_params,
        loss_source="tuned" if tuning is not None else run.variant or params.loss_source(run),
        recall_ks=params.evaluate.recall_ks(run.dataset),
        resolved=resolved,
        config_hash=config_hash(resolved),
    )
