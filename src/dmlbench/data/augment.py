"""Batched image transforms on tensors, so augmentation runs wherever the batch lives (CPU or GPU).

Inputs are uint8 ``N x S x S x 3`` batches straight from the prepared cache; outputs are
float ``N x 3 x O x O`` in [0, 1]. Input normalisation (mean/std, BGR, 0-255) belongs to the
backbone and is applied inside the model.

* :func:`train_transform`: RandomResizedCrop (torchvision's sampling of area fraction and
  log-aspect-ratio, 10 tries then the whole image) + optional horizontal flip, one random
  crop per image, done with a single ``affine_grid``/``grid_sample`` call for the batch.
* :func:`eval_transform`: resize to ``eval_resize`` (antialiased) and centre crop ``crop_size``:
  ``Resize(256) -> CenterCrop(227)`` in the Reality Check protocol.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def to_float(batch: torch.Tensor) -> torch.Tensor:
    """uint8 ``N x H x W x 3`` -> float ``N x 3 x H x W`` in [0, 1]."""
    return batch.permute(0, 3, 1, 2).float().div_(255.0)


def eval_transform(batch: torch.Tensor, eval_resize: int, crop_size: int) -> torch.Tensor:
    images = to_float(batch)
    if images.shape[-1] != eval_resize or images.shape[-2] != eval_resize:
        images = F.interpolate(
            images, size=(eval_resize, eval_resize), mode="bilinear", antialias=True, align_corners=False
        )
    top = (eval_resize - crop_size) // 2
    return images[:, :, top : top + crop_size, top : top + crop_size].contiguous()


def sample_crop_boxes(
    n: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator,
    attempts: int = 10,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Width and height of each crop as fractions of a square image's side.

    Area fraction ~ U(scale), log aspect ratio ~ U(log ratio); the first of ``attempts``
    draws that fits inside the image is kept, else the whole image (torchvision's rule).
    """
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


def train_transform(
    batch: torch.Tensor,
    crop_size: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    hflip: bool,
    generator: torch.Generator,
) -> torch.Tensor:
    """RandomResizedCrop(crop_size, scale, ratio) (+ RandomHorizontalFlip(0.5) if ``hflip``)."""
    images = to_float(batch)
    n = images.shape[0]
    side = images.shape[-1]
    if side > 2 * crop_size:  # antialias big downscales before bilinear sampling
        images = F.interpolate(
            images, size=(2 * crop_size, 2 * crop_size), mode="bilinear", antialias=True, align_corners=False
        )
    width, height = sample_crop_boxes(n, scale, ratio, generator)
    # Crop centre uniformly such that the crop lies inside the image; coordinates in [-1, 1].
    cx = (torch.rand(n, generator=generator) * 2 - 1) * (1 - width)
    cy = (torch.rand(n, generator=generator) * 2 - 1) * (1 - height)
    flip = torch.ones(n)
    if hflip:
        flip = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = width * flip
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = height
    theta[:, 1, 2] = cy
    theta = theta.to(images.device, images.dtype)
    grid = F.affine_grid(theta, [n, 3, crop_size, crop_size], align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
