"""Batched image transforms on tensors, wherever the batch lives (CPU or GPU): uint8 ``N x L x L x 3``
canvases with ``sizes`` (``N x 2`` valid ``(h, w)`` at the top-left; None: the whole canvas) to float
``N x 3 x O x O`` in [0, 1] (bicubic clamped, as PIL's 8-bit resampling). ``squash`` and RandAugment:
Berton et al. 2025 (gmberton/image-retrieval ``utils.py``).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

Interpolation = Literal["bilinear", "bicubic"]
INTERPOLATIONS = ("bilinear", "bicubic")


def resolve_interpolation(setting: str, weights: str) -> Interpolation:
    """The resize kernel of a protocol's ``augment.interpolation``: ``weights`` = the trunk's
    (``EmbeddingModel.interpolation``, from its ``pretrained_cfg``), else the one named."""
    return check_interpolation(weights if setting == "weights" else setting)


def check_interpolation(mode: str) -> Interpolation:
    if mode not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {mode!r}")
    return mode  # type: ignore[return-value]


def _resize(images: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """Antialiased resize; bicubic overshoot clamped to [0, 1]."""
    out = F.interpolate(images, size=size, mode=mode, antialias=True, align_corners=False)
    return out.clamp_(0.0, 1.0) if mode == "bicubic" else out


def to_float(batch: torch.Tensor) -> torch.Tensor:
    """uint8 ``N x H x W x 3`` -> float ``N x 3 x H x W`` in [0, 1]."""
    return batch.permute(0, 3, 1, 2).float().div_(255.0)


def as_sizes(sizes, batch: torch.Tensor) -> torch.Tensor:
    """Validate ``sizes`` against the batch: a CPU int64 ``N x 2`` tensor of ``(h, w)``."""
    sizes = torch.as_tensor(np.asarray(sizes.cpu() if isinstance(sizes, torch.Tensor) else sizes), dtype=torch.long)
    n, height, width = batch.shape[0], batch.shape[1], batch.shape[2]
    if sizes.shape != (n, 2):
        raise ValueError(f"sizes must be {n} x 2 (h, w), got shape {tuple(sizes.shape)}")
    if len(sizes) and (sizes.min() < 1 or sizes[:, 0].max() > height or sizes[:, 1].max() > width):
        raise ValueError(f"sizes must lie in 1..{height} x 1..{width} (the canvas)")
    return sizes


def _size_groups(sizes: torch.Tensor, device: torch.device):
    """``(h, w, indices)`` for every distinct size in the batch (one resize call per size)."""
    unique, inverse = torch.unique(sizes, dim=0, return_inverse=True)
    for u, (h, w) in enumerate(unique.tolist()):
        yield h, w, torch.nonzero(inverse == u).squeeze(1).to(device)


def resize_short_side(height: int, width: int, size: int) -> tuple[int, int]:
    """torchvision ``Resize(size)`` output: short side ``size``, long side ``int(size * long / short)``."""
    if width <= height:
        return int(size * height / width), size
    return size, int(size * width / height)


def eval_transform(
    batch: torch.Tensor,
    eval_resize: int,
    crop_size: int,
    sizes: np.ndarray | torch.Tensor | None = None,
    interpolation: str = "bilinear",
    squash: bool = False,
) -> torch.Tensor:
    """``Resize(eval_resize) -> CenterCrop(crop_size)`` of each image (its valid region if ``sizes``);
    ``squash``: ``Resize((eval_resize, eval_resize)) -> CenterCrop(crop_size)``."""
    mode = check_interpolation(interpolation)
    if sizes is not None and not squash:
        return _eval_transform_sized(batch, eval_resize, crop_size, as_sizes(sizes, batch), mode)
    images = squash_resize(batch, eval_resize, sizes, mode)  # a whole square canvas: the same resize
    margin = eval_resize - crop_size
    top = int(round(margin / 2.0)) if squash else margin // 2  # squash: torchvision's CenterCrop offset
    return images[:, :, top : top + crop_size, top : top + crop_size].contiguous()


def _eval_transform_sized(
    batch: torch.Tensor, eval_resize: int, crop_size: int, sizes: torch.Tensor, mode: str = "bilinear"
) -> torch.Tensor:
    images = to_float(batch)
    out = images.new_empty((images.shape[0], 3, crop_size, crop_size))
    for h, w, index in _size_groups(sizes, images.device):
        region = images[index, :, :h, :w]
        new_h, new_w = resize_short_side(h, w, eval_resize)
        if (new_h, new_w) != (h, w):
            region = _resize(region, (new_h, new_w), mode)
        top, left = int(round((new_h - crop_size) / 2.0)), int(round((new_w - crop_size) / 2.0))
        out[index] = region[:, :, top : top + crop_size, left : left + crop_size]
    return out


def sample_crop_boxes(
    n: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator,
    attempts: int = 10,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Width and height of each crop as fractions of a square image's side: area ~ U(scale), log
    aspect ~ U(log ratio), the first of ``attempts`` draws that fits, else the whole image (torchvision)."""
    area = torch.empty(n, attempts).uniform_(scale[0], scale[1], generator=generator)
    log_ratio = torch.empty(n, attempts).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=generator)
    aspect = torch.exp(log_ratio)
    width, height = torch.sqrt(area * aspect), torch.sqrt(area / aspect)
    fits = (width <= 1) & (height <= 1)
    first = torch.where(fits.any(1), fits.float().argmax(1), torch.full((n,), -1))
    rows = torch.arange(n)
    chosen_w = torch.where(first >= 0, width[rows, first.clamp(min=0)], torch.ones(n))
    chosen_h = torch.where(first >= 0, height[rows, first.clamp(min=0)], torch.ones(n))
    return chosen_w, chosen_h


