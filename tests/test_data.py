"""The offline glyph dataset through the registry, the prepared cache, and the batched transforms
(square and per-image ``sizes``) checked against torchvision."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from dmlbench.data import DATASETS
from dmlbench.data.augment import (
    crop_resize,
    eval_transform,
    sample_crop_boxes,
    sample_crop_boxes_px,
    to_float,
    train_transform,
)
from dmlbench.data.base import SplitConfig
from dmlbench.data.cache import PreparedDataset
from dmlbench.data.glyphs import GlyphsParams, class_characters, fonts_for, render_glyph
from dmlbench.data.prepare import prepare_dataset
from dmlbench.data.splits import assign_splits
from dmlbench.errors import DataError


def test_default_glyphs_is_a_real_benchmark_shape():
    params = GlyphsParams(source={})
    chars = class_characters(params.source.num_classes, params.source.seed)
    assert len(chars) == len(set(chars)) == 200
    assert params.source.render_size <= 64 and params.image_size <= 64
    assert all(len(fonts_for(c)) >= 4 for c in chars)
    assert DATASETS["glyphs"].hflip_invariant is False


def test_rendering_is_deterministic_and_varied():
    chars = class_characters(200, 0)
    a = render_glyph(chars[3], 64, np.random.default_rng([0, 3, 1]))
    b = render_glyph(chars[3], 64, np.random.default_rng([0, 3, 1]))
    assert a.shape == (64, 64, 3) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    same_class = np.stack([render_glyph(chars[3], 64, np.random.default_rng([0, 3, i])) for i in range(8)]).astype(
        float
    )
    # Intra-class variation: renders of one class differ substantially pixel by pixel.
    assert np.abs(same_class[1:] - same_class[:1]).mean() > 10
    # Ink is darker than paper in every image.
    for image in same_class:
        luma = image @ np.array([0.299, 0.587, 0.114])
        assert np.percentile(luma, 3) < np.median(luma) - 40


def test_generated_files_annotations_and_official_split(prepared_glyphs, small_params):
    root, data = prepared_glyphs
    labels = pd.read_csv(root / "raw" / "labels.csv")
    assert len(labels) == 40 * 16 and labels["label"].nunique() == 40
    assert all((root / "raw" / p).exists() for p in labels["path"])
    annotations = DATASETS["glyphs"].read_annotations(small_params.datasets["glyphs"], root / "raw")
    train_classes = set(annotations.loc[annotations.split == "train", "label"])
    test_classes = set(annotations.loc[annotations.split == "test", "label"])
    assert train_classes == set(range(20)) and test_classes == set(range(20, 40))


def test_fixed_val_split_is_class_disjoint_and_deterministic():
    frame = pd.DataFrame({"label": np.repeat(np.arange(40), 3), "split": np.repeat(["train"] * 20 + ["test"] * 20, 3)})
    split = assign_splits(frame, SplitConfig(scheme="fixed_val", val_fraction=0.1, seed=7))["split"]
    val_classes = set(frame.label[split == "val"])
    assert len(val_classes) == 2 and val_classes <= set(range(20))
    for name in ("train", "val", "test"):
        for other in ("train", "val", "test"):
            if name != other:
                assert not set(frame.label[split == name]) & set(frame.label[split == other])
    assert split.equals(assign_splits(frame, SplitConfig(scheme="fixed_val", val_fraction=0.1, seed=7))["split"])
    assert not split.equals(assign_splits(frame, SplitConfig(scheme="fixed_val", val_fraction=0.1, seed=8))["split"])
    standard = assign_splits(frame, SplitConfig(scheme="standard"))
    assert standard["split"].equals(frame.split) and (standard["fold"] == "").all()


def test_prepared_cache(prepared_glyphs):
    root, data = prepared_glyphs
    manifest = pd.read_csv(root / "prepared" / "manifest.csv", keep_default_na=False)
    assert list(manifest.columns) == ["path", "label", "class_name", "split", "fold"]
    assert (manifest.fold == "").all() and data.num_folds == 0
    # Glyph renders are square and max_aspect is 1: no padding, the canvas is the image.
    assert data.images.shape == (640, 36, 36, 3) and data.images.dtype == np.uint8
    stored = np.load(root / "prepared" / "sizes.npy")
    assert stored.shape == (640, 2) and (stored == 36).all()
    assert data.sizes is None  # every image fills its canvas: loaded as "no sizes" (square fast path)
    # Rows are grouped by split: train, then val, then test.
    order = manifest.split.map({"train": 0, "val": 1, "test": 2})
    assert order.is_monotonic_increasing
    assert data.info["splits"]["val"]["classes"] == 5  # 25% of 20 training classes
    assert data.info["splits"]["test"] == {"images": 320, "classes": 20}
    # The cache holds the decoded, resized file (row order = manifest order).
    first = np.asarray(
        Image.open(root / "raw" / manifest.path[5]).convert("RGB").resize((36, 36), Image.BILINEAR), dtype=float
    )
    assert np.abs(first - data.images[5]).mean() < 6
    train = data.split("train")
    assert len(train) == 240 and train.num_classes == 15 and train.sizes is None


def test_prepare_reports_unreadable_images(tmp_path, prepared_glyphs, small_params):
    root, _ = prepared_glyphs
    raw = tmp_path / "raw"
    import shutil

    shutil.copytree(root / "raw", raw)
    bad = sorted((raw / "images" / "004").iterdir())[2]
    bad.write_bytes(b"not a png")
    with pytest.raises(
        DataError, match=r"glyphs: 1 unreadable image\(s\): images/004/002.png \(UnidentifiedImageError.*skip_corrupt"
    ):
        prepare_dataset(DATASETS["glyphs"], small_params.datasets["glyphs"], raw, tmp_path / "prepared", workers=1)
    assert not (tmp_path / "prepared").exists()  # nothing half-written


def test_missing_prepared_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="run the prepare stage first"):
        PreparedDataset.load(tmp_path)


def test_crop_boxes_follow_torchvision_sampling():
    from torchvision.transforms import RandomResizedCrop

    generator = torch.Generator().manual_seed(0)
    width, height = sample_crop_boxes(20000, (0.16, 1.0), (3 / 4, 4 / 3), generator)
    area, aspect = width * height, width / height
    assert bool((width <= 1).all() and (height <= 1).all())
    assert 0.16 - 1e-6 <= float(area.min()) and float(area.max()) <= 1 + 1e-6
    assert 0.75 - 1e-4 <= float(aspect.min()) and float(aspect.max()) <= 4 / 3 + 1e-4
    # Same distribution as torchvision's own sampler on a square image (rejection included).
    torch.manual_seed(0)
    image = torch.zeros(3, 400, 400)
    boxes = [RandomResizedCrop.get_params(image, [0.16, 1.0], [3 / 4, 4 / 3]) for _ in range(20000)]
    reference = torch.tensor([h * w / 400**2 for _, _, h, w in boxes])
    for q in (0.1, 0.5, 0.9):
        assert abs(float(area.quantile(q)) - float(reference.quantile(q))) < 0.02


def test_train_and_eval_transforms():
    batch = torch.zeros(2, 36, 36, 3, dtype=torch.uint8)
    batch[:, :, :18] = 255  # left half white
    generator = torch.Generator().manual_seed(0)
    out = train_transform(batch, 32, (1.0, 1.0), (1.0, 1.0), hflip=False, generator=generator)
    assert out.shape == (2, 3, 32, 32) and 0 <= float(out.min()) and float(out.max()) <= 1
    assert float(out[:, :, :, :8].mean()) > 0.95 and float(out[:, :, :, -8:].mean()) < 0.05
    flipped = train_transform(batch.repeat(16, 1, 1, 1), 32, (1.0, 1.0), (1.0, 1.0), hflip=True, generator=generator)
    left_white = flipped[:, :, :, :8].mean(dim=(1, 2, 3)) > 0.5
    assert 0 < int(left_white.sum()) < 32  # some flipped, some not
    centre = eval_transform(batch, 36, 32)
    assert centre.shape == (2, 3, 32, 32)
    torch.testing.assert_close(centre, batch.permute(0, 3, 1, 2)[:, :, 2:34, 2:34].float() / 255)


# --------------------------------------------------------------------------- per-image sizes (non-square)


def _canvas_batch(sizes: list[tuple[int, int]], canvas: int, seed: int = 0, padding: int = 0) -> torch.Tensor:
    """uint8 canvases with a random image of each ``(h, w)`` at the top-left and ``padding`` elsewhere."""
    generator = torch.Generator().manual_seed(seed)
    batch = torch.full((len(sizes), canvas, canvas, 3), padding, dtype=torch.uint8)
    for i, (h, w) in enumerate(sizes):
        batch[i, :h, :w] = torch.randint(0, 256, (h, w, 3), generator=generator, dtype=torch.uint8)
    return batch


def test_eval_transform_with_sizes_is_torchvision_resize_then_center_crop():
    from torchvision.transforms import CenterCrop, Compose, Resize

    sizes = [(48, 64), (64, 48), (48, 48), (48, 64), (30, 64), (47, 63)]
    batch = _canvas_batch(sizes, 64)
    out = eval_transform(batch, 40, 32, sizes=np.array(sizes))
    reference = Compose([Resize(40, antialias=True), CenterCrop(32)])
    for i, (h, w) in enumerate(sizes):
        image = batch[i, :h, :w].permute(2, 0, 1).float() / 255
        torch.testing.assert_close(out[i], reference(image), atol=1e-6, rtol=0)
    # sizes=None keeps the square behaviour: same as sizes = the whole canvas for a square batch.
    square = _canvas_batch([(36, 36)] * 3, 36)
    torch.testing.assert_close(eval_transform(square, 36, 32), eval_transform(square, 36, 32, sizes=[(36, 36)] * 3))


def test_crop_boxes_in_pixels_follow_torchvision_get_params_on_non_square_images():
    from torchvision.transforms import RandomResizedCrop

    n, h, w = 20000, 256, 341  # a 500 x 375 CUB photo prepared at short side 256
    top, left, height, width = sample_crop_boxes_px(
        torch.tensor([[h, w]]).repeat(n, 1), (0.16, 1.0), (3 / 4, 4 / 3), torch.Generator().manual_seed(0)
    )
    assert bool((top >= 0).all() and (left >= 0).all() and (top + height <= h).all() and (left + width <= w).all())
    torch.manual_seed(0)
    reference = torch.tensor(
        [RandomResizedCrop.get_params(torch.zeros(3, h, w), [0.16, 1.0], [3 / 4, 4 / 3]) for _ in range(n)],
        dtype=torch.float64,
    )
    ours = {"area": (height * width).double() / (h * w), "aspect": width / height.double(), "top": top, "left": left}
    theirs = {
        "area": reference[:, 2] * reference[:, 3] / (h * w),
        "aspect": reference[:, 3] / reference[:, 2],
        "top": reference[:, 0],
        "left": reference[:, 1],
    }
    tolerance = {"area": 0.02, "aspect": 0.02, "top": 3.0, "left": 4.0}
    for key in ours:
        for q in (0.1, 0.25, 0.5, 0.75, 0.9):
            a, b = float(ours[key].double().quantile(q)), float(theirs[key].quantile(q))
            assert abs(a - b) <= tolerance[key], (key, q, a, b)
    # The fallback (no draw fits) is torchvision's central crop clamped to the ratio range.
    top, left, height, width = sample_crop_boxes_px(
        torch.tensor([[100, 400], [400, 100], [100, 120]]), (1.0, 1.0), (1.0, 1.0), torch.Generator().manual_seed(0)
    )
    expected = [
        RandomResizedCrop.get_params(torch.zeros(3, hh, ww), [1.0, 1.0], [1.0, 1.0])
        for hh, ww in [(100, 400), (400, 100), (100, 120)]
    ]
    assert list(zip(top.tolist(), left.tolist(), height.tolist(), width.tolist(), strict=True)) == expected


def test_crop_resize_is_torchvision_resized_crop_without_antialias():
    from torchvision.transforms.functional import resized_crop

    generator = torch.Generator().manual_seed(3)
    batch = _canvas_batch([(45, 60)], 64, seed=1, padding=255)
    image = batch[0, :45, :60].permute(2, 0, 1).float() / 255
    for _ in range(20):  # up- and down-scaling boxes, some touching the valid region's edge
        bh, bw = (
            int(torch.randint(3, 46, (1,), generator=generator)),
            int(torch.randint(3, 61, (1,), generator=generator)),
        )
        t, left = (
            int(torch.randint(0, 46 - bh, (1,), generator=generator)),
            int(torch.randint(0, 61 - bw, (1,), generator=generator)),
        )
        ours = crop_resize(to_float(batch), torch.tensor([[t, left, t + bh, left + bw]], dtype=torch.float64), 24)
        torch.testing.assert_close(
            ours[0], resized_crop(image, t, left, bh, bw, [24, 24], antialias=False), atol=1e-4, rtol=0
        )


def test_train_transform_with_sizes_never_samples_outside_the_valid_region():
    sizes = [(48, 64), (64, 48), (40, 40), (64, 30)]
    batch = torch.zeros(len(sizes), 64, 64, 3, dtype=torch.uint8)
    batch[..., 0] = 255  # padding: pure red
    for i, (h, w) in enumerate(sizes):
        batch[i, :h, :w] = torch.tensor([0, 255, 0], dtype=torch.uint8)  # image: pure green
    generator = torch.Generator().manual_seed(0)
    # 32: plain; 20: canvas > 2 x crop, so valid regions are pre-downscaled; 96: up-sampling
    for crop_size, scale in [(32, (0.05, 1.0)), (20, (0.5, 1.0)), (96, (0.05, 1.0))]:
        out = train_transform(
            batch.repeat(8, 1, 1, 1), crop_size, scale, (0.5, 2.0), True, generator, sizes=np.array(sizes * 8)
        )
        assert out.shape == (32, 3, crop_size, crop_size)
        assert float(out[:, 0].max()) < 1e-6, "red padding leaked into a crop"
        assert float(out[:, 1].min()) > 1 - 1e-6


def test_train_transform_with_sizes_matches_torchvision_when_the_crop_is_deterministic():
    from torchvision.transforms import RandomResizedCrop

    # scale 1 and ratio 1 never fit a non-square image: torchvision's fallback centre square, resized.
    sizes = [(48, 64), (64, 48)]
    batch = _canvas_batch(sizes, 64, seed=2, padding=7)
    out = train_transform(batch, 48, (1.0, 1.0), (1.0, 1.0), False, torch.Generator().manual_seed(0), sizes=sizes)
    crop = RandomResizedCrop(48, scale=(1.0, 1.0), ratio=(1.0, 1.0), antialias=False)
    for i, (h, w) in enumerate(sizes):
        torch.testing.assert_close(out[i], crop(batch[i, :h, :w].permute(2, 0, 1).float() / 255), atol=1e-5, rtol=0)


def test_sizes_are_validated():
    batch = torch.zeros(2, 16, 16, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"sizes must be 2 x 2"):
        eval_transform(batch, 16, 12, sizes=[(16, 16)])
    with pytest.raises(ValueError, match=r"sizes must lie in 1..16 x 1..16"):
        eval_transform(batch, 16, 12, sizes=[(16, 16), (17, 3)])
