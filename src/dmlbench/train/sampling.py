"""Which training images form each batch of an epoch (seeded by the caller, so resumable).

``m`` per class: PML's ``MPerClassSampler``; ``random``: ``DataLoader(shuffle=True, drop_last=True)``
(thesis, Proxy-Anchor); ``iterations`` batches per epoch, or one pass when None.
:func:`class_pass_batches`: one pass over the classes in random order, ``m`` images each, the last
incomplete batch dropped (Hyp-ViT, htdt/hyp_metric ``sampler.py`` ``UniqueClassSempler``).
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


def class_pass_batches(labels: np.ndarray, batch_size: int, per_class: int) -> np.ndarray:
    """Index batches (``n_batches x batch_size``) of one pass over the classes of ``labels``, drawn
    from numpy's global RNG (seeded per epoch by the caller); see the module docstring."""
    classes = np.unique(labels)
    if batch_size % per_class:
        raise ConfigError(f"protocol: batch_size {batch_size} is not a multiple of samples_per_class {per_class}")
    per_batch = batch_size // per_class
    if len(classes) < per_batch:
        raise ConfigError(
            f"protocol: sampler class_pass puts {per_batch} distinct classes in a batch ({batch_size} / {per_class}); "
            f"the training split has {len(classes)} (Hyp-ViT trains CUB200 on all 100 training classes: "
            "split scheme standard)"
        )
    order = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[order], classes)
    members = np.split(order, starts[1:])
    rows = []
    for index in np.random.permutation(len(classes)):
        images = members[index]
        rows.append(np.random.choice(images, size=per_class, replace=len(images) < per_class))
    n_batches = len(classes) // per_batch
    return np.concatenate(rows)[: n_batches * batch_size].reshape(n_batches, batch_size)