def sample_crop_boxes_px(
    sizes: torch.Tensor,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator,
    attempts: int = 10,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(top, left, height, width)`` in px of one RandomResizedCrop box per ``(h, w)``: torchvision's
    ``get_params`` vectorised (first fitting draw of ``attempts``, else the central crop clamped to ``ratio``)."""
    n = len(sizes)
    height, width = sizes[:, 0].double(), sizes[:, 1].double()
    area = (height * width)[:, None] * torch.empty(n, attempts, dtype=torch.float64).uniform_(
        scale[0], scale[1], generator=generator
    )
    log_ratio = torch.empty(n, attempts, dtype=torch.float64).uniform_(
        math.log(ratio[0]), math.log(ratio[1]), generator=generator
    )
    aspect = torch.exp(log_ratio)
    box_w, box_h = torch.round(torch.sqrt(area * aspect)), torch.round(torch.sqrt(area / aspect))
    fits = (box_w > 0) & (box_w <= width[:, None]) & (box_h > 0) & (box_h <= height[:, None])
    first = fits.float().argmax(1)
    rows = torch.arange(n)
    found = fits.any(1)
    # torchvision's fallback: whole image, cropped centrally to the nearest allowed aspect ratio.
    in_ratio = width / height
    fallback_w = torch.where(in_ratio > max(ratio), torch.round(height * max(ratio)), width)
    fallback_h = torch.where(in_ratio < min(ratio), torch.round(width / min(ratio)), height)
    chosen_w = torch.where(found, box_w[rows, first], fallback_w)
    chosen_h = torch.where(found, box_h[rows, first], fallback_h)
    u_top, u_left = (
        torch.rand(n, generator=generator, dtype=torch.float64),
        torch.rand(n, generator=generator, dtype=torch.float64),
    )
    top = torch.where(found, torch.floor(u_top * (height - chosen_h + 1)), torch.floor((height - chosen_h) / 2))
    left = torch.where(found, torch.floor(u_left * (width - chosen_w + 1)), torch.floor((width - chosen_w) / 2))
    return top.long(), left.long(), chosen_h.long(), chosen_w.long()


def _rescale_valid(
    images: torch.Tensor, sizes: torch.Tensor, side: int, mode: str = "bilinear"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image's valid region resized (antialiased) by ``side / canvas``, into ``side x side`` canvases."""
    factor = side / images.shape[-1]
    out = images.new_zeros((images.shape[0], 3, side, side))
    scaled = sizes.clone()
    for h, w, index in _size_groups(sizes, images.device):
        new_h, new_w = min(side, max(1, round(h * factor))), min(side, max(1, round(w * factor)))
        out[index, :, :new_h, :new_w] = _resize(images[index, :, :h, :w], (new_h, new_w), mode)
        scaled[index.cpu()] = torch.tensor([new_h, new_w])
    return out, scaled


def crop_resize(
    images: torch.Tensor,
    boxes: torch.Tensor,
    crop_size: int,
    flip: torch.Tensor | None = None,
    interpolation: str = "bilinear",
) -> torch.Tensor:
    """Crop ``boxes`` (float ``N x 4``: top, left, bottom, right in px) and resize to ``crop_size``;
    samples clamped inside the box (integer boxes: torchvision's ``resized_crop(antialias=False)``).
    ``flip``: +1/-1 per image."""
    n, _, canvas_h, canvas_w = images.shape
    y0, x0, y1, x1 = boxes.double().unbind(1)
    flip = torch.ones(n, dtype=torch.float64) if flip is None else flip.double()
    theta = torch.zeros(n, 2, 3, dtype=torch.float64)
    theta[:, 0, 0] = (x1 - x0) / canvas_w * flip
    theta[:, 0, 2] = (x0 + x1) / canvas_w - 1
    theta[:, 1, 1] = (y1 - y0) / canvas_h
    theta[:, 1, 2] = (y0 + y1) / canvas_h - 1
    grid = F.affine_grid(theta, [n, 3, crop_size, crop_size], align_corners=False)
    low_x, high_x = 2 * (x0 + 0.5) / canvas_w - 1, 2 * (x1 - 0.5) / canvas_w - 1
    low_y, high_y = 2 * (y0 + 0.5) / canvas_h - 1, 2 * (y1 - 0.5) / canvas_h - 1
    grid = torch.stack(
        (
            torch.clamp(grid[..., 0], low_x[:, None, None], high_x[:, None, None]),
            torch.clamp(grid[..., 1], low_y[:, None, None], high_y[:, None, None]),
        ),
        dim=-1,
    )
    grid = grid.to(images.device, images.dtype)
    return _sample(images, grid, check_interpolation(interpolation))


def _sample(images: torch.Tensor, grid: torch.Tensor, mode: str) -> torch.Tensor:
    out = F.grid_sample(images, grid, mode=mode, padding_mode="border", align_corners=False)
    return out.clamp_(0.0, 1.0) if mode == "bicubic" else out


def _random_flip(n: int, hflip: bool, generator: torch.Generator) -> torch.Tensor:
    """Per-image x-scale: -1 (mirrored) with probability 0.5 if ``hflip``, else 1; draws only if ``hflip``."""
    if not hflip:
        return torch.ones(n)
    return torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0)


