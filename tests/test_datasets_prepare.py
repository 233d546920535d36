"""The prepare step: resize/crop geometry, decoding against an independent torchvision
reference, colour modes, and results independent of the number of worker processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.archives import write_jpeg
from PIL import Image

from dmlbench.data import DATASETS
from dmlbench.data.base import DatasetParams
from dmlbench.data.prepare import decode_image, decode_images, prepare_dataset, target_geometry


@pytest.mark.parametrize(
    "width, height, expected",
    [
        (500, 375, (341, 256)),  # a typical CUB photo: 4:3 fits the canvas uncropped
        (375, 500, (256, 341)),
        (300, 300, (256, 256)),
        (1000, 200, (342, 256)),  # 5:1 panorama: long side cropped to L = ceil(256 * 4/3) = 342
        (200, 1000, (256, 342)),
        (100, 60, (342, 256)),  # small images are upscaled (426 x 256), then cropped to L
        (120, 90, (341, 256)),  # torchvision truncates: int(256 * 120 / 90) = int(341.33)
        (91, 120, (256, 337)),  # int(337.58) = 337, not 338
    ],
)
def test_target_geometry(width, height, expected):
    out_w, out_h, (left, top, right, bottom) = target_geometry(width, height, 256, 342)
    assert (out_w, out_h) == expected
    # The box is centred (up to torchvision's integer crop offset); it spans the short side, and
    # the long side unless that was capped at L.
    assert abs((left + right) / 2 - width / 2) <= 0.5 * width / out_w
    assert abs((top + bottom) / 2 - height / 2) <= 0.5 * height / out_h
    assert (right - left == width) or (bottom - top == height)
    capped = max(width, height) * 256 / min(width, height) >= 343
    assert ((right - left, bottom - top) == (width, height)) == (not capped)


def test_decode_matches_torchvision_resize_and_centre_crop(tmp_path):
    """Independent reference: full decode (no JPEG draft), torchvision Resize(short side) with
    antialias, then CenterCrop of the long side to L."""
    from torchvision.transforms.functional import center_crop, resize

    rng = np.random.default_rng(0)
    for index, (w, h) in enumerate([(120, 90), (90, 120), (200, 50), (64, 64)]):
        path = tmp_path / f"{index}.png"
        smooth = Image.fromarray(rng.uniform(0, 255, (6, 8, 3)).astype(np.uint8)).resize((w, h), Image.BICUBIC)
        smooth.save(path)
        ours = decode_image(path, 32, 43)
        reference = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1).float()
        reference = resize(reference, 32, antialias=True)
        rh, rw = reference.shape[1:]
        reference = center_crop(reference, [min(rh, 43), min(rw, 43)]).permute(1, 2, 0).numpy()
        assert ours.shape == reference.shape, (w, h)
        assert np.abs(ours.astype(float) - reference).mean() < 0.5  # grey levels (0-255): PIL vs torch rounding


def test_jpeg_draft_decoding_stays_close_to_a_full_decode(tmp_path):
    path = tmp_path / "big.jpg"
    write_jpeg(path, 800, 600, seed=3)
    fast = decode_image(path, 64, 86).astype(float)  # libjpeg downscales 8x while decoding
    with Image.open(path) as image:
        full = np.asarray(image.convert("RGB").resize((85, 64), Image.BILINEAR), dtype=float)
    assert fast.shape == (64, 85, 3) and np.abs(fast - full).mean() < 2.0


@pytest.mark.parametrize("mode", ["L", "CMYK", "P", "RGBA", "LA"])
def test_every_colour_mode_becomes_rgb(tmp_path, mode):
    base = Image.fromarray(np.random.default_rng(1).uniform(0, 255, (20, 30, 3)).astype(np.uint8))
    image = base.convert(mode)
    path = tmp_path / ("x.jpg" if mode in ("L", "CMYK") else "x.png")
    image.save(path)
    out = decode_image(path, 16, 21)
    assert out.shape == (16, 21, 3) and out.dtype == np.uint8
    if mode in ("L", "LA"):
        assert (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()


def test_results_do_not_depend_on_the_number_of_workers(tmp_path):
    paths = []
    for i in range(70):  # three chunks of 32 rows
        path = tmp_path / "img" / f"{i}.jpg"
        write_jpeg(path, 30 + i % 7, 20 + i % 5, seed=i, gray=i % 4 == 0)
        paths.append(str(path))
    paths.insert(40, str(tmp_path / "missing.jpg"))
    outputs = []
    for workers in (1, 2, 3):
        target = tmp_path / f"images{workers}.npy"
        np.lib.format.open_memmap(target, mode="w+", dtype=np.uint8, shape=(len(paths), 22, 22, 3))
        sizes, failures = decode_images(paths, target, 16, 22, workers=workers)
        outputs.append((np.load(target), sizes, failures))
    for images, sizes, failures in outputs[1:]:
        np.testing.assert_array_equal(images, outputs[0][0])
        np.testing.assert_array_equal(sizes, outputs[0][1])
        assert failures == outputs[0][2]
    assert [i for i, _ in outputs[0][2]] == [40] and "FileNotFoundError" in outputs[0][2][0][1]
    assert (outputs[0][1][40] == 0).all() and not outputs[0][0][40].any()


def test_prepare_without_raw_files_is_a_clear_error(tmp_path):
    from dmlbench.errors import DataError

    params = DATASETS["cub200"].params.model_validate({"source": {}})
    with pytest.raises(DataError, match=r"no raw files \(run the download@cub200 stage first\)"):
        prepare_dataset(DATASETS["cub200"], params, tmp_path / "raw", tmp_path / "out")


def test_canvas_size_follows_max_aspect():
    assert DatasetParams(source={}).canvas_size == 342  # ceil(256 * 4/3)
    assert DatasetParams(source={}, image_size=224, max_aspect=1.5).canvas_size == 336
    assert DatasetParams(source={}, image_size=36, max_aspect=1).canvas_size == 36
    assert DATASETS["glyphs"].params(source={}).canvas_size == 36
