"""The training loop: the same for every loss, backbone and dataset (fair-comparison rule).

Selection uses validation classes only; ``test_feedback/<metric>`` records what test-set selection
would have reported, for analysis only. A non-finite loss, embedding or weight raises
:class:`~dmlbench.errors.TrainingDiverged`. Randomness derives from (seed, epoch) and checkpoints carry
every RNG state, so a resumed run repeats an uninterrupted one (on CPU)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmlbench.data.augment import rand_augment, resolve_interpolation, squash_train_transform, train_transform
from dmlbench.data.cache import PreparedDataset, SplitData
from dmlbench.devices import default_device
from dmlbench.errors import TrainingDiverged
from dmlbench.evaluate.embed import compute_embeddings, nonfinite_rows
from dmlbench.evaluate.metrics import retrieval_metrics
from dmlbench.models import EmbeddingModel
from dmlbench.params.protocol import Protocol
from dmlbench.params.run import RunConfig
from dmlbench.train.checkpoint import TrainState, save_checkpoint
from dmlbench.train.compiling import CompileChoice, choose_compile
from dmlbench.train.divergence import FiniteWatch, diverged, finite_check_interval
from dmlbench.train.optim import freeze_modules, make_loss_optimizer, make_model_optimizer, make_scheduler
from dmlbench.train.rng import epoch_seed, restore_rng_state, rng_state, seed_everything
from dmlbench.train.sampling import batches_per_epoch, class_pass_batches, epoch_batches
from dmlbench.train.step import FastPath, ImageSource, TrainStep

EpochCallback = Callable[[int, dict[str, float]], None]
TEST_FEEDBACK = "test_feedback"


@dataclass
class TrainOutcome:
    """What a finished training run hands to the stage that saves it."""

    model_state: dict[str, Any]
    history: list[dict[str, float]]
    selected_epoch: int
    selection: dict[str, Any]
    num_classes: int
    resumed_from_epoch: int = 0
    test_feedback: dict[str, Any] | None = None
    stopped_early: bool = False
    precision: str = "fp32"  # the step's arithmetic (FastPath.precision) in the process that finished it
    compiled: str = "off"  # whether its model ran compiled, and why (CompileChoice.describe)


def set_warmup(trunk: list[torch.nn.Parameter], warm: bool) -> None:
    """During warm-up only the head (and the loss's parameters) get gradients: ``trunk`` are the
    trunk parameters that train (frozen BatchNorm and ``freeze``-d modules never do)."""
    for parameter in trunk:
        parameter.requires_grad_(not warm)


class _Scorer:
    """Embeds splits with the eval transform and scores them (a split against itself, or query against
    gallery); non-finite embeddings raise :class:`TrainingDiverged` naming ``where``, epoch and split."""

    def __init__(self, protocol: Protocol, recall_ks: tuple[int, ...], fast: FastPath, where: str):
        self.protocol, self.recall_ks, self.fast, self.where = protocol, recall_ks, fast, where

    def _embed(self, model: torch.nn.Module, split: SplitData, name: str, epoch: int) -> np.ndarray:
        aug = self.protocol.augment
        with self.fast.autocast():
            embeddings = compute_embeddings(
                model,
                split.images,
                aug.eval_resize,
                aug.crop_size,
                self.protocol.eval_batch_size,
                self.fast.device,
                sizes=split.sizes,
                squash=aug.eval == "squash",
                interpolation=aug.interpolation,
            )
        bad = nonfinite_rows(embeddings)
        if bad:
            optimizer = self.protocol.optimizer
            raise TrainingDiverged(
                f"{self.where}: {bad} of {len(embeddings)} {name} embeddings are not finite at epoch {epoch}; lower "
                f"the learning rate (optimizer.lr, now {optimizer.lr:g}) or clip gradients (protocol key grad_clip)",
                cause=f"{name} embeddings",
                epoch=epoch,
            )
        return embeddings

    def __call__(
        self, model: torch.nn.Module, epoch: int, name: str, split: SplitData, gallery: SplitData | None = None
    ) -> dict[str, float]:
        """Metrics of ``split`` (``name``: validation or test feedback) at ``epoch``."""
        queries = self._embed(model, split, name, epoch)
        if gallery is None:
            return retrieval_metrics(queries, split.labels, recall_ks=self.recall_ks)
        gallery_embeddings = self._embed(model, gallery, f"{name} gallery", epoch)
        return retrieval_metrics(queries, split.labels, gallery_embeddings, gallery.labels, self.recall_ks)


@dataclass
class _Parts:
    """The trainable pieces of a run and the step that updates them."""

    model: EmbeddingModel
    loss_fn: torch.nn.Module
    optimizers: list[torch.optim.Optimizer]
    schedulers: list[Any]
    step: TrainStep
    trunk: list[torch.nn.Parameter]  # the trunk parameters that train (warm-up switches them off)

    def load(self, state: TrainState) -> None:
        self.model.load_state_dict(state.model)
        self.loss_fn.load_state_dict(state.loss)
        for opt, saved in zip(self.optimizers, state.optimizers, strict=True):
            opt.load_state_dict(saved)
        for sched, saved in zip(self.schedulers, state.schedulers, strict=True):
            sched.load_state_dict(saved)
        if self.step.scaler is not None and state.scaler:  # float16: the loss scale reached, not the initial one
            self.step.scaler.load_state_dict(state.scaler)

    def save_into(self, state: TrainState) -> TrainState:
        state.model, state.loss = self.model.state_dict(), self.loss_fn.state_dict()
        state.optimizers = [opt.state_dict() for opt in self.optimizers]
        state.schedulers = [sched.state_dict() for sched in self.schedulers]
        state.scaler = self.step.scaler.state_dict() if self.step.scaler is not None else {}
        return state


def _build_parts(config: RunConfig, num_classes: int, fast: FastPath, compiled: CompileChoice) -> _Parts:
    """Model, loss (+ miner), optimisers and schedulers, built in a fixed order (seeded RNG); the
    step runs the model as ``compiled`` says (compilation itself happens at the first step)."""
    protocol, loss_spec, loss_params = config.protocol, config.loss_spec, config.loss_params
    model = fast.prepare_model(config.build_model())
    freeze_modules(protocol, model)
    loss_fn = loss_spec.build(loss_params, num_classes, config.run.dim).to(fast.device)
    miner = loss_spec.miner(loss_params)
    optimizers = [make_model_optimizer(protocol, model)]
    if loss_spec.has_parameters:
        optimizers.append(make_loss_optimizer(protocol, loss_params, loss_fn.parameters()))
    schedulers = [make_scheduler(protocol.scheduler, opt, protocol.epochs) for opt in optimizers]
    step = TrainStep(
        model, loss_fn, miner, optimizers, fast, protocol.grad_clip, protocol.grad_clip_norm, compiled=compiled
    )
    trunk = [p for p in model.trunk_parameters() if p.requires_grad]
    return _Parts(model, loss_fn, optimizers, schedulers, step, trunk)


@dataclass(frozen=True)
class _Splits:
    """The splits one run reads: training images with labels 0..C-1, validation, and the
    test-set feedback split (the test split against itself, or queries vs gallery)."""

    train: SplitData
    labels: np.ndarray
    num_classes: int
    val: SplitData
    test: SplitData
    gallery: SplitData | None

    @classmethod
    def of(cls, data: PreparedDataset, fold: int | None) -> _Splits:
        train_split = data.split("train", fold=fold)
        test_split, gallery_split = data.split("test"), None
        if len(test_split) == 0 and len(data.split("query")) > 0:
            test_split, gallery_split = data.split("query"), data.split("gallery")
        classes = np.unique(train_split.labels)
        labels = np.searchsorted(classes, train_split.labels)
        return cls(train_split, labels, len(classes), data.split("val", fold=fold), test_split, gallery_split)


def train(
    config: RunConfig,
    data: PreparedDataset,
    checkpoint_dir: Path | None = None,
    resume: TrainState | None = None,
    on_epoch: EpochCallback | None = None,
    device: torch.device | None = None,
    extra_state: dict[str, Any] | None = None,
    fast_path: bool | None = None,
    fold: int | None = None,
) -> TrainOutcome:
    """Train the run of ``config``, continuing from ``resume`` (a checkpoint of this config) if given.
    ``fold``: train outside fold ``fold``, select on it. A checkpoint (with ``extra_state``) is written
    to ``checkpoint_dir`` after every epoch, then ``on_epoch(epoch, metrics)`` is called.
    ``fast_path``: None = on (:mod:`dmlbench.train.step`); ``compile``: see
    :func:`~dmlbench.train.compiling.choose_compile`.
    """
    device = device or default_device()
    fast = FastPath.for_device(device, fast_path, config.protocol.amp)
    run, protocol, chash = config.run, config.protocol, config.config_hash
    splits = _Splits.of(data, fold)
    where = run.key if fold is None else f"{run.key} fold {fold}"
    score = _Scorer(protocol, config.recall_ks, fast, where)
    has_val = len(splits.val) > 0
    test_feedback = protocol.test_feedback and len(splits.test) > 0
    if protocol.sampler == "class_pass":  # one pass over the classes: classes // (batch / per-class) batches
        per_epoch = splits.num_classes // (protocol.batch_size // int(protocol.samples_per_class))
    else:
        per_epoch = batches_per_epoch(len(splits.labels), protocol.batch_size, protocol.iterations_per_epoch)
    steps = protocol.epochs * per_epoch
    compiled = choose_compile(protocol.compile, device, steps)

    generator = seed_everything(run.seed)
    parts = _build_parts(config, splits.num_classes, fast, compiled)
    state = TrainState(config_hash=chash, extra=extra_state or {})
    if resume is not None:
        if resume.config_hash != chash:
            raise ValueError("resume checkpoint belongs to a different config")
        parts.load(resume)
        state.epoch, state.elapsed, state.history = resume.epoch, resume.elapsed, resume.history
        state.best, state.best_state = resume.best, resume.best_state
        restore_rng_state(resume.rng, generator)
    start_epoch = state.epoch
    epochs = _Epochs(config, splits, parts, device, where)
    stopped_early = bool(state.history) and state.history[-1].get("stopped_early", False)

    for epoch in range(start_epoch + 1, protocol.epochs + 1):
        if stopped_early:
            break
        generator, metrics = epochs.train_one(epoch)
        state.elapsed += metrics["train/epoch_seconds"]
        metrics["train/elapsed_seconds"] = state.elapsed
        validate = epoch % protocol.early_stopping.validate_every == 0 or epoch == protocol.epochs
        if validate and has_val:
            metrics.update({f"val/{k}": v for k, v in score(parts.model, epoch, "validation", splits.val).items()})
            stopped_early = _select(state, parts.model, epoch, metrics[f"val/{protocol.selection_metric}"], protocol)
        if validate and test_feedback:
            test_metrics = score(parts.model, epoch, "test feedback", splits.test, splits.gallery)
            metrics.update({f"{TEST_FEEDBACK}/{name}": value for name, value in test_metrics.items()})
        state.history.append({"epoch": epoch, **metrics, **({"stopped_early": True} if stopped_early else {})})
        state.epoch = epoch
        if checkpoint_dir is not None:
            state.rng = rng_state(generator)
            state.sampler = {"epoch_seed": epoch_seed(run.seed, epoch + 1), "per_class": epochs.per_class}
            save_checkpoint(checkpoint_dir, parts.save_into(state))
        if on_epoch is not None:
            on_epoch(epoch, metrics)
    outcome = _outcome(state, parts.model, protocol, has_val, splits.num_classes, start_epoch, stopped_early)
    outcome.precision, outcome.compiled = fast.precision, compiled.describe()
    return outcome


class _Epochs:
    """One training epoch: seeded batches, augmentation, steps, a divergence check every
    ``finite_check_interval`` batches (and after the last), schedulers. ``where``: named on divergence."""

    def __init__(self, config: RunConfig, splits: _Splits, parts: _Parts, device: torch.device, where: str):
        protocol = config.protocol
        self.run, self.protocol, self.parts, self.device, self.where = config.run, protocol, parts, device, where
        self.labels = splits.labels
        self.per_class = protocol.sampling_for(config.loss_spec.sampler)
        self.hflip = protocol.augment.hflip and config.dataset_spec.hflip_invariant
        # the resize kernel: the protocol's, or the weights' (pretrained_cfg)
        self.interpolation = resolve_interpolation(protocol.augment.interpolation, parts.model.interpolation)
        self.images = ImageSource(splits.train.images, device, splits.train.sizes)
        self.targets = torch.from_numpy(splits.labels).to(device)
        self.check_every = finite_check_interval(device)

    def transform(self, images: torch.Tensor, sizes: np.ndarray | None, generator: torch.Generator) -> torch.Tensor:
        """The protocol's training transform of a uint8 batch (:mod:`dmlbench.data.augment`)."""
        augment = self.protocol.augment
        if augment.train == "squash":
            return squash_train_transform(
                images,
                augment.crop_size,
                self.hflip,
                generator,
                sizes=sizes,
                interpolation=self.interpolation,
                rand_augment_ops=augment.rand_augment,
                rand_augment_magnitude=augment.rand_augment_magnitude,
            )
        inputs = train_transform(
            images,
            augment.crop_size,
            augment.crop_scale,
            augment.crop_ratio,
            self.hflip,
            generator,
            sizes=sizes,
            interpolation=self.interpolation,
        )
        if augment.rand_augment:
            inputs = rand_augment(inputs, augment.rand_augment, augment.rand_augment_magnitude, generator)
        return inputs

    def train_one(self, epoch: int) -> tuple[torch.Generator, dict[str, float]]:
        """Train epoch ``epoch``; return its augmentation generator (for the checkpoint) and metrics."""
        from tqdm import tqdm

        run, protocol, parts = self.run, self.protocol, self.parts
        generator = seed_everything(epoch_seed(run.seed, epoch))
        if protocol.sampler == "class_pass":
            batches = class_pass_batches(self.labels, protocol.batch_size, protocol.samples_per_class)
        else:
            batches = epoch_batches(self.labels, protocol.batch_size, self.per_class, protocol.iterations_per_epoch)
        set_warmup(parts.trunk, epoch <= protocol.warmup_epochs)
        parts.model.train()
        parts.loss_fn.train()
        started = time.perf_counter()
        watch = FiniteWatch(parts.step.named_state)
        desc = f"{run.key} epoch {epoch}/{protocol.epochs}"
        for index, batch in enumerate(tqdm(batches, desc=desc, unit="batch", mininterval=2.0, leave=False), 1):
            images, sizes = self.images.batch(batch), self.images.sizes_of(batch)
            inputs = self.transform(images, sizes, generator)
            parts.step(inputs, self.targets[torch.from_numpy(batch).to(self.device)], watch)
            if index % self.check_every == 0 or index == len(batches):
                found = watch.check()
                if found is not None:
                    raise diverged(self.where, epoch, found, protocol.optimizer.lr, protocol.grad_clip)
        lr = parts.optimizers[0].param_groups[0]["lr"]
        for sched in parts.schedulers:
            sched.step()
        seconds = time.perf_counter() - started
        return generator, {
            "train/loss": float(torch.stack(watch.losses).float().mean()),
            "train/lr": lr,
            "train/epoch_seconds": seconds,
            "train/images_per_second": batches.size / seconds,
        }


def _select(state: TrainState, model: torch.nn.Module, epoch: int, value: float, protocol: Protocol) -> bool:
    """Keep the weights of the best validation ``value`` so far; True when early stopping ends the run."""
    best = state.best
    if value > best["value"]:
        state.best = {"epoch": epoch, "value": value, "since": 0}
        state.best_state = copy.deepcopy({k: v.detach().cpu() for k, v in model.state_dict().items()})
    else:
        best["since"] += 1
    patience = protocol.early_stopping.patience
    return patience is not None and state.best["since"] >= patience and epoch < protocol.epochs


def _outcome(
    state: TrainState,
    model: torch.nn.Module,
    protocol: Protocol,
    has_val: bool,
    num_classes: int,
    start_epoch: int,
    stopped_early: bool,
) -> TrainOutcome:
    """The selected weights (best validation epoch; the last epoch without validation) and the run's record."""
    history = state.history
    if has_val:
        best_state = state.best_state
        selection = {
            "split": "val",
            "metric": protocol.selection_metric,
            "epoch": state.best["epoch"],
            "value": state.best["value"],
        }
    else:
        best_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        selection = {"split": None, "metric": None, "epoch": history[-1]["epoch"], "value": None}
    return TrainOutcome(
        model_state=best_state,
        history=[{k: v for k, v in h.items() if k != "stopped_early"} for h in history],
        selected_epoch=selection["epoch"],
        selection=selection,
        num_classes=num_classes,
        resumed_from_epoch=start_epoch,
        test_feedback=summarize_test_feedback(history, protocol.test_feedback_metric, selection["epoch"]),
        stopped_early=stopped_early,
    )


def summarize_test_feedback(history: list[dict[str, Any]], metric: str, selected_epoch: int) -> dict[str, Any] | None:
    """What test-set model selection would have reported (analysis only, never used to select)."""
    key = f"{TEST_FEEDBACK}/{metric}"
    scored = [h for h in history if key in h]
    if not scored:
        return None
    best = max(scored, key=lambda h: h[key])
    selected = next((h[key] for h in scored if h["epoch"] == selected_epoch), None)
    return {"metric": metric, "best_epoch": best["epoch"], "best_value": best[key], "selected_value": selected}
