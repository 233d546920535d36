"""A short training run at real image size through the real training code
(``benchmarks/gpu_check.py``).

Generated glyph images at ``image_size`` px (the built-in dataset, rendered at full size and
prepared as the prepare stage does), a backbone from random initialisation, ``epochs`` x
``iterations`` steps of :func:`dmlbench.train.loop.train` with the demo protocol's optimiser
family at real-size settings (crop, batch, m images per class), one validation at the end.
What it shows: the real loop runs at that size on the device, the training loss goes down
(last epoch's mean < first epoch's), and how much device memory it takes.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dmlbench.data import DATASETS
from dmlbench.data.cache import PreparedDataset
from dmlbench.data.prepare import prepare_dataset
from dmlbench.grid import RunSpec
from dmlbench.params.load import parse_params
from dmlbench.params.run import run_config
from dmlbench.train.loop import train

DATASET = "glyphs"


@dataclass(frozen=True)
class RealSizeSetting:
    backbone: str = "resnet50"
    loss: str = "multi_similarity"
    dim: int = 512
    image_size: int = 256
    crop: int = 224
    batch: int = 100
    per_class: int = 4
    epochs: int = 6
    iterations: int = 50
    classes: int = 60  # 30 train classes (27 after 10% validation), 25 per batch of 100
    images_per_class: int = 16
    lr: float = 1e-4


@dataclass
class RealSizeResult:
    setting: RealSizeSetting
    device: str
    steps: int
    train_seconds: float
    epoch_losses: list[float] = field(default_factory=list)
    peak_memory_mib: float | None = None
    final_val: dict[str, float] = field(default_factory=dict)

    @property
    def loss_decreased(self) -> bool:
        return len(self.epoch_losses) >= 2 and self.epoch_losses[-1] < self.epoch_losses[0]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "loss_decreased": self.loss_decreased}


def real_size_params(base: dict, setting: RealSizeSetting) -> dict:
    """``base`` (params.yaml as loaded) with one glyph dataset at ``image_size`` px and the
    demo protocol at the real-size ``setting``; one run (``setting``'s backbone, loss, dim)."""
    raw = copy.deepcopy(base)
    glyphs = raw["datasets"][DATASET]
    glyphs["source"].update(
        num_classes=setting.classes, images_per_class=setting.images_per_class, render_size=setting.image_size
    )
    glyphs["image_size"] = setting.image_size
    glyphs["split"] = {"scheme": "fixed_val", "val_fraction": 0.1, "seed": 0}  # one model, one validation split
    raw["datasets"] = {DATASET: glyphs}
    raw["backbones"] = {setting.backbone: {}}
    raw["losses"] = {setting.loss: {}}
    raw["dims"], raw["seeds"] = [setting.dim], [0]
    protocol = raw["protocols"][raw["protocol"]]
    protocol.update(
        epochs=setting.epochs,
        iterations_per_epoch=setting.iterations,
        batch_size=setting.batch,
        samples_per_class=setting.per_class,
        pretrained=False,
        frozen_bn=False,  # random initialisation: batch norm must learn its statistics
        test_feedback=False,
        losses={},
        hyperparameters="published",  # a throughput check of the loop: no search first
    )
    protocol["optimizer"].update(lr=setting.lr)
    protocol["scheduler"].update(name="constant")
    protocol["augment"].update(crop_size=setting.crop, eval_resize=setting.image_size)
    protocol["early_stopping"].update(validate_every=setting.epochs, patience=None)
    raw.setdefault("tuning", {})["baselines"] = []  # published values: nothing to compare with
    return raw


def real_size_run(base: dict, workdir: Path, device: torch.device, setting: RealSizeSetting) -> RealSizeResult:
    """Render, prepare and train once (``workdir`` holds the data); see the module docstring."""
    params = parse_params(real_size_params(base, setting))
    spec, dataset_params = DATASETS[DATASET], params.datasets[DATASET]
    workdir = Path(workdir)
    if not (workdir / "prepared").exists():
        spec.fetch(dataset_params, workdir / "raw", workdir / "dropbox")
        prepare_dataset(spec, dataset_params, workdir / "raw", workdir / "prepared")
    data = PreparedDataset.load(workdir / "prepared")
    run = RunSpec(DATASET, setting.backbone, setting.loss, setting.dim, 0)
    losses: list[float] = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    outcome = train(
        run_config(params, run), data, device=device, on_epoch=lambda epoch, m: losses.append(m["train/loss"])
    )
    seconds = time.perf_counter() - started
    last = outcome.history[-1]
    return RealSizeResult(
        setting=setting,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        steps=setting.epochs * setting.iterations,
        train_seconds=seconds,
        epoch_losses=losses,
        peak_memory_mib=torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        final_val={k.removeprefix("val/"): v for k, v in last.items() if k.startswith("val/")},
    )
