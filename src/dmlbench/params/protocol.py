"""The training protocol section of ``params.yaml`` (``protocols.<name>``): optimiser,
schedule, augmentation, early stopping and per-dataset/backbone overrides.

A leaf of the params schema: it builds only on :mod:`dmlbench.schema`.
"""

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
    """Optimiser of the trunk and embedding head; ``lr`` in 1/step units of the optimiser.

    ``no_weight_decay``: ``none`` = ``weight_decay`` on every parameter (torch's optimisers as the
    2020 codes and Hyp-ViT call them); ``timm`` = none on 1-D parameters (biases, norm weights) and
    on the trunk's ``no_weight_decay()`` names (position embeddings, class and register tokens), as
    timm's ``param_groups_layer_decay`` and BEiT/MAE fine-tuning (``dmlbench.train.optim``)."""

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
    """Image transforms (:mod:`dmlbench.data.augment`).

    Train (``train``): ``random_resized_crop`` = RandomResizedCrop(crop_size, scale, ratio);
    ``squash`` = Resize((crop_size, crop_size)), the aspect ratio not kept. Then RandAugment
    (``rand_augment`` operations of magnitude ``rand_augment_magnitude``, torchvision's; 0 = off)
    and the optional flip. Eval (``eval``): ``resize_crop`` = resize the short side to
    ``eval_resize`` px, then centre crop ``crop_size`` px; ``squash`` = Resize((eval_resize,
    eval_resize)), then centre crop ``crop_size``. ``interpolation``: the resize kernel; ``weights``
    = the one the trunk's weights were trained with (timm's ``pretrained_cfg``)."""

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
    """Validation schedule: every ``validate_every`` epochs; stop after ``patience`` validations
    without a new best ``selection_metric`` (None: never stop early). Reality Check: CUB every
    2 epochs with patience 9 (powerful-benchmarker ``save_interval``/``patience``)."""

    validate_every: PositiveInt = 1
    patience: PositiveInt | None = None


# Protocol keys that an override may change for some datasets/backbones (``augment``: the embed
# stages resolve it per dataset and backbone, e.g. Hyp-ViT's eval resize, 256 on CUB, 224 elsewhere).
# Keys that change the model (pooling, pretrained, head), the selection or the reference loss stay
# the same for the whole grid: the embed and report stages read them from the protocol itself.
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
    """Row of a protocol's per-dataset/backbone table (e.g. thesis Table 3: lr and step size by
    dataset x backbone). Applies to runs whose dataset is in ``datasets`` and backbone in
    ``backbones`` (a missing list matches all); ``set`` holds protocol keys (nested keys merge)."""

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

    Batches (``sampler: pml``): losses that need several images per class (``LossSpec.sampler ==
    "m_per_class"``) get ``batch_size / samples_per_class`` classes x ``samples_per_class`` images
    (PML ``MPerClassSampler``); classification/proxy losses get ``classification_samples_per_class``
    per class, or uniformly random batches (``random``), or the same as the others (unset).
    An epoch is ``iterations_per_epoch`` batches, or one pass over the training images.
    ``sampler: class_pass`` (Hyp-ViT's ``UniqueClassSempler``): an epoch is one pass over the
    training classes, in a random order, ``samples_per_class`` images of each, ``batch_size /
    samples_per_class`` distinct classes per batch, the incomplete last batch dropped; every loss
    gets these batches (:mod:`dmlbench.train.sampling`).
    ``warmup_epochs``: only the embedding head and the loss's own parameters train (Proxy-Anchor).
    ``freeze``: trunk modules, by name, that never train (Hyp-ViT: ``patch_embed``).
    ``backbone_lr_multiplier``: the trunk trains at ``lr x backbone_lr_multiplier``, the head at
    ``lr``; ``layer_decay`` (BEiT, Bao et al., ICLR 2022, as used to fine-tune ViTs in MAE, He et al.,
    CVPR 2022, grouped as timm's ``param_groups_layer_decay``): the embedding head is the top layer
    (decay^0), block i of a depth-d ViT gets decay^(d - i), the embeddings decay^(d + 1)
    (:mod:`dmlbench.train.optim`; 1.0: one lr for the trunk).
    ``head``: ``linear`` = a linear map to ``dim`` (``head_init``: Kaiming-normal as Proxy-Anchor, or
    orthogonal with zero bias as Hyp-ViT); ``none`` = the pooled trunk feature itself, L2-normalised
    (Berton et al. 2025's ``feat_dim None``), so ``dim`` must be the trunk's width.
    ``grad_clip``: clip each gradient value; ``grad_clip_norm``: clip the 2-norm of the embedding
    model's gradient (``torch.nn.utils.clip_grad_norm_``, as Hyp-ViT at 3).
    ``reference_loss``: the loss the protocol's source trained, whose published numbers it gives
    (the report compares the grid's other losses with it).
    ``amp``: the training step's autocast: ``auto`` = bf16 (else fp16) on a CUDA GPU, none on the
    CPU; ``none``/``bf16``/``fp16`` force it; ``fp32``: no autocast, no TF32 (the 2020 protocols).
    ``compile``: ``torch.compile`` of the step's model (docs/gpu.md; not in the config hash).
    ``pooling: cls`` needs a class token; ``native``: the trunk's own (timm's ``global_pool``).
    ``losses.<name>``: the hyperparameters this protocol publishes for a loss (e.g. the Reality
    Check's tuned values; per dataset through ``overrides``), validated against the loss's own
    parameter model in :func:`parse_params`; a loss the protocol does not list keeps its defaults.
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
    # published: the losses' published values (``losses`` above, else the module defaults);
    # tuned: the best values of the tune@<dataset>-<backbone>-<loss> stage's search
    hyperparameters: Literal["published", "tuned"] = "published"
    # where training and embedding run: cuda = needs a GPU (the pipeline's device pre-flight refuses
    # a grid without one, and the Slurm executor asks for one per train/embed job); cpu = never a
    # GPU; auto = a GPU when torch sees one, else the CPU (the offline demo)
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
    """A protocol's ``augment`` for one dataset and backbone (its matching overrides applied):
    what :meth:`Protocol.for_run` gives, read from these two keys only (the frozen-trunk embedding
    stage depends on nothing else of the protocol)."""
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
    """The protocol a run records (``resolved["protocol"]``, ``config.yaml``): its name and every
    value of the run's protocol (overrides applied) but ``compile`` (how the step runs, not what it
    computes: a run resumes across it) and the tables already applied or recorded elsewhere."""
    return {
        "name": name,
        **protocol.model_dump(mode="json", exclude={"overrides", "backbones", "dims", "losses", "compile"}),
    }
