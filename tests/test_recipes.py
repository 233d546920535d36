"""The two modern recipes of params.yaml against their sources, value by value, and their presets.

* ``hyp_vit``: Hyp-ViT (Ermolov et al., CVPR 2022), github.com/htdt/hyp_metric at HEAD (c89de04;
  configs of 7343e13 "actual configs"): ``train.py``, ``model.py``, ``helpers.py``, ``README.md``.
* ``berton2025``: Berton, Musgrave & Masone 2025, github.com/gmberton/image-retrieval at HEAD
  (a9f4f75): ``main.py``, ``utils.py``, ``retrieval_model.py``.

Each table row: what the source sets (file:line), the value, and where it lands in the resolved
protocol of a run of the recipe's preset. Library defaults the sources rely on (torch's AdamW
weight decay, PML's sampler length and Multi-Similarity defaults, torchvision's RandAugment
magnitude) are read from the installed libraries, not restated."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torchvision
from helpers.project import ROOT
from pytorch_metric_learning.losses import MultiSimilarityLoss
from pytorch_metric_learning.miners import MultiSimilarityMiner
from pytorch_metric_learning.samplers import MPerClassSampler

from dmlbench.grid import RunSpec
from dmlbench.params.presets import load_preset
from dmlbench.params.protocol import Protocol
from dmlbench.params.run import run_config
from dmlbench.train.optim import make_loss_optimizer
from dmlbench.train.sampling import class_pass_batches

DINO, VIT_S = "dino_vits16", "in21k_vits16"
HYP_PRESETS = {"cub200": "hyp-vit-cub", "cars196": "hyp-vit-cars", "sop": "hyp-vit-sop", "inshop": "hyp-vit-inshop"}
BERTON_PRESETS = {
    "cub200": "berton2025-cub",
    "cars196": "berton2025-cars",
    "sop": "berton2025-sop",
    "inshop": "berton2025-inshop",
}
# the official training classes of each dataset (the halves of docs/datasets.md)
TRAIN_CLASSES = {"cub200": 100, "cars196": 98, "sop": 11318, "inshop": 3997}


def _default(function: Callable, name: str) -> Any:
    return inspect.signature(function).parameters[name].default


Get = Callable[[Protocol], Any]
HYP_VIT_ALL: list[tuple[str, Get, Any]] = [  # every dataset, the DINO trunk
    ("train.py:119 optim.AdamW(model.parameters(), lr=cfg.lr)", lambda p: p.optimizer.name, "adamw"),
    (
        "train.py:119 AdamW's default weight_decay",
        lambda p: p.optimizer.weight_decay,
        _default(torch.optim.AdamW, "weight_decay"),
    ),
    ("train.py:119 one group: every parameter decays", lambda p: p.optimizer.no_weight_decay, "none"),
    ("README.md:32,36,40,44 dino_vits16 --lr 1e-5", lambda p: p.optimizer.lr, 1e-5),
    ("train.py:119 one lr for the net", lambda p: (p.backbone_lr_multiplier, p.layer_decay), (1.0, 1.0)),
    ("train.py: no scheduler", lambda p: p.scheduler.name, "constant"),
    ("train.py:120 amp O2 (float16)", lambda p: p.amp, "fp16"),
    ("train.py:166 clip_grad_norm_(..., 3)", lambda p: (p.grad_clip_norm, p.grad_clip), (3.0, None)),
    ("train.py:106 UniqueClassSempler (one pass over the classes)", lambda p: p.sampler, "class_pass"),
    (
        "train.py:93-94 RandomResizedCrop(crop 224, scale=(0.2, 1.0))",
        lambda p: (p.augment.train, p.augment.crop_size, p.augment.crop_scale),
        ("random_resized_crop", 224, (0.2, 1.0)),
    ),
    ("train.py:94 PIL.Image.BICUBIC; helpers.py:93", lambda p: p.augment.interpolation, "bicubic"),
    ("train.py:96 RandomHorizontalFlip()", lambda p: p.augment.hflip, True),
    ("helpers.py:93-94 Resize(resize) + CenterCrop(crop)", lambda p: p.augment.eval, "resize_crop"),
    ("train.py:37 freeze 0 -> model.py:63 patch_embed", lambda p: p.freeze, ["patch_embed"]),
    ("model.py:24-26 Linear, bias 0, orthogonal_ weight", lambda p: (p.head, p.head_init), ("linear", "orthogonal")),
    ("model.py:69-73 rm_head: the body's class token", lambda p: p.pooling, "cls"),
    ("README.md:47 sphere version (--hyp_c 0)", lambda p: p.reference_loss, "hyp_vit_sphere"),
    ("README.md:47 --t 0.1", lambda p: p.losses["hyp_vit_sphere"]["temperature"], 0.1),
    ("train.py:169 evaluated at eval_ep only: the last epoch", lambda p: p.early_stopping.validate_every, "epochs"),
]
HYP_VIT_DATASET: dict[str, list[tuple[str, Get, Any]]] = {
    "cub200": [
        ("README.md:32 --num_samples 9 (train.py:33 bs 900)", lambda p: (p.batch_size, p.samples_per_class), (900, 9)),
        ("README.md:32 --ep 50", lambda p: p.epochs, 50),
        ("README.md:32 --resize 256 (train.py:46 crop 224)", lambda p: p.augment.eval_resize, 256),
    ],
    "cars196": [
        ("README.md:36 --num_samples 9 --bs 882", lambda p: (p.batch_size, p.samples_per_class), (882, 9)),
        ("README.md:36 --ep 300", lambda p: p.epochs, 300),
        ("train.py:45 resize 224", lambda p: p.augment.eval_resize, 224),
    ],
    "sop": [
        ("train.py:32-33 num_samples 2, bs 900", lambda p: (p.batch_size, p.samples_per_class), (900, 2)),
        ("README.md:40 --ep 200", lambda p: p.epochs, 200),
        ("train.py:45 resize 224", lambda p: p.augment.eval_resize, 224),
    ],
    "inshop": [
        ("train.py:32-33 num_samples 2, bs 900", lambda p: (p.batch_size, p.samples_per_class), (900, 2)),
        ("README.md:44 --ep 400", lambda p: p.epochs, 400),
        ("train.py:45 resize 224", lambda p: p.augment.eval_resize, 224),
    ],
}
BERTON: list[tuple[str, Get, Any]] = [
    ("main.py:96,114-115 torch.optim.Adam(model.parameters(), lr)", lambda p: p.optimizer.name, "adam"),
    (
        "main.py:115 Adam's default weight_decay",
        lambda p: p.optimizer.weight_decay,
        _default(torch.optim.Adam, "weight_decay"),
    ),
    ("main.py:87 --lr 1e-6", lambda p: p.optimizer.lr, 1e-6),
    (
        "main.py:88,124 --classifier_lr 1.0 (absolute)",
        lambda p: p.optimizer.lr * p.loss_lr_multiplier,
        pytest.approx(1.0),
    ),
    (
        "main.py: no scheduler, one lr",
        lambda p: (p.scheduler.name, p.backbone_lr_multiplier, p.layer_decay),
        ("constant", 1.0, 1.0),
    ),
    ("main.py:86 --batch_size 256", lambda p: p.batch_size, 256),
    ("main.py:89 --sampler_m 4; utils.py:67 MPerClassSampler", lambda p: (p.samples_per_class, p.sampler), (4, "pml")),
    ("utils.py:67 one sampler for every loss", lambda p: p.classification_samples_per_class, None),
    (
        "utils.py:67 PML's length_before_new_iter // batch",
        lambda p: p.iterations_per_epoch,
        _default(MPerClassSampler, "length_before_new_iter") // 256,
    ),
    ("main.py:145 range(100)", lambda p: p.epochs, 100),
    (
        "main.py:141,169-177 patience 3, every epoch",
        lambda p: (p.early_stopping.validate_every, p.early_stopping.patience),
        (1, 3),
    ),
    ("utils.py:113-116 precision_at_1 on the validation classes", lambda p: p.selection_metric, "precision_at_1"),
    ("main.py:148 autocast bfloat16, no GradScaler", lambda p: p.amp, "bf16"),
    ("main.py: no clipping", lambda p: (p.grad_clip, p.grad_clip_norm), (None, None)),
    (
        "utils.py:37,45 Resize(size=(224, 224)) train and test",
        lambda p: (p.augment.train, p.augment.eval, p.augment.crop_size, p.augment.eval_resize),
        ("squash", "squash", 224, 224),
    ),
    (
        "utils.py:38 RandAugment(num_ops=3), default magnitude",
        lambda p: (p.augment.rand_augment, p.augment.rand_augment_magnitude),
        (3, _default(torchvision.transforms.RandAugment, "magnitude")),
    ),
    ("utils.py:37-38 Resize's default and RandAugment's BILINEAR", lambda p: p.augment.interpolation, "bilinear"),
    ("utils.py:34-41 no flip", lambda p: p.augment.hflip, False),
    ("main.py:94 --feat_dim None; retrieval_model.py:33-35,50", lambda p: p.head, "none"),
    ("retrieval_model.py:48 DINOv2's forward: the class token", lambda p: p.pooling, "cls"),
    ("main.py: nothing frozen", lambda p: (p.freeze, p.frozen_bn), ([], False)),
    ("main.py:92-93 MultiSimilarityLoss + MultiSimilarityMiner", lambda p: p.reference_loss, "multi_similarity"),
    (
        "main.py:129,136 PML's defaults (losses.X(), miners.X())",
        lambda p: p.losses["multi_similarity"],
        {
            "alpha": _default(MultiSimilarityLoss, "alpha"),
            "beta": _default(MultiSimilarityLoss, "beta"),
            "base": _default(MultiSimilarityLoss, "base"),
            "miner_epsilon": _default(MultiSimilarityMiner, "epsilon"),
        },
    ),
]


def _protocol(preset: str, dataset: str, backbone: str) -> Protocol:
    params = load_preset(preset, ROOT / "params.yaml").params
    return params.protocol.for_run(dataset, backbone)


@pytest.mark.parametrize("dataset", sorted(HYP_PRESETS))
def test_hyp_vit_is_the_sources_recipe(dataset):
    protocol = _protocol(HYP_PRESETS[dataset], dataset, DINO)
    for cite, get, expected in HYP_VIT_ALL + HYP_VIT_DATASET[dataset]:
        expected = protocol.epochs if expected == "epochs" else expected
        assert get(protocol) == expected, cite
    # README.md:31,35,39,43: ViT-S (vit_small_patch16_224: timm 0.5's AugReg in21k -> in1k weights) at 3e-5
    assert _protocol(HYP_PRESETS[dataset], dataset, VIT_S).optimizer.lr == 3e-5


@pytest.mark.parametrize("dataset", sorted(BERTON_PRESETS))
def test_berton2025_is_the_sources_recipe(dataset):
    protocol = _protocol(BERTON_PRESETS[dataset], dataset, "dinov2_vitb14")
    for cite, get, expected in BERTON:
        assert get(protocol) == expected, cite


@pytest.mark.parametrize("dataset", sorted(HYP_PRESETS))
def test_hyp_vit_presets_train_all_training_classes_and_a_class_pass_is_the_sources_epoch(dataset):
    """No validation split (Hyp-ViT holds none out: the last epoch is the model); an epoch's batches =
    floor(classes x m / batch) (train.py:105-116): CUB 1, Cars 1, SOP 25, In-Shop 8."""
    params = load_preset(HYP_PRESETS[dataset], ROOT / "params.yaml").params
    assert params.datasets[dataset].split.scheme == "standard" and params.dims == [384]  # results.png: dim 384
    assert params.seeds == [0, 1, 2] and DINO in params.backbones
    assert list(params.losses)[0] == params.protocol.reference_loss == "hyp_vit_sphere"
    protocol = params.protocol.for_run(dataset, DINO)
    labels = np.repeat(np.arange(TRAIN_CLASSES[dataset]), 12)
    np.random.seed(0)
    batches = class_pass_batches(labels, protocol.batch_size, protocol.samples_per_class)
    expected = {"cub200": 1, "cars196": 1, "sop": 25, "inshop": 8}[dataset]
    assert batches.shape == (expected, protocol.batch_size)


@pytest.mark.parametrize("dataset", sorted(BERTON_PRESETS))
def test_berton2025_presets_validate_on_the_last_fifth_of_the_training_classes(dataset):
    """utils.py:74-95: split_point = int(classes x 0.8); the classes after it validate."""
    params = load_preset(BERTON_PRESETS[dataset], ROOT / "params.yaml").params
    split = params.datasets[dataset].split
    assert (split.scheme, split.val_fraction) == ("last_val", 0.2)
    assert list(params.backbones) == ["dinov2_vitb14"] and params.dims == [768]  # main.py:91 --dino_size b
    assert list(params.losses)[0] == params.protocol.reference_loss and params.seeds == [0, 1, 2]
    from dmlbench.data.splits import last_val_classes

    classes = np.arange(TRAIN_CLASSES[dataset])
    (val,) = last_val_classes(classes, split)
    assert len(val) == TRAIN_CLASSES[dataset] - int(TRAIN_CLASSES[dataset] * 0.8) and val[-1] == classes[-1]


def test_pmls_sampler_length_is_390_batches_of_256():
    """Berton's epoch: PML's MPerClassSampler with its default length, batches of 256 (utils.py:67-68)."""
    sampler = MPerClassSampler(np.repeat(np.arange(300), 6), m=4, batch_size=256)
    assert len(sampler) // 256 == 390


@pytest.mark.parametrize(("protocol", "dataset"), [("hyp_vit", "cub200"), ("berton2025", "sop")])
def test_subcenter_arcfaces_centres_train_at_a_proxy_sized_lr(protocol, dataset, default_raw_params):
    """Under Hyp-ViT's 1e-5 the sub-centres train at 1e-3, as Proxy-Anchor's proxies (x100); under
    Berton's recipe every classifier at its --classifier_lr 1.0."""
    import copy

    from dmlbench.params.load import parse_params

    raw = copy.deepcopy(default_raw_params)
    backbone = "dino_vits16" if protocol == "hyp_vit" else "dinov2_vitb14"
    raw.update(protocol=protocol, dims=[384 if protocol == "hyp_vit" else 768], seeds=[0])
    raw["datasets"] = {dataset: {"source": {}, "split": {"scheme": "standard"}}}
    raw["backbones"] = {backbone: {}}
    raw["losses"] = {"subcenter_arcface": {}, "proxy_anchor": {}}
    params = parse_params(raw)
    lrs = {}
    for loss in raw["losses"]:
        config = run_config(params, RunSpec(dataset, backbone, loss, raw["dims"][0], 0))
        module = config.loss_spec.build(config.loss_params, 4, 8)
        (group,) = make_loss_optimizer(config.protocol, config.loss_params, module.parameters()).param_groups
        lrs[loss] = group["lr"]
    expected = 1e-3 if protocol == "hyp_vit" else 1.0
    assert lrs == pytest.approx({"subcenter_arcface": expected, "proxy_anchor": expected})
