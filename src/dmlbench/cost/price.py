"""Every planned stage's estimate (:class:`dmlbench.cost.model.StageEstimate`) from the grid's params.
Seconds on the stage's device, bytes. ``train``: per model (one per fold) :func:`training_images`
plus validation passes at the rate of :mod:`dmlbench.cost.rates` (an upper bound); models 4 bytes
per parameter, embeddings float32. ``tune``: trials x folds trainings (upper bound with a pruner).
``baseline``: every seed at ``tuning.dim``; ``embed_pretrained``: one forward pass; ``evaluate``:
exact k-NN, ``2 n^2 dim`` FLOPs on the CPU; the other kinds (and ``published`` tune): assumed rates below.
MLflow: :data:`MLFLOW_BYTES_PER_RUN` plus :data:`MLFLOW_BYTES_PER_POINT` per metric value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dmlbench.cost.model import Rate, StageEstimate, training_images, training_seconds, validation_images
from dmlbench.cost.rates import (
    ASSUMED_CPU_PEAK_FLOPS_PER_CORE,
    MeasuredRow,
    flops_based_rate,
    gpu_peak_flops,
    measured_rate,
    model_size,
)
from dmlbench.cost.stages import PlannedStage
from dmlbench.data import DATASETS
from dmlbench.data.base import DEFAULT_NUM_FOLDS
from dmlbench.errors import ConfigError
from dmlbench.grid import Combo
from dmlbench.params.model import Params
from dmlbench.params.protocol import Protocol

GIB = 2**30
# assumed, stated in the plan's legend: what was never measured for these kinds
ASSUMED_SECONDS = {"validate": 10.0, "report": 60.0, "tune": 5.0, "evaluate": 10.0}
ASSUMED_REPORT_SECONDS_PER_RUN = 0.2  # report: reading one run's evaluation and curves
ASSUMED_ARCHIVE_BYTES_PER_S = 100e6  # download: md5 + unpack of an archive already in data/
ASSUMED_PREPARE_IMAGES_PER_S = 300.0  # prepare: JPEG decode + resize, per stage
ASSUMED_PROCESS_RAM = 2 * GIB  # a stage's Python, torch and libraries
MLFLOW_BYTES_PER_RUN = 50e3  # params, tags and the run log of one training run (SQLite + artifacts)
MLFLOW_BYTES_PER_POINT = 200.0  # one metric value: a row of SQLite's metrics table and its index
METRICS_PER_VALIDATION = 12  # values a validation logs (selection metric, P@1, R@K, feedback, loss, lr)
# tiny_cnn on 2 CPU cores: ~1,500 img/s x 2.39e7 training FLOPs/img = 36 % of 2 x 5e10 FLOP/s
DEFAULT_CPU_EFFICIENCY = 0.3
POOLED_WIDTH = 2048  # the pretrained baseline's pooled trunk features: at most 2,048 wide (assumed the widest)


@dataclass(frozen=True)
class PlanSettings:
    """How the grid will run: ``gpu_slots`` trainings share one GPU (each at 1 / ``gpu_slots`` of its rate),
    ``cores`` CPU threads per stage, ``efficiency``: the FLOP utilisation of a FLOP-based GPU rate."""

    gpu: bool
    gpu_slots: int = 1
    cores: int = 1
    efficiency: float = 0.05


@dataclass(frozen=True)
class DatasetSize:
    """Image counts of one dataset as the grid splits it, and its prepared cache's bytes."""

    train: int  # the official training half (validation classes come out of it)
    test: int  # the test half (In-Shop: query + gallery)
    folds: int  # models per training run (cross-validation folds, else 1)
    fold_train: int  # images one model trains on
    fold_val: int  # images one model is selected on
    cache_bytes: float  # N x canvas^2 x 3 uint8
    archive_bytes: float  # the archives' published sizes (0: generated or unknown)