def train_transform(
    batch: torch.Tensor,
    crop_size: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    hflip: bool,
    generator: torch.Generator,
    sizes: np.ndarray | torch.Tensor | None = None,
    interpolation: str = "bilinear",
) -> torch.Tensor:
    """RandomResizedCrop(crop_size, scale, ratio) (+ RandomHorizontalFlip(0.5) if ``hflip``)."""
    mode = check_interpolation(interpolation)
    if sizes is not None:
        return _train_transform_sized(batch, crop_size, scale, ratio, hflip, generator, as_sizes(sizes, batch), mode)
    images = to_float(batch)
    n = images.shape[0]
    side = images.shape[-1]
    if side > 2 * crop_size:  # antialias big downscales before sampling
        images = _resize(images, (2 * crop_size, 2 * crop_size), mode)
    width, height = sample_crop_boxes(n, scale, ratio, generator)
    # Crop centre uniformly such that the crop lies inside the image; coordinates in [-1, 1].
    cx = (torch.rand(n, generator=generator) * 2 - 1) * (1 - width)
    cy = (torch.rand(n, generator=generator) * 2 - 1) * (1 - height)
    flip = _random_flip(n, hflip, generator)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = width * flip
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = height
    theta[:, 1, 2] = cy
    theta = theta.to(images.device, images.dtype)
    grid = F.affine_grid(theta, [n, 3, crop_size, crop_size], align_corners=False)
    return _sample(images, grid, mode)


