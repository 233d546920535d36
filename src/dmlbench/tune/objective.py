"""One trial of a search: the loss built with the trial's values, trained once per fold. Objective
(the Reality Check's): the mean over folds of the validation ``tuning.objective`` at each
fold model's selected epoch. Only the training half is read (:meth:`PreparedDataset.training_half`)
and test feedback is off: no trial reads a test image.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ValidationError

from dmlbench.data.cache import PreparedDataset
from dmlbench.errors import DmlbenchError
from dmlbench.grid import RunSpec
from dmlbench.losses import LOSSES
from dmlbench.losses.base import ParametricLossParams
from dmlbench.losses.search import Dimension
from dmlbench.messages import first_error
from dmlbench.params.model import Params
from dmlbench.params.run import RunConfig, resolve_run, with_loss_params
from dmlbench.params.tuning import tuning_settings
from dmlbench.train.loop import train
from dmlbench.tune.space import published_point, suggest

FoldCallback = Callable[[int, float, int], None]  # fold index, its objective value, its selected epoch


class InvalidTrial(DmlbenchError):
    """The sampled values violate the loss's own constraints (e.g. pos_margin >= neg_margin)."""


@dataclass(frozen=True)
class Search:
    """What every trial of one study shares: the run it trains (``tuning.dim``, ``tuning.seed``)
    under the protocol without test feedback, the searched space and the fixed values around it."""

    base: RunConfig  # the run with the published values (what a trial's config replaces the loss of)
    space: Mapping[str, Dimension]
    base_values: dict[str, Any]  # the published values (protocol) plus losses.<name> of params.yaml
    published: BaseModel  # the loss params the published config trains with
    folds: tuple[int | None, ...]
    objective: str

    def published_point(self) -> dict[str, Any]:
        lr = None
        if isinstance(self.published, ParametricLossParams):
            protocol = self.base.protocol
            lr = self.published.optimizer_lr(protocol.optimizer.lr, protocol.loss_lr_multiplier)
        return published_point(self.space, self.published, lr)

    def loss_params(self, values: Mapping[str, Any]) -> BaseModel:
        """The loss params of a trial; InvalidTrial when the values break the loss's constraints."""
        base = dict(self.base_values)
        if "param_lr" in values:  # an absolute lr replaces a published multiplier
            base.pop("param_lr_multiplier", None)
        try:
            return type(self.published).model_validate({**base, **values})
        except ValidationError as exc:
            raise InvalidTrial(first_error(exc, with_location=False)) from None

    def config(self, loss_params: BaseModel) -> RunConfig:
        return with_loss_params(self.base, loss_params)

    def evaluate(
        self,
        trial: Any,
        data: PreparedDataset,
        device: torch.device,
        on_fold: FoldCallback | None = None,
    ) -> float:
        """Train the trial's config on every fold; report the running mean after each fold and
        stop when the pruner says so (``optuna.TrialPruned``). Returns the mean over folds."""
        import optuna

        values = suggest(trial, self.space)
        config = self.config(self.loss_params(values))
        scores: list[float] = []
        for index, fold in enumerate(self.folds):
            outcome = train(config, data, device=device, fold=fold)
            epoch = outcome.selected_epoch
            row = next(h for h in outcome.history if h["epoch"] == epoch)
            value = float(row[f"val/{self.objective}"])
            scores.append(value)
            trial.set_user_attr(f"fold{index}", value)
            trial.set_user_attr(f"fold{index}_epoch", int(epoch))
            if on_fold is not None:
                on_fold(index, value, int(epoch))
            trial.report(statistics.fmean(scores), step=index)
            if index < len(self.folds) - 1 and trial.should_prune():
                raise optuna.TrialPruned(f"after fold {index}: running mean {statistics.fmean(scores):.4f}")
        return statistics.fmean(scores)


def make_search(params: Params, dataset: str, backbone: str, loss: str, num_folds: int) -> Search:
    """The search of one dataset x backbone x loss (``num_folds``: the prepared split's folds)."""
    tuning = tuning_settings(params)
    run = RunSpec(dataset, backbone, loss, tuning.dim, tuning.seed)
    protocol = params.protocol_for(run).model_copy(update={"test_feedback": False})
    base_values = params.loss_values_for(run)
    published = params.loss_models[loss].model_validate(base_values)
    space = tuning.dimensions(loss, LOSSES[loss].space(published), fixed=set(params.loss_values.get(loss, {})))
    folds = tuple(range(num_folds)) if num_folds else (None,)
    base = resolve_run(params, run, published, protocol)
    return Search(base, space, base_values, published, folds, tuning.objective)
