"""The cost model's arithmetic, free of I/O: images -> seconds, stages -> device-hours and wall time.

Wall time: the phases (:data:`PHASES`) one after another, each spread longest first (Graham's LPT
schedule, within 4/3 of optimal: Graham 1969, SIAM J. Appl. Math. 17(2)): an upper bound.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

# the order in which kinds of stages become ready (dvc.yaml's dependencies), one phase each
PHASES: tuple[tuple[str, ...], ...] = (
    ("validate",),
    ("download",),
    ("prepare",),
    ("tune",),
    ("train", "baseline", "embed_pretrained"),
    ("evaluate", "evaluate_pretrained"),
    ("report",),
)


@dataclass(frozen=True)
class Rate:
    """Training images per second of one (protocol, backbone) on one device; ``source``: ``measured``
    (the throughput table; ``note``: device, date) or ``flops`` (peak FLOP/s x efficiency / FLOPs per image)."""

    images_per_s: float
    source: str
    note: str
    peak_memory_mib: float | None = None  # the measured row's peak GPU memory (None: not measured)


def flop_rate(train_flops_per_image: float, peak_flops: float, efficiency: float) -> float:
    """Training images/s at a model FLOP utilisation ``efficiency``:
    ``peak_flops x efficiency / train_flops_per_image`` (training FLOPs = 3 x forward)."""
    if train_flops_per_image <= 0 or peak_flops <= 0 or not 0 < efficiency <= 1:
        raise ValueError("FLOPs per image and peak FLOP/s must be positive, the efficiency in (0, 1]")
    return peak_flops * efficiency / train_flops_per_image


def training_images(epochs: int, iterations_per_epoch: int | None, batch_size: int, train_images: int) -> int:
    """Images one training sees at most: ``epochs x iterations_per_epoch x batch_size``, or (None)
    ``epochs x floor(train_images / batch_size) x batch_size``; early stopping may end sooner."""
    per_epoch = iterations_per_epoch if iterations_per_epoch is not None else train_images // batch_size
    return epochs * per_epoch * batch_size


def validation_images(epochs: int, validate_every: int, scored_images: int) -> int:
    """Images embedded for validation over a training: ``floor(epochs / validate_every)`` passes
    over ``scored_images`` (the validation classes, plus the test classes with ``test_feedback``)."""
    return (epochs // validate_every) * scored_images


def training_seconds(train_images: int, embed_images: int, rate: float) -> float:
    """Seconds for ``train_images`` at ``rate`` training images/s and ``embed_images`` forward
    passes at 3 x that rate (a forward pass is a third of a training step's FLOPs)."""
    return train_images / rate + embed_images / (3 * rate)


@dataclass(frozen=True)
class StageEstimate:
    """One stage's estimate: seconds on its device (``gpu`` or CPU), peak RAM and GPU memory, DVC cache
    and MLflow growth (bytes), and the source of its seconds (``measured``, ``flops``, ``assumed``)."""

    name: str
    kind: str
    seconds: float
    gpu: bool
    source: str
    ram_bytes: float = 0.0
    gpu_bytes: float | None = None
    cache_bytes: float = 0.0
    mlflow_bytes: float = 0.0


def makespan(durations: Iterable[float], workers: int) -> float:
    """Wall time of ``durations`` on ``workers`` parallel slots, longest first to the least loaded."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    loads = [0.0] * workers
    for seconds in sorted(durations, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + seconds)
    return max(loads)


def wall_seconds(stages: Iterable[StageEstimate], workers: int) -> float:
    """The grid's wall time: the phases (:data:`PHASES`) one after another, each scheduled by
    :func:`makespan` on ``workers`` slots. A kind not in :data:`PHASES` runs in a phase of its own last."""
    by_phase: dict[int, list[float]] = {}
    known = {kind: index for index, kinds in enumerate(PHASES) for kind in kinds}
    for stage in stages:
        by_phase.setdefault(known.get(stage.kind, len(PHASES)), []).append(stage.seconds)
    return sum(makespan(durations, workers) for durations in by_phase.values())


def device_hours(stages: Iterable[StageEstimate]) -> float:
    """GPU-hours: the GPU stages' seconds / 3600 (one GPU per stage)."""
    return sum(s.seconds for s in stages if s.gpu) / 3600


class Eta:
    """The time left of a running plan: the wall time of the stages not done, each estimate scaled by
    measured / estimated seconds of its kind done so far (of all kinds while none; 1 before any).
    ``estimates``: the planned stages' by name; ``workers``: the run's parallel slots."""

    def __init__(self, estimates: Mapping[str, StageEstimate], workers: int):
        self.estimates = dict(estimates)
        self.workers = workers
        self.remaining = set(self.estimates)
        self.estimated_done: dict[str, float] = {}  # by kind
        self.measured_done: dict[str, float] = {}

    @property
    def correction(self) -> float:
        """Measured / estimated seconds of all the stages done (1.0 before any)."""
        estimated = sum(self.estimated_done.values())
        return sum(self.measured_done.values()) / estimated if estimated > 0 else 1.0

    def kind_correction(self, kind: str) -> float:
        """Measured / estimated seconds of the stages of ``kind`` done, else :attr:`correction`."""
        estimated = self.estimated_done.get(kind, 0.0)
        return self.measured_done[kind] / estimated if estimated > 0 else self.correction

    def done(self, stage: str, seconds: float | None) -> None:
        """``stage`` ended after ``seconds`` (None: skipped, its upstream re-ran to the same outputs)."""
        estimate = self.estimates.get(stage)
        self.remaining.discard(stage)
        if estimate is not None and seconds is not None and estimate.seconds > 0:
            self.estimated_done[estimate.kind] = self.estimated_done.get(estimate.kind, 0.0) + estimate.seconds
            self.measured_done[estimate.kind] = self.measured_done.get(estimate.kind, 0.0) + seconds

    def seconds_left(self) -> float:
        """Corrected wall time of the stages not yet done."""
        left = [self.estimates[name] for name in self.remaining]
        return wall_seconds([replace(e, seconds=e.seconds * self.kind_correction(e.kind)) for e in left], self.workers)

    def line(self) -> str:
        """``ETA 3 h 12 min (model x 1.40 after 12 stages)``: the progress bar's postfix."""
        done = len(self.estimates) - len(self.remaining)
        basis = f"model x {self.correction:.2f} after {done} stage(s)" if self.estimated_done else "model"
        return f"ETA {duration(self.seconds_left())} ({basis})"


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 12 min``, ``4 d 3 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"