def _train_transform_sized(
    batch: torch.Tensor,
    crop_size: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    hflip: bool,
    generator: torch.Generator,
    sizes: torch.Tensor,
    mode: str = "bilinear",
) -> torch.Tensor:
    images = to_float(batch)
    n = images.shape[0]
    top, left, height, width = sample_crop_boxes_px(sizes, scale, ratio, generator)
    flip = _random_flip(n, hflip, generator)
    boxes = torch.stack((top, left, top + height, left + width), dim=1).double()
    if images.shape[-1] > 2 * crop_size:  # antialias big downscales before sampling
        images, scaled = _rescale_valid(images, sizes, 2 * crop_size, mode)
        factor = (scaled.double() / sizes.double()).repeat(1, 2)  # (fy, fx, fy, fx)
        boxes = boxes * factor
    return crop_resize(images, boxes, crop_size, flip, mode)


def squash_resize(
    batch: torch.Tensor, size: int, sizes: np.ndarray | torch.Tensor | None = None, interpolation: str = "bilinear"
) -> torch.Tensor:
    """``Resize((size, size))`` (antialiased, the aspect ratio not kept) of each image's valid region."""
    mode = check_interpolation(interpolation)
    images = to_float(batch)
    if sizes is None:
        if images.shape[-2:] == (size, size):
            return images
        return _resize(images, (size, size), mode)
    out = images.new_empty((images.shape[0], 3, size, size))
    for h, w, index in _size_groups(as_sizes(sizes, batch), images.device):
        region = images[index, :, :h, :w]
        out[index] = region if (h, w) == (size, size) else _resize(region, (size, size), mode)
    return out


def rand_augment(images: torch.Tensor, num_ops: int, magnitude: int, generator: torch.Generator) -> torch.Tensor:
    """torchvision's ``RandAugment(num_ops, magnitude)`` on each image's 8-bit values, bilinear (Berton
    et al. 2025); draws from the CPU generator seeded by ``generator`` (the global one restored after)."""
    from torchvision.transforms import InterpolationMode, RandAugment

    augment = RandAugment(num_ops=num_ops, magnitude=magnitude, interpolation=InterpolationMode.BILINEAR)
    pixels = images.mul(255.0).round_().clamp_(0, 255).to(torch.uint8)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = torch.stack([augment(image) for image in pixels])
    return out.float().div_(255.0)


def squash_train_transform(
    batch: torch.Tensor,
    crop_size: int,
    hflip: bool,
    generator: torch.Generator,
    sizes: np.ndarray | torch.Tensor | None = None,
    interpolation: str = "bilinear",
    rand_augment_ops: int = 0,
    rand_augment_magnitude: int = 9,
) -> torch.Tensor:
    """``Resize((crop_size, crop_size))`` -> ``RandAugment`` (``rand_augment_ops`` > 0) -> flip
    (``hflip``) of each image (its valid region if ``sizes``); float ``N x 3 x crop_size x crop_size``."""
    images = squash_resize(batch, crop_size, sizes, interpolation)
    if rand_augment_ops:
        images = rand_augment(images, rand_augment_ops, rand_augment_magnitude, generator)
    flip = _random_flip(images.shape[0], hflip, generator).to(images.device)
    return torch.where((flip < 0)[:, None, None, None], images.flip(-1), images)
