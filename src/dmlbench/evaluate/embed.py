"""Embeddings of a split with the evaluation transform (resize + centre crop), in batches."""

from __future__ import annotations

import numpy as np
import torch

from dmlbench.data.augment import eval_transform


@torch.no_grad()
def compute_embeddings(
    model: torch.nn.Module,
    images: np.ndarray,
    eval_resize: int,
    crop_size: int,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    features: bool = False,
) -> np.ndarray:
    """``images``: uint8 ``N x S x S x 3`` -> float32 ``N x dim`` (model in eval mode).

    ``features=True`` returns the pooled trunk features instead of the head's output.
    """
    was_training = model.training
    model.eval()
    outputs = []
    try:
        for start in range(0, len(images), batch_size):
            batch = torch.from_numpy(np.ascontiguousarray(images[start : start + batch_size])).to(device)
            inputs = eval_transform(batch, eval_resize, crop_size)
            out = model.features(inputs) if features else model(inputs)
            outputs.append(out.float().cpu().numpy())
    finally:
        model.train(was_training)
    if not outputs:
        return np.zeros((0, 0), dtype=np.float32)
    return np.concatenate(outputs).astype(np.float32)
