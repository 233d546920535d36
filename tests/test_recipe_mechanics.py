"""What the modern recipes need from the training code, on the CPU: class-pass epochs (Hyp-ViT's
sampler), squash + RandAugment transforms (Berton et al. 2025), the last-classes validation split,
the head options (orthogonal init, none), gradient-norm clipping, and all of them in one tiny run
(a frozen patch embedding that stays frozen through warm-up)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from dmlbench.data.augment import eval_transform, rand_augment, squash_resize, squash_train_transform
from dmlbench.data.base import SplitConfig
from dmlbench.data.splits import last_val_classes
from dmlbench.errors import ConfigError
from dmlbench.grid import RunSpec
from dmlbench.models import BACKBONES, build_model
from dmlbench.params.load import parse_params
from dmlbench.params.protocol import Protocol
from dmlbench.params.run import run_config
from dmlbench.train.loop import train
from dmlbench.train.sampling import class_pass_batches
from dmlbench.train.step import FastPath, TrainStep


def test_a_class_pass_draws_every_class_once_with_m_images_in_batches_of_distinct_classes():
    labels = np.repeat(np.arange(10), [5, 5, 5, 5, 5, 5, 5, 5, 5, 2])  # class 9 has fewer than m = 3
    np.random.seed(0)
    batches = class_pass_batches(labels, 9, 3)
    assert batches.shape == (3, 9)  # floor(10 x 3 / 9): the incomplete last batch dropped
    for batch in batches:
        groups = labels[batch].reshape(3, 3)  # 3 classes x 3 images, a class's images consecutive
        assert (groups == groups[:, :1]).all() and len(set(groups[:, 0])) == 3
    seen = labels[batches.ravel()].reshape(-1, 3)[:, 0]
    assert len(set(seen)) == 9  # each class at most once in the epoch
    for c in range(9):  # without replacement where the class has m images
        rows = batches.ravel()[labels[batches.ravel()] == c]
        assert len(set(rows)) == len(rows) or c == 9
    np.random.seed(0)
    assert np.array_equal(class_pass_batches(labels, 9, 3), batches)  # seeded by the caller
    with pytest.raises(ConfigError, match="puts 4 distinct classes in a batch .* the training split has 3"):
        class_pass_batches(np.repeat(np.arange(3), 4), 8, 2)


def test_class_pass_is_refused_with_a_batch_count_or_a_second_sampler():
    base = {"epochs": 2, "batch_size": 8, "optimizer": {"lr": 0.1}, "augment": {"crop_size": 32, "eval_resize": 36}}
    for extra in ({"iterations_per_epoch": 5}, {"classification_samples_per_class": "random"}):
        with pytest.raises(ValueError, match="sampler class_pass: an epoch is one pass over the classes"):
            Protocol.model_validate({**base, "sampler": "class_pass", **extra})


def test_squash_resizes_the_valid_region_to_a_square_and_eval_squash_crops_its_centre():
    canvas = torch.zeros(2, 40, 40, 3, dtype=torch.uint8)
    canvas[0, :20, :40] = 200  # a 20 x 40 image (valid region), the rest padding
    canvas[1, :40, :10] = 100  # a 40 x 10 image
    sizes = np.array([[20, 40], [40, 10]])
    out = squash_resize(canvas, 16, sizes)
    assert out.shape == (2, 3, 16, 16)
    assert torch.allclose(out[0], torch.full_like(out[0], 200 / 255)) and torch.allclose(
        out[1], torch.full_like(out[1], 100 / 255)
    )
    cropped = eval_transform(canvas, 16, 12, sizes=sizes, squash=True)
    assert cropped.shape == (2, 3, 12, 12) and torch.equal(cropped, out[:, :, 2:14, 2:14])
    # the default short-side resize keeps the aspect ratio: the padding is never read, nor squashed
    kept = eval_transform(canvas, 16, 12, sizes=sizes)
    assert torch.allclose(kept[0], out[0, :, 2:14, 2:14])


def test_rand_augment_is_torchvisions_per_image_and_follows_the_generator():
    from torchvision.transforms import InterpolationMode, RandAugment

    torch.manual_seed(123)
    images = torch.randint(0, 256, (3, 3, 24, 24), dtype=torch.uint8).float() / 255
    first = rand_augment(images, 3, 9, torch.Generator().manual_seed(5))
    again = rand_augment(images, 3, 9, torch.Generator().manual_seed(5))
    other = rand_augment(images, 3, 9, torch.Generator().manual_seed(6))
    assert torch.equal(first, again) and not torch.equal(first, other)
    # the same draws through torchvision's transform, one image after another
    seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(5)))
    torch.manual_seed(seed)
    reference = RandAugment(3, 9, interpolation=InterpolationMode.BILINEAR)
    pixels = (images * 255).round().to(torch.uint8)
    expected = torch.stack([reference(image) for image in pixels]).float() / 255
    assert torch.equal(first, expected)


def test_rand_augment_leaves_the_global_rng_as_it_was():
    images = torch.rand(2, 3, 16, 16)
    torch.manual_seed(7)
    before = torch.rand(3)
    torch.manual_seed(7)
    rand_augment(images, 2, 9, torch.Generator().manual_seed(1))
    assert torch.equal(torch.rand(3), before)


def test_squash_train_transform_flips_only_when_asked():
    batch = torch.arange(16 * 16 * 3, dtype=torch.float32).reshape(1, 16, 16, 3).remainder(256).to(torch.uint8)
    batch = batch.repeat(64, 1, 1, 1)
    plain = squash_train_transform(batch, 8, False, torch.Generator().manual_seed(0))
    flipped = squash_train_transform(batch, 8, True, torch.Generator().manual_seed(0))
    assert torch.equal(plain, squash_resize(batch, 8))
    mirrored = (flipped == plain.flip(-1)).flatten(1).all(1)
    assert 10 < int(mirrored.sum()) < 54 and bool(((flipped == plain).flatten(1).all(1) | mirrored).all())


def test_last_val_validates_the_last_fifth_of_the_sorted_training_classes():
    config = SplitConfig(scheme="last_val", val_fraction=0.2)
    (val,) = last_val_classes(np.arange(100), config)
    assert list(val) == list(range(80, 100))
    (val,) = last_val_classes(np.arange(98), config)  # int(98 x 0.8) = 78
    assert list(val) == list(range(78, 98))


def test_head_orthogonal_and_head_none(small_raw_params):
    raw = copy.deepcopy(small_raw_params)
    raw["backbones"] = {"tiny_vit": {}}
    raw["dims"] = [32, 64]
    raw["protocols"][raw["protocol"]].update(pooling="cls", head_init="orthogonal")
    config = run_config(parse_params(raw), RunSpec("glyphs", "tiny_vit", "contrastive", 32, 0))
    head = config.build_model().head
    torch.testing.assert_close(head.weight @ head.weight.T, torch.eye(32))  # 32 x 64: orthonormal rows
    assert torch.equal(head.bias, torch.zeros(32))
    raw["protocols"][raw["protocol"]].update(head="none", head_init="kaiming")
    params = parse_params(raw)
    model = run_config(params, RunSpec("glyphs", "tiny_vit", "contrastive", 64, 0)).build_model().eval()
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(images), torch.nn.functional.normalize(model.features(images), dim=1))
    assert not list(model.head.parameters())
    with pytest.raises(ConfigError, match=r"head: none, so the embedding is the trunk's 64-d feature.*dims: \[64\]"):
        run_config(params, RunSpec("glyphs", "tiny_vit", "contrastive", 32, 0)).build_model()


def test_grad_clip_norm_bounds_the_models_gradient_norm():
    from pytorch_metric_learning.losses import ContrastiveLoss

    torch.manual_seed(0)
    model = build_model("tiny_vit", BACKBONES["tiny_vit"].params(), 8, pooling="cls")
    seen = []
    optimiser = torch.optim.SGD(model.parameters(), lr=0.0)

    def record(*args, **kwargs):
        seen.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).norm().item())

    optimiser.register_step_pre_hook(record)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    for clip in (None, 1e-3):
        step = TrainStep(
            model, ContrastiveLoss(), None, [optimiser], FastPath(torch.device("cpu")), grad_clip_norm=clip
        )
        step(torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(1)), labels)
    assert seen[0] > 1e-2 and seen[1] == pytest.approx(1e-3, rel=1e-3)


def test_a_tiny_run_with_every_recipe_key(small_raw_params, prepared_glyphs, tmp_path, monkeypatch):
    """tiny_vit on glyphs: class-pass epochs, squash + RandAugment, a frozen patch embedding (also
    through the warm-up epoch's switch), orthogonal head, gradient-norm clipping, the sphere loss."""
    from dmlbench.train import loop

    _, data = prepared_glyphs
    shapes = []

    def spy(*args):
        batches = class_pass_batches(*args)
        shapes.append(batches.shape)
        return batches

    monkeypatch.setattr(loop, "class_pass_batches", spy)
    step, graded = loop.TrainStep.__call__, []

    def watch_grads(self, *args, **kwargs):  # the frozen module gets no gradient (nor a share of the clipped norm)
        loss = step(self, *args, **kwargs)
        graded.append(any(p.grad is not None for p in self.model.trunk.net.patch_embed.parameters()))
        return loss

    monkeypatch.setattr(loop.TrainStep, "__call__", watch_grads)
    raw = copy.deepcopy(small_raw_params)
    raw["backbones"] = {"tiny_vit": {}}
    raw["losses"] = {"hyp_vit_sphere": {}}
    raw["protocols"][raw["protocol"]].update(
        epochs=2,
        warmup_epochs=1,
        sampler="class_pass",
        batch_size=10,
        samples_per_class=2,
        classification_samples_per_class=None,
        iterations_per_epoch=None,
        pooling="cls",
        head_init="orthogonal",
        freeze=["patch_embed"],
        grad_clip_norm=3.0,
        amp="none",
        test_feedback=False,
        augment={
            "crop_size": 32,
            "eval_resize": 32,
            "train": "squash",
            "eval": "squash",
            "rand_augment": 2,
            "hflip": False,
        },
    )
    params = parse_params(raw)
    run = RunSpec("glyphs", "tiny_vit", "hyp_vit_sphere", 32, 0)
    states = {}

    def keep(epoch, metrics):  # the checkpoint after each epoch (epoch 1: the warm-up, trunk untouched)
        states[epoch] = torch.load(tmp_path / "last.pt", weights_only=True)["model"]

    outcome = train(run_config(params, run), data, checkpoint_dir=tmp_path, on_epoch=keep, device=torch.device("cpu"))
    warm, state = states[1], states[2]
    for name in ("trunk.net.patch_embed.proj.weight", "trunk.net.blocks.0.attn.qkv.weight", "trunk.net.pos_embed"):
        assert name in warm
    assert torch.equal(state["trunk.net.patch_embed.proj.weight"], warm["trunk.net.patch_embed.proj.weight"])
    assert not torch.equal(state["trunk.net.blocks.0.attn.qkv.weight"], warm["trunk.net.blocks.0.attn.qkv.weight"])
    assert not torch.equal(state["trunk.net.pos_embed"], warm["trunk.net.pos_embed"])  # Hyp-ViT trains it
    assert not torch.equal(state["head.weight"], warm["head.weight"])
    assert [h["epoch"] for h in outcome.history] == [1, 2] and all(
        np.isfinite(h["train/loss"]) for h in outcome.history
    )
    assert graded == [False] * 6
    assert shapes == [(3, 10), (3, 10)]  # 15 training classes (20 - 5 validating) x 2 images, 5 a batch
    assert outcome.selection["split"] == "val"


def test_the_reports_setup_names_the_recipes_transforms(default_raw_params):
    from dmlbench.analysis.sections.setup import _transforms

    berton = Protocol.model_validate(default_raw_params["protocols"]["berton2025"]).augment
    hyp = Protocol.model_validate(default_raw_params["protocols"]["hyp_vit"]).augment
    assert _transforms(berton) == (
        "train transform Resize((224, 224)) + RandAugment(3, magnitude 9); eval transform Resize((224, 224)) "
        "+ centre crop 224"
    )
    assert _transforms(hyp) == (
        "train transform RandomResizedCrop(224, scale=[0.2, 1.0]); eval transform resize 224 + centre crop 224"
    )
