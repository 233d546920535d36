"""The offline glyph dataset, class-disjoint splits, the prepared cache and augmentation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from dmlbench.data import DATASETS
from dmlbench.data.augment import eval_transform, sample_crop_boxes, train_transform
from dmlbench.data.base import SplitConfig
from dmlbench.data.cache import PreparedDataset
from dmlbench.data.glyphs import GlyphsParams, class_characters, fonts_for, render_glyph
from dmlbench.data.prepare import prepare_dataset
from dmlbench.data.splits import assign_splits
from dmlbench.errors import DataError


def test_default_glyphs_is_a_real_benchmark_shape():
    params = GlyphsParams()
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
    split = assign_splits(frame, SplitConfig(scheme="fixed_val", val_fraction=0.1, seed=7))
    val_classes = set(frame.label[split == "val"])
    assert len(val_classes) == 2 and val_classes <= set(range(20))
    for name in ("train", "val", "test"):
        for other in ("train", "val", "test"):
            if name != other:
                assert not set(frame.label[split == name]) & set(frame.label[split == other])
    assert split.equals(assign_splits(frame, SplitConfig(scheme="fixed_val", val_fraction=0.1, seed=7)))
    assert not split.equals(assign_splits(frame, SplitConfig(scheme="fixed_val", val_fraction=0.1, seed=8)))
    assert assign_splits(frame, SplitConfig(scheme="standard")).equals(frame.split)


def test_prepared_cache(prepared_glyphs):
    root, data = prepared_glyphs
    manifest = pd.read_csv(root / "prepared" / "manifest.csv")
    assert list(manifest.columns) == ["path", "label", "class_name", "split"]
    assert data.images.shape == (640, 36, 36, 3) and data.images.dtype == np.uint8
    assert data.info["splits"]["val"]["classes"] == 5  # 25% of 20 training classes
    assert data.info["splits"]["test"] == {"images": 320, "classes": 20}
    # The cache holds the decoded, resized file (row order = manifest order).
    first = np.asarray(
        Image.open(root / "raw" / manifest.path[5]).convert("RGB").resize((36, 36), Image.BILINEAR), dtype=float
    )
    assert np.abs(first - data.images[5]).mean() < 6
    train = data.split("train")
    assert len(train) == 240 and train.num_classes == 15


def test_prepare_reports_unreadable_images(tmp_path, prepared_glyphs, small_params):
    root, _ = prepared_glyphs
    raw = tmp_path / "raw"
    import shutil

    shutil.copytree(root / "raw", raw)
    bad = sorted((raw / "images" / "004").iterdir())[2]
    bad.write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"1 unreadable image\(s\), first: images/004/002.png"):
        prepare_dataset(DATASETS["glyphs"], small_params.datasets["glyphs"], raw, tmp_path / "prepared")
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