def dataset_size(name: str, params: Any) -> DatasetSize:
    """The dataset's published counts (its registry entry), or a generated dataset's from its source."""
    spec = DATASETS[name]
    if spec.counts is not None:
        splits = {split: images for split, images, _ in spec.counts.splits}
        train, test = splits.get("train", 0), spec.counts.images - splits.get("train", 0)
    else:
        source = getattr(params, "source", None)
        classes, per_class = getattr(source, "num_classes", None), getattr(source, "images_per_class", None)
        if classes is None or per_class is None:
            raise ConfigError(f"datasets.{name}: no published counts to size it from")
        train = (classes // 2) * per_class  # the first half of the classes trains
        test = classes * per_class - train
    split = params.split
    if split.scheme in DEFAULT_NUM_FOLDS:
        folds = split.num_folds or DEFAULT_NUM_FOLDS[split.scheme]
        fold_val = train // folds
    elif split.scheme == "standard":
        folds, fold_val = 1, 0
    else:
        folds, fold_val = 1, round(train * split.val_fraction)
    canvas = params.canvas_size
    archive_bytes = float(sum(a.size or 0 for a in spec.archives))
    return DatasetSize(train, test, folds, train - fold_val, fold_val, (train + test) * canvas**2 * 3, archive_bytes)


def _assumed(seconds: float, **sizes: float) -> StageEstimate:
    """A CPU stage at an assumed duration (named by :meth:`Pricer.estimate`)."""
    return StageEstimate("", "", seconds, False, "assumed", ram_bytes=ASSUMED_PROCESS_RAM, **sizes)


class Pricer:
    """Estimates for one grid's stages: ``params``, how it runs, the measured throughput rows."""

    def __init__(self, params: Params, settings: PlanSettings, rows: Sequence[MeasuredRow]):
        self.params, self.settings, self.rows = params, settings, list(rows)
        self.peak, self.peak_note = gpu_peak_flops(self.rows)
        self.sizes = {name: dataset_size(name, p) for name, p in params.datasets.items()}
        self.notes: dict[str, str] = {}  # backbone -> where its rate comes from

    def rate(self, protocol: Protocol, backbone: str, dim: int) -> tuple[Rate, int]:
        """(training rate of one stage, model parameters) for ``backbone`` under ``protocol``."""
        flops, parameters = model_size(
            backbone, self.params.backbones[backbone], dim, self.params.protocol.pooling, protocol.augment.crop_size
        )
        if self.settings.gpu:
            rate = measured_rate(self.rows, self.params.protocol_name, backbone, protocol.batch_size, protocol.amp)
            if rate is None:
                rate = flops_based_rate(flops, self.peak, self.peak_note, self.settings.efficiency)
            self.notes.setdefault(backbone, rate.note)
            if self.settings.gpu_slots > 1:
                rate = Rate(rate.images_per_s / self.settings.gpu_slots, rate.source,
                            f"{rate.note}; / {self.settings.gpu_slots} GPU slots", rate.peak_memory_mib)  # fmt: skip
            return rate, parameters
        peak = ASSUMED_CPU_PEAK_FLOPS_PER_CORE * self.settings.cores
        note = f"assumed CPU peak {ASSUMED_CPU_PEAK_FLOPS_PER_CORE:.0e} FLOP/s x {self.settings.cores} core(s)"
        rate = flops_based_rate(flops, peak, note, DEFAULT_CPU_EFFICIENCY)
        self.notes.setdefault(backbone, rate.note)
        return rate, parameters

    def trainings(self, combo: Combo, models: int) -> StageEstimate:
        """``models`` trainings of ``combo`` (each one per fold), as one stage."""
        protocol = self.params.protocol_for(combo)
        size = self.sizes[combo.dataset]
        rate, parameters = self.rate(protocol, combo.backbone, combo.dim)
        epochs = protocol.epochs
        seen = training_images(epochs, protocol.iterations_per_epoch, protocol.batch_size, size.fold_train)
        scored = size.fold_val + (size.test if protocol.test_feedback else 0)
        embedded = validation_images(epochs, protocol.early_stopping.validate_every, scored) + size.fold_val + size.test
        per_model = training_seconds(seen, embedded, rate.images_per_s)
        validations = epochs // protocol.early_stopping.validate_every
        gpu_bytes = None if rate.peak_memory_mib is None else rate.peak_memory_mib * 2**20
        return StageEstimate(
            name="", kind="", seconds=models * size.folds * per_model, gpu=self.settings.gpu,
            source=rate.source, ram_bytes=size.cache_bytes + ASSUMED_PROCESS_RAM, gpu_bytes=gpu_bytes,
            cache_bytes=models * size.folds * (parameters * 4 + (size.fold_val + size.test) * combo.dim * 4),
            mlflow_bytes=models * size.folds * (MLFLOW_BYTES_PER_RUN + validations * METRICS_PER_VALIDATION
                                                * MLFLOW_BYTES_PER_POINT + epochs * MLFLOW_BYTES_PER_POINT),
        )  # fmt: skip

    def estimate(self, stage: PlannedStage) -> StageEstimate:
        """The estimate of one planned stage (:mod:`dmlbench.cost.stages`)."""
        item, kind = stage.item, stage.kind
        if kind in ("train", "tune", "baseline"):
            estimate = self._training_stage(kind, item)
        elif kind == "embed_pretrained":
            estimate = self._embed_pretrained(item["dataset"], item["backbone"])
        elif kind in ("evaluate", "evaluate_pretrained"):
            estimate = self._evaluate(
                item["dataset"], int(item.get("dim") or 0), len(self.params.seeds) if kind == "evaluate" else 1
            )
        elif kind in ("download", "prepare"):
            estimate = self._data(kind, str(item["key"]))
        elif kind == "report":
            runs = len(self.params.runs())
            estimate = _assumed(ASSUMED_SECONDS["report"] + ASSUMED_REPORT_SECONDS_PER_RUN * runs, mlflow_bytes=5e6)
        else:
            estimate = _assumed(ASSUMED_SECONDS.get(kind, 10.0))
        return replace(estimate, name=stage.name, kind=kind)

    def _training_stage(self, kind: str, item: dict[str, Any]) -> StageEstimate:
        tuned = self.params.protocol.hyperparameters == "tuned"
        tuning = dict(self.params.tuning)
        tuning_dim = int(tuning.get("dim") or max(self.params.dims))
        dataset, backbone, loss = item["dataset"], item["backbone"], item["loss"]
        if kind == "train":
            return self.trainings(Combo(dataset, backbone, loss, int(item["dim"])), 1)
        if kind == "baseline":
            return self.trainings(Combo(dataset, backbone, loss, tuning_dim), len(self.params.seeds))
        if not tuned:
            return _assumed(ASSUMED_SECONDS["tune"])
        trials = int(tuning.get("trials", 50))
        search = self.trainings(Combo(dataset, backbone, loss, tuning_dim), trials)
        return replace(search, cache_bytes=0.0)  # trials keep no models: best.yaml, trials.csv, the journal

    def _embed_pretrained(self, dataset: str, backbone: str) -> StageEstimate:
        protocol = self.params.protocol.for_run(dataset, backbone)
        size = self.sizes[dataset]
        rate, _ = self.rate(protocol, backbone, max(self.params.dims))
        images = size.test + size.fold_val
        return StageEstimate(
            "", "", images / (3 * rate.images_per_s), self.settings.gpu, rate.source,
            ram_bytes=size.cache_bytes + ASSUMED_PROCESS_RAM, cache_bytes=images * POOLED_WIDTH * 4,
        )  # fmt: skip

    def _evaluate(self, dataset: str, dim: int, runs: int) -> StageEstimate:
        size = self.sizes[dataset]
        width = dim or POOLED_WIDTH
        flops = runs * 2.0 * size.test**2 * width
        cpu = ASSUMED_CPU_PEAK_FLOPS_PER_CORE * self.settings.cores * DEFAULT_CPU_EFFICIENCY
        ram = ASSUMED_PROCESS_RAM + runs * size.test * width * 4 * 3  # embeddings, a float copy, neighbours
        return StageEstimate(
            "", "", ASSUMED_SECONDS["evaluate"] + flops / cpu, False, "flops (CPU, assumed)", ram_bytes=ram
        )

    def _data(self, kind: str, dataset: str) -> StageEstimate:
        size = self.sizes[dataset]
        if kind == "download":
            return _assumed(30.0 + size.archive_bytes / ASSUMED_ARCHIVE_BYTES_PER_S, cache_bytes=size.archive_bytes)
        return _assumed((size.train + size.test) / ASSUMED_PREPARE_IMAGES_PER_S, cache_bytes=size.cache_bytes)
