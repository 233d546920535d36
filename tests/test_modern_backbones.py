"""Modern backbones and the modern protocols' code paths, on the CPU: preprocessing from the
weights' timm config, CLS vs averaged-token pooling, the amp key, and ``tiny_vit`` end to end
through the train and embed stages (layer-wise learning rates: tests/test_optim_groups.py)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import timm
import torch

from dmlbench.data.augment import eval_transform, train_transform
from dmlbench.errors import ConfigError
from dmlbench.grid import RunSpec
from dmlbench.models import BACKBONES, build_model, clip_vitb16, convnext_tiny, dinov2_vits14
from dmlbench.params.load import parse_params
from dmlbench.params.protocol import Protocol
from dmlbench.train.optim import make_model_optimizer
from dmlbench.train.step import FastPath, TrainStep

MODERN = (
    "dinov2_vits14", "dinov2_vitb14", "dinov2_vits14_reg4", "dinov2_vitb14_reg4", "dinov3_vits16", "dinov3_vitb16",
    "dino_vits16", "clip_vitb16", "siglip2_vitb16", "in21k_vits16", "in21k_vitb16", "convnext_tiny",
)  # fmt: skip


def test_the_modern_backbones_are_registered_with_a_locked_hub_file():
    for name in MODERN:
        (file,) = BACKBONES[name].params().weights_files(name)
        assert file.url and file.url.startswith("https://huggingface.co/timm/") and not file.local_only


@pytest.mark.parametrize("module", [dinov2_vits14, clip_vitb16, convnext_tiny])
def test_preprocessing_comes_from_the_weights_config(module):
    cfg = timm.models.get_pretrained_cfg(module.MODEL_NAME)  # what timm publishes for these weights
    model = build_model(module.SPEC.name, module.SPEC.params(), 8, pooling="native")
    torch.testing.assert_close(model.normalize.mean.flatten(), torch.tensor(cfg.mean))
    torch.testing.assert_close(model.normalize.std.flatten(), torch.tensor(cfg.std))
    assert model.interpolation == cfg.interpolation == "bicubic"


def test_bicubic_transforms_differ_from_bilinear_and_stay_in_range():
    images = torch.randint(0, 256, (4, 40, 40, 3), dtype=torch.uint8)
    bilinear, bicubic = (eval_transform(images, 36, 32, interpolation=m) for m in ("bilinear", "bicubic"))
    assert bicubic.shape == bilinear.shape == (4, 3, 32, 32) and not torch.equal(bicubic, bilinear)
    assert 0.0 <= float(bicubic.min()) and float(bicubic.max()) <= 1.0
    crops = [
        train_transform(images, 32, (0.5, 1.0), (0.75, 1.33), True, torch.Generator().manual_seed(0), interpolation=m)
        for m in ("bilinear", "bicubic")
    ]
    assert not torch.equal(*crops) and 0.0 <= float(crops[1].min()) and float(crops[1].max()) <= 1.0
    with pytest.raises(ValueError, match="interpolation must be one of bilinear, bicubic"):
        eval_transform(images, 36, 32, interpolation="lanczos")


def test_cls_and_averaged_token_pooling_differ_and_have_the_trunks_width():
    images = torch.rand(3, 3, 32, 32)
    features = {}
    for pooling in ("cls", "gap"):
        torch.manual_seed(0)  # the same weights
        model = build_model("tiny_vit", BACKBONES["tiny_vit"].params(), 8, pooling=pooling).eval()
        with torch.no_grad():
            features[pooling] = model.features(images)
            tokens = model.trunk.net.forward_features(model.normalize(images))  # N x (1 + 64) x C, class token first
    assert tokens.shape == (3, 65, 64) and features["cls"].shape == features["gap"].shape == (3, 64)
    torch.testing.assert_close(features["cls"], tokens[:, 0])
    torch.testing.assert_close(features["gap"], tokens[:, 1:].mean(dim=1))  # patch tokens only (timm's "avg")
    assert not torch.allclose(features["cls"], features["gap"])


def test_cls_pooling_on_a_backbone_without_a_class_token_fails_in_one_line():
    with pytest.raises(ConfigError) as caught:
        build_model("tiny_cnn", BACKBONES["tiny_cnn"].params(), 8, pooling="cls")
    assert "\n" not in str(caught.value) and "tiny_cnn" in str(caught.value) and "use gap" in str(caught.value)


def _protocol(**keys) -> Protocol:
    base = {
        "epochs": 2,
        "batch_size": 8,
        "optimizer": {"name": "adamw", "lr": 0.001},
        "augment": {"crop_size": 32, "eval_resize": 36},
    }
    return Protocol.model_validate({**base, **keys})


def test_the_amp_key_is_validated_and_sets_the_autocast_dtype():
    for amp, dtype in (("none", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        assert _protocol(amp=amp).amp == amp
        assert FastPath.for_device(torch.device("cpu"), None, amp).amp_dtype == dtype
    assert FastPath.for_device(torch.device("cpu"), None, "auto").amp_dtype is None  # the CPU fast path
    with pytest.raises(ValueError, match="amp"):
        _protocol(amp="fp8")
    assert FastPath.for_device(torch.device("cpu"), None, "fp16").grad_scaler() is not None
    assert FastPath.for_device(torch.device("cpu"), None, "bf16").grad_scaler() is None


def test_amp_fp32_turns_tensorfloat32_off_and_the_others_restore_torchs_default():
    """``amp: fp32`` (the published 2020 protocols): no autocast and TF32 off for the process; any
    other setting puts torch's defaults back (cuDNN TF32 on, matrix products without it)."""
    fast = FastPath.for_device(torch.device("cpu"), None, "fp32")
    assert fast.amp_dtype is None and fast.strict_fp32 and fast.precision == "fp32"
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert not FastPath.for_device(torch.device("cpu"), None, "bf16").strict_fp32
    assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    from dmlbench.params.load import load_params

    published = load_params().protocols
    assert {name: published[name].amp for name in ("reality_check", "thesis", "proxy_anchor")} == dict.fromkeys(
        ("reality_check", "thesis", "proxy_anchor"), "fp32"
    )


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_a_mixed_precision_step_trains_the_tiny_vit_on_the_cpu(amp):
    from pytorch_metric_learning.losses import MultiSimilarityLoss

    torch.manual_seed(0)
    model = build_model("tiny_vit", BACKBONES["tiny_vit"].params(), 8, pooling="cls")
    fast = FastPath.for_device(torch.device("cpu"), False, amp)
    optimizer = make_model_optimizer(_protocol(layer_decay=0.75, amp=amp), model)
    step = TrainStep(model, MultiSimilarityLoss(), None, [optimizer], fast, grad_clip=1.0)
    before = model.trunk.net.blocks[0].attn.qkv.weight.detach().clone()
    loss = step(torch.rand(8, 3, 32, 32), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    assert torch.isfinite(loss) and (step.scaler is not None) == (amp == "fp16")
    assert not torch.equal(before, model.trunk.net.blocks[0].attn.qkv.weight)


@pytest.mark.parametrize("name", ["hyp_vit", "berton2025"])
def test_the_modern_protocols_train_the_modern_trunks_on_a_gpu(name, default_raw_params):
    """Their values against their sources: tests/test_recipes.py."""
    protocol = Protocol.model_validate(default_raw_params["protocols"][name])
    assert protocol.pooling == "cls" and protocol.pretrained and protocol.device == "cuda"
    assert protocol.selection_metric == "precision_at_1" and protocol.hyperparameters == "published"
    assert {b for b in protocol.backbones or [] if not b.startswith("timm_")} <= set(MODERN)


def test_tiny_vit_runs_through_the_train_and_embed_stages(small_raw_params, prepared_glyphs, in_project, mlflow_store):
    from dmlbench.evaluate.embed import embed_stage
    from dmlbench.train.stage import train_stage

    root, _ = prepared_glyphs
    (in_project / "artifacts" / "prepared").mkdir(parents=True)
    (in_project / "artifacts" / "prepared" / "glyphs").symlink_to(root / "prepared")
    raw = copy.deepcopy(small_raw_params)
    raw["backbones"] = {"tiny_vit": {}}
    raw["protocols"][raw["protocol"]].update(
        epochs=1,
        iterations_per_epoch=4,
        pooling="cls",
        backbone_lr_multiplier=0.5,
        layer_decay=0.75,
        amp="none",
        test_feedback=False,
    )
    params = parse_params(raw)
    run = RunSpec("glyphs", "tiny_vit", "multi_similarity", 32, 0)
    info = train_stage(params, run, device=torch.device("cpu"))
    embed_stage(params, run, device="cpu")
    model_dir = in_project / "artifacts/models/glyphs/tiny_vit/multi_similarity/32/seed0"
    history = json.loads((model_dir / "history.json").read_text())
    assert info and [h["epoch"] for h in history] == [1] and np.isfinite(history[0]["train/loss"])
    assert history[0]["train/lr"] == pytest.approx(raw["protocols"][raw["protocol"]]["optimizer"]["lr"])
    (file,) = (in_project / "artifacts").rglob("embeddings/**/*.npz")
    with np.load(file) as saved:
        arrays = [saved[key] for key in saved.files if saved[key].dtype.kind == "f"]
    assert arrays and all(a.ndim == 2 and a.shape[1] == 32 and np.isfinite(a).all() for a in arrays)
