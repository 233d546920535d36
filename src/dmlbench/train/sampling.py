"""Which training images form each batch of an epoch (seeded by the caller, so resumable).

* ``m`` images per class: PML's ``MPerClassSampler`` (``batch_size / m`` classes x ``m``
  images); ``m = 1`` gives batches of distinct classes (Reality Check, classification losses).
* ``random``: uniformly shuffled batches, as a plain ``DataLoader(shuffle=True, drop_last=True)``
  (thesis and Proxy-Anchor code for losses that need no positives in the batch).

An epoch has ``iterations`` batches, or ``len(labels) // batch_size`` (one pass) when None.
"""

from __future__ import annotations

import math

import numpy as np

from dmlbench.errors import ConfigError


def batches_per_epoch(n_images: int, batch_size: int, iterations: int | None = None) -> int:
    """Batches in an epoch: ``iterations``, or one pass over ``n_images`` (at least one batch)."""
    return iterations or max(n_images, batch_size) // batch_size


def epoch_batches(
    labels: np.ndarray, batch_size: int, per_class: int | str, iterations: int | None = None
) -> np.ndarray:
    """Index batches (``n_batches x batch_size``) drawn from numpy's global RNG / PML's RNG."""
    n_batches = batches_per_epoch(len(labels), batch_size, iterations)
    if per_class == "random":
        if len(labels) < batch_size:
            raise ConfigError(f"protocol: batch_size {batch_size} exceeds the {len(labels)} training images")
        need = n_batches * batch_size
        order = np.concatenate([np.random.permutation(len(labels)) for _ in range(math.ceil(need / len(labels)))])
        return order[:need].reshape(n_batches, batch_size)

    from pytorch_metric_learning.samplers import MPerClassSampler

    num_classes = len(np.unique(labels))
    if per_class * num_classes < batch_size:
        raise ConfigError(
            f"protocol: batch_size {batch_size} needs >= {math.ceil(batch_size / per_class)} training "
            f"classes at {per_class} images per class; the training split has {num_classes}"
        )
    sampler = MPerClassSampler(
        labels, m=per_class, batch_size=batch_size, length_before_new_iter=n_batches * batch_size
    )
    order = np.fromiter(iter(sampler), dtype=np.int64, count=len(sampler))
    return order.reshape(-1, batch_size)
