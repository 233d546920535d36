"""The training loop: the same for every loss, backbone and dataset (fair-comparison rule).

Per epoch: ``len(train) // batch_size`` batches from PML's ``MPerClassSampler``
(``samples_per_class`` images of ``batch_size / samples_per_class`` classes), batched
augmentation, loss (+ miner), one step of the model optimiser and, for losses that own
parameters, of their optimiser; then the schedulers step, the validation classes are
embedded and scored, and a checkpoint is written.

Model selection uses the validation split only (``protocol.selection_metric``); with no
validation split the last epoch is kept. Randomness is derived from (seed, epoch), so a
resumed run repeats exactly what an uninterrupted run would have done.
"""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from dmlbench.config import Params, RunSpec, config_hash
from dmlbench.data import DATASETS
from dmlbench.data.augment import train_transform
from dmlbench.data.cache import PreparedDataset
from dmlbench.errors import ConfigError, TrainingDiverged
from dmlbench.evaluate.embed import compute_embeddings
from dmlbench.evaluate.metrics import retrieval_metrics
from dmlbench.losses import LOSSES
from dmlbench.models import build_model
from dmlbench.train.checkpoint import code_fingerprint, save_checkpoint
from dmlbench.train.optim import make_optimizer, make_scheduler

EpochCallback = Callable[[int, dict[str, float]], None]


@dataclass
class TrainOutcome:
    """What a finished training run hands to the stage that saves it."""

    model_state: dict[str, Any]
    history: list[dict[str, float]]
    selected_epoch: int
    selection: dict[str, Any]
    num_classes: int
    resumed_from_epoch: int = 0


def epoch_seed(seed: int, epoch: int) -> int:
    """A 32-bit seed that depends only on (run seed, epoch)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy, torch and PML's sampler RNG; return a generator for augmentation."""
    from pytorch_metric_learning.utils import common_functions as pml_common

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    pml_common.NUMPY_RANDOM = np.random.RandomState(seed)
    return torch.Generator().manual_seed(seed)


