"""``protocols.<name>`` of ``params.yaml``: optimiser, schedule, augmentation, early stopping, overrides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from dmlbench.messages import first_error
from dmlbench.schema import StrictModel

SELECTION_METRICS = ("precision_at_1", "r_precision", "map_at_r")


class OptimizerConfig(StrictModel):
    """Optimiser of the trunk and head. ``no_weight_decay: timm``: none on 1-D parameters and the trunk's
    ``no_weight_decay()`` names, as timm's ``param_groups_layer_decay`` (``none``: the 2020 codes')."""

    name: Literal["adamw", "adam", "rmsprop", "sgd"] = "adamw"
    lr: PositiveFloat
    weight_decay: NonNegativeFloat = 0.0
    momentum: NonNegativeFloat = 0.0
    no_weight_decay: Literal["none", "timm"] = "none"


class SchedulerConfig(StrictModel):
    """Learning-rate schedule, stepped once per epoch. ``step``: lr *= gamma every step_size epochs."""

    name: Literal["constant", "step", "cosine"] = "constant"
    step_size: PositiveInt = 10
    gamma: PositiveFloat = 0.1


class AugmentConfig(StrictModel):
    """Image transforms in px (:mod:`dmlbench.data.augment`): ``train`` RandomResizedCrop or ``squash``,
    RandAugment (0 = off), flip; ``eval`` short side (or ``squash``) to ``eval_resize``, centre crop."""

    crop_size: PositiveInt
    eval_resize: PositiveInt
    crop_scale: tuple[PositiveFloat, PositiveFloat] = (0.16, 1.0)
    crop_ratio: tuple[PositiveFloat, PositiveFloat] = (3 / 4, 4 / 3)
    hflip: bool = True
    train: Literal["random_resized_crop", "squash"] = "random_resized_crop"
    eval: Literal["resize_crop", "squash"] = "resize_crop"
    rand_augment: NonNegativeInt = 0
    rand_augment_magnitude: NonNegativeInt = Field(9, le=30)  # torchvision's default, of its 31 bins
    interpolation: Literal["weights", "bilinear", "bicubic"] = "weights"

    @model_validator(mode="after")
    def _check(self) -> AugmentConfig:
        if self.eval_resize < self.crop_size:
            raise ValueError(f"eval_resize ({self.eval_resize}) must be >= crop_size ({self.crop_size})")
        if not (0 < self.crop_scale[0] <= self.crop_scale[1] <= 1):
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {list(self.crop_scale)}")
        if not (self.crop_ratio[0] <= self.crop_ratio[1]):
            raise ValueError(f"crop_ratio must satisfy low <= high, got {list(self.crop_ratio)}")
        return self


class EarlyStoppingConfig(StrictModel):
    """Validate every ``validate_every`` epochs; stop after ``patience`` validations without a new best
    (None: never). Reality Check: CUB every 2 epochs, patience 9 (powerful-benchmarker)."""

    validate_every: PositiveInt = 1
    patience: PositiveInt | None = None


# Keys an override may change per dataset/backbone; the model, selection and reference loss stay
# grid-wide (the embed and report stages read them from the protocol itself).
OVERRIDABLE_KEYS = (
    "epochs",
    "iterations_per_epoch",
    "batch_size",
    "samples_per_class",
    "classification_samples_per_class",
    "sampler",
    "optimizer",
    "scheduler",
    "warmup_epochs",
    "loss_lr_multiplier",
    "backbone_lr_multiplier",
    "layer_decay",
    "amp",
    "compile",
    "augment",
    "frozen_bn",
    "grad_clip",
    "grad_clip_norm",
    "early_stopping",
    "losses",
)


class ProtocolOverride(StrictModel):
    """Row of a per-dataset/backbone table (e.g. thesis Table 3); a missing list matches all;
    ``set`` holds protocol keys (nested keys merge)."""

    datasets: list[str] | None = Field(None, min_length=1)
    backbones: list[str] | None = Field(None, min_length=1)
    set: dict[str, Any] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> ProtocolOverride:
        unknown = sorted(set(self.set) - set(OVERRIDABLE_KEYS))
        if unknown:
            raise ValueError(f"set: cannot override {unknown}; allowed: {', '.join(OVERRIDABLE_KEYS)}")
        return self

    def matches(self, dataset: str, backbone: str) -> bool:
        return (self.datasets is None or dataset in self.datasets) and (
            self.backbones is None or backbone in self.backbones
        )


class Protocol(StrictModel):
    """A training protocol, written out in full: the same for every loss, as fairness demands.

    Batches: :mod:`dmlbench.train.sampling` (``class_pass``: Hyp-ViT's ``UniqueClassSempler``, for every
    loss). ``warmup_epochs``: only the head and the loss train (Proxy-Anchor). ``layer_decay``: BEiT (Bao et al.,
    ICLR 2022) as timm's ``param_groups_layer_decay``: head decay^0, block i of depth d decay^(d - i)
    (:mod:`dmlbench.train.optim`). ``head: none``: the pooled, L2-normalised trunk feature (Berton et al.
    2025), ``dim`` = the trunk's width. ``amp: auto``: bf16 (else fp16) on CUDA, none on the CPU; ``fp32``:
    no autocast, no TF32. ``losses.<name>``: published hyperparameters, validated in :func:`parse_params`.
    """

    description: str = ""
    epochs: PositiveInt
    iterations_per_epoch: PositiveInt | None = None
    batch_size: PositiveInt
    samples_per_class: PositiveInt = 4
    classification_samples_per_class: PositiveInt | Literal["random"] | None = None
    sampler: Literal["pml", "class_pass"] = "pml"
    optimizer: OptimizerConfig
    scheduler: SchedulerConfig = SchedulerConfig()
    warmup_epochs: NonNegativeInt = 0
    loss_lr_multiplier: PositiveFloat | None = None  # overrides every loss's param_lr_multiplier
    backbone_lr_multiplier: PositiveFloat = 1.0  # trunk lr = optimizer.lr x this (head: optimizer.lr)
    layer_decay: float = Field(1.0, gt=0.0, le=1.0)  # per trunk layer group, from the top
    amp: Literal["auto", "none", "fp32", "bf16", "fp16"] = "auto"
    compile: Literal["auto", "on", "off"] = "off"  # torch.compile of the training step's model (train/compiling.py)
    augment: AugmentConfig
    pretrained: bool = False
    frozen_bn: bool = False
    freeze: list[str] = Field(default_factory=list)  # trunk modules (by name) that never train
    pooling: Literal["gap", "gmp", "gap+gmp", "cls", "native"] = "gap"
    head: Literal["linear", "none"] = "linear"
    head_init: Literal["kaiming", "orthogonal"] = "kaiming"
    grad_clip: PositiveFloat | None = None  # clip each gradient value to [-grad_clip, grad_clip]
    grad_clip_norm: PositiveFloat | None = None  # clip the model gradient's 2-norm to this
    reference_loss: str | None = None  # the loss the protocol's source trained (its published numbers)
    selection_metric: Literal[SELECTION_METRICS] = "map_at_r"  # type: ignore[valid-type]
    early_stopping: EarlyStoppingConfig = EarlyStoppingConfig()
    test_feedback: bool = True  # also score the test split at each validation (analysis only)
    test_feedback_metric: Literal[SELECTION_METRICS] = "precision_at_1"  # type: ignore[valid-type]
    eval_batch_size: PositiveInt = 256
    backbones: list[str] | None = Field(None, min_length=1)  # if set, the grid may only use these
    dims: list[PositiveInt] | None = Field(None, min_length=1)  # if set, the grid may only use these
    losses: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # published: ``losses`` above (else the defaults); tuned: the tune@ stage's best values
    hyperparameters: Literal["published", "tuned"] = "published"
    # cuda: needs a GPU (pre-flight refuses a grid without one; Slurm asks for one); auto: a GPU if any
    device: Literal["cuda", "cpu", "auto"] = "auto"
    overrides: list[ProtocolOverride] = Field(default_factory=list)

    @field_validator("compile", mode="before")
    @classmethod
    def _yaml_switch(cls, value: Any) -> Any:
        """YAML 1.1 reads an unquoted ``off``/``on`` as a boolean: take it as the word."""
        return {False: "off", True: "on"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _check(self) -> Protocol:
        if self.batch_size % self.samples_per_class:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of samples_per_class ({self.samples_per_class})"
            )
        m = self.classification_samples_per_class
        if isinstance(m, int) and self.batch_size % m:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of classification_samples_per_class ({m})"
            )
        if self.sampler == "class_pass" and (
            self.iterations_per_epoch is not None or self.classification_samples_per_class is not None
        ):
            raise ValueError(
                "sampler class_pass: an epoch is one pass over the classes and every loss gets its batches; "
                "leave iterations_per_epoch and classification_samples_per_class unset (null)"
            )
        if self.head == "none" and self.head_init != "kaiming":
            raise ValueError("head_init applies to head: linear, not head: none")
        if self.warmup_epochs >= self.epochs:
            raise ValueError(f"warmup_epochs ({self.warmup_epochs}) must be < epochs ({self.epochs})")
        for index, override in enumerate(self.overrides):
            try:
                self.with_override(override)
            except ValidationError as exc:
                raise ValueError(f"overrides[{index}]: {first_error(exc)}") from None
        return self

    def with_override(self, override: ProtocolOverride) -> Protocol:
        merged = deep_merge(self.model_dump(exclude={"overrides"}), override.set)
        return Protocol.model_validate(merged)

    def for_run(self, dataset: str, backbone: str) -> Protocol:
        """This protocol with every matching override applied, in order (overrides dropped)."""
        protocol = self.model_copy(update={"overrides": []})
        for override in self.overrides:
            if override.matches(dataset, backbone):
                protocol = protocol.with_override(override)
        return protocol

    def sampling_for(self, loss_sampler: str) -> int | Literal["random"]:
        """Images per class in a batch for a loss with ``LossSpec.sampler`` (or ``random``)."""
        if loss_sampler == "m_per_class" or self.classification_samples_per_class is None or self.sampler != "pml":
            return self.samples_per_class
        return self.classification_samples_per_class


def augment_for(
    augment: AugmentConfig, overrides: list[ProtocolOverride], dataset: str, backbone: str
) -> AugmentConfig:
    """A protocol's ``augment`` for one dataset and backbone, as :meth:`Protocol.for_run`, from these
    two keys only (the frozen-trunk embedding stage depends on nothing else)."""
    merged = augment.model_dump()
    for override in overrides:
        if override.matches(dataset, backbone) and "augment" in override.set:
            merged = deep_merge(merged, override.set["augment"])
    return AugmentConfig.model_validate(merged)


def deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def protocol_values(name: str, protocol: Protocol) -> dict[str, Any]:
    """The protocol a run records: its name and every value (overrides applied) but ``compile`` (how
    the step runs, not what it computes) and the tables applied or recorded elsewhere."""
    return {
        "name": name,
        **protocol.model_dump(mode="json", exclude={"overrides", "backbones", "dims", "losses", "compile"}),
    }