def epoch_batches(labels: np.ndarray, batch_size: int, samples_per_class: int) -> np.ndarray:
    """Index batches (``n_batches x batch_size``) from PML's MPerClassSampler (seeded by caller)."""
    from pytorch_metric_learning.samplers import MPerClassSampler

    num_classes = len(np.unique(labels))
    if samples_per_class * num_classes < batch_size:
        raise ConfigError(
            f"protocol: batch_size {batch_size} needs >= {math.ceil(batch_size / samples_per_class)} training "
            f"classes at samples_per_class {samples_per_class}; the training split has {num_classes}"
        )
    sampler = MPerClassSampler(
        labels, m=samples_per_class, batch_size=batch_size, length_before_new_iter=max(len(labels), batch_size)
    )
    order = np.fromiter(iter(sampler), dtype=np.int64, count=len(sampler))
    return order.reshape(-1, batch_size)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train(
    run: RunSpec,
    params: Params,
    data: PreparedDataset,
    checkpoint_dir: Path | None = None,
    resume: dict[str, Any] | None = None,
    on_epoch: EpochCallback | None = None,
    device: torch.device | None = None,
    extra_state: dict[str, Any] | None = None,
) -> TrainOutcome:
    """Train one run, continuing from ``resume`` (a checkpoint of this config) if given.

    A checkpoint is written to ``checkpoint_dir`` after every epoch, carrying ``extra_state``
    (e.g. the MLflow run id); ``on_epoch(epoch, metrics)`` is called after each epoch.
    """
    from tqdm import tqdm

    device = device or default_device()
    protocol = params.protocol
    resolved = params.resolved(run)
    chash = config_hash(resolved)
    loss_spec = LOSSES[run.loss]
    loss_params = params.losses[run.loss]
    augment = protocol.augment
    hflip = augment.hflip and DATASETS[run.dataset].hflip_invariant
    recall_ks = tuple(params.evaluate.recall_at)

    train_split, val_split = data.split("train"), data.split("val")
    classes = np.unique(train_split.labels)
    train_labels = np.searchsorted(classes, train_split.labels)
    num_classes = len(classes)

    seed_everything(run.seed)
    model = build_model(
        run.backbone,
        params.backbones[run.backbone],
        run.dim,
        pooling=protocol.pooling,
        pretrained=protocol.pretrained,
        frozen_bn=protocol.frozen_bn,
    ).to(device)
    loss_fn = loss_spec.build(loss_params, num_classes, run.dim).to(device)
    miner = loss_spec.miner(loss_params)
    optimizers = [make_optimizer(protocol.optimizer, model.parameters(), protocol.optimizer.lr)]
    if loss_spec.has_parameters:
        loss_lr = protocol.optimizer.lr * loss_params.param_lr_multiplier
        optimizers.append(make_optimizer(protocol.optimizer, loss_fn.parameters(), loss_lr))
    schedulers = [make_scheduler(protocol.scheduler, opt, protocol.epochs) for opt in optimizers]

    history: list[dict[str, float]] = []
    best = {"epoch": 0, "value": -math.inf}
    best_state: dict[str, Any] | None = None
    start_epoch = 0
    elapsed = 0.0
    state = resume
    if state is not None:
        if state.get("config_hash") != chash:
            raise ValueError("resume checkpoint belongs to a different config")
        model.load_state_dict(state["model"])
        loss_fn.load_state_dict(state["loss"])
        for opt, saved in zip(optimizers, state["optimizers"], strict=True):
            opt.load_state_dict(saved)
        for sched, saved in zip(schedulers, state["schedulers"], strict=True):
            sched.load_state_dict(saved)
        history, best, best_state = state["history"], state["best"], state["best_state"]
        start_epoch, elapsed = state["epoch"], state["elapsed"]

    images = torch.from_numpy(train_split.images).to(device)
    targets = torch.from_numpy(train_labels).to(device)
    has_val = len(val_split) > 0

    for epoch in range(start_epoch + 1, protocol.epochs + 1):
        generator = seed_everything(epoch_seed(run.seed, epoch))
        batches = epoch_batches(train_labels, protocol.batch_size, protocol.samples_per_class)
        model.train()
        loss_fn.train()
        started = time.perf_counter()
        losses = []
        for step, batch in enumerate(
            tqdm(batches, desc=f"{run.key} epoch {epoch}/{protocol.epochs}", unit="batch", mininterval=2.0, leave=False)
        ):
            index = torch.from_numpy(batch).to(device)
            inputs = train_transform(
                images[index], augment.crop_size, augment.crop_scale, augment.crop_ratio, hflip, generator
            )
            labels = targets[index]
            embeddings = model(inputs)
            mined = miner(embeddings, labels) if miner is not None else None
            loss = loss_fn(embeddings, labels, mined)
            if not torch.isfinite(loss):
                raise TrainingDiverged(
                    f"{run.key}: loss is {loss.item()} at epoch {epoch}, batch {step + 1}; "
                    "lower the learning rate or check the loss hyperparameters"
                )
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            if protocol.grad_clip is not None:
                torch.nn.utils.clip_grad_value_(model.parameters(), protocol.grad_clip)
            for opt in optimizers:
                opt.step()
            losses.append(loss.item())
        lr = optimizers[0].param_groups[0]["lr"]
        for sched in schedulers:
            sched.step()
        seconds = time.perf_counter() - started
        elapsed += seconds

        metrics: dict[str, float] = {
            "train/loss": float(np.mean(losses)),
            "train/lr": lr,
            "train/epoch_seconds": seconds,
            "train/images_per_second": batches.size / seconds,
            "train/elapsed_seconds": elapsed,
        }
        if has_val:
            val_embeddings = compute_embeddings(
                model, val_split.images, augment.eval_resize, augment.crop_size, protocol.eval_batch_size, device
            )
            val_metrics = retrieval_metrics(val_embeddings, val_split.labels, recall_ks=recall_ks)
            metrics.update({f"val/{name}": value for name, value in val_metrics.items()})
            score = val_metrics[protocol.selection_metric]
            if score > best["value"]:
                best = {"epoch": epoch, "value": score}
                best_state = copy.deepcopy({k: v.detach().cpu() for k, v in model.state_dict().items()})
        history.append({"epoch": epoch, **metrics})
        if checkpoint_dir is not None:
            save_checkpoint(
                checkpoint_dir,
                {
                    "config_hash": chash,
                    "code": code_fingerprint(),
                    "epoch": epoch,
                    "elapsed": elapsed,
                    "model": model.state_dict(),
                    "loss": loss_fn.state_dict(),
                    "optimizers": [opt.state_dict() for opt in optimizers],
                    "schedulers": [sched.state_dict() for sched in schedulers],
                    "history": history,
                    "best": best,
                    "best_state": best_state,
                    "extra": extra_state or {},
                },
            )
        if on_epoch is not None:
            on_epoch(epoch, metrics)

    if has_val:
        selection = {
            "split": "val",
            "metric": protocol.selection_metric,
            "epoch": best["epoch"],
            "value": best["value"],
        }
    else:
        best_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        selection = {"split": None, "metric": None, "epoch": protocol.epochs, "value": None}
    return TrainOutcome(
        model_state=best_state,
        history=history,
        selected_epoch=selection["epoch"],
        selection=selection,
        num_classes=num_classes,
        resumed_from_epoch=start_epoch,
    )
