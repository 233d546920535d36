"""compute_embeddings writes every batch into one preallocated output and reuses its input
buffers; its results are bit-identical to the straightforward per-batch implementation."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch

from dmlbench.data.augment import eval_transform
from dmlbench.evaluate import embed as embed_module
from dmlbench.evaluate.embed import compute_embeddings
from dmlbench.models import BACKBONES, build_model

CANVAS, RESIZE, CROP, BATCH = 20, 18, 16, 8


@torch.no_grad()
def reference_embeddings(model, images, eval_resize, crop_size, batch_size, device="cpu", features=False, sizes=None):
    """The straightforward version: a fresh copy per batch, a list of outputs, one concatenation."""
    model.eval()
    outputs = []
    for start in range(0, len(images), batch_size):
        batch = torch.from_numpy(np.ascontiguousarray(images[start : start + batch_size])).to(device)
        part = None if sizes is None else sizes[start : start + batch_size]
        inputs = eval_transform(batch, eval_resize, crop_size, sizes=part)
        out = model.features(inputs) if features else model(inputs)
        outputs.append(out.float().cpu().numpy())
    return np.concatenate(outputs).astype(np.float32)


def _model(dim: int = 24, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("tiny_cnn", BACKBONES["tiny_cnn"].params(width=4), dim).to(device)


def _images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random uint8 canvases and valid sizes of several shapes (some filling the canvas)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, CANVAS, CANVAS, 3), dtype=np.uint8)
    sizes = np.stack([rng.integers(CROP - 2, CANVAS + 1, n), rng.integers(CROP - 2, CANVAS + 1, n)], axis=1)
    return images, sizes


@pytest.mark.parametrize("features", [False, True])
@pytest.mark.parametrize("with_sizes", [False, True])
@pytest.mark.parametrize("layout", ["array", "memmap", "strided"])
def test_bit_identical_to_the_reference_with_a_partial_last_batch(tmp_path, features, with_sizes, layout):
    images, sizes = _images(37)  # 4 full batches of 8 and a last one of 5
    if layout == "memmap":  # the prepared cache as the embed stage reads it
        np.save(tmp_path / "images.npy", images)
        images = np.load(tmp_path / "images.npy", mmap_mode="r")
    elif layout == "strided":  # not C-contiguous: goes through the reused staging buffer
        wide = np.zeros((len(images), CANVAS, CANVAS + 5, 3), dtype=np.uint8)
        wide[:, :, :CANVAS] = images
        images = wide[:, :, :CANVAS]
        assert not images.flags.c_contiguous
    model = _model().train()
    sizes = sizes if with_sizes else None
    got = compute_embeddings(model, images, RESIZE, CROP, BATCH, features=features, sizes=sizes)
    assert model.training  # the caller's mode is restored
    expected = reference_embeddings(model, images, RESIZE, CROP, BATCH, features=features, sizes=sizes)
    width = 32 if features else 24  # features: tiny_cnn width 4 -> 4 x 8 channels; else the head's dim
    assert got.dtype == np.float32 and got.shape == expected.shape == (37, width)
    assert np.array_equal(got, expected)


def test_batch_larger_than_the_split_and_empty_split():
    images, sizes = _images(5, seed=1)
    model = _model()
    got = compute_embeddings(model, images, RESIZE, CROP, batch_size=256, sizes=sizes)
    assert np.array_equal(got, reference_embeddings(model, images, RESIZE, CROP, 256, sizes=sizes))
    empty = compute_embeddings(model, images[:0], RESIZE, CROP, BATCH)
    assert empty.shape == (0, 0) and empty.dtype == np.float32


def test_host_memory_is_one_output_array():
    """numpy allocations while embedding (traced by tracemalloc): the N x dim float32 output
    once, not per-batch outputs plus a concatenated copy plus a cast copy (3 x the output)."""
    images, _ = _images(400, seed=2)
    model = _model(dim=512)
    expected = reference_embeddings(model, images, RESIZE, CROP, BATCH)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        got = compute_embeddings(model, images, RESIZE, CROP, BATCH)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(got, expected)
    assert got.nbytes <= peak < 1.5 * got.nbytes, (peak, got.nbytes)


@pytest.mark.gpu
def test_cuda_pinned_staging_is_bit_identical_to_the_reference():
    images, sizes = _images(37, seed=3)
    model = _model(device="cuda")
    for part in (None, sizes):
        got = compute_embeddings(model, images, RESIZE, CROP, BATCH, "cuda", sizes=part)
        assert np.array_equal(got, reference_embeddings(model, images, RESIZE, CROP, BATCH, "cuda", sizes=part))


class _FakeLibc:
    """Records glibc mallopt/malloc_trim calls; ``refuse``: parameters whose mallopt returns 0."""

    def __init__(self, refuse=()):
        self.calls, self.refuse = [], set(refuse)
        libc = self

        class _Function:
            def __init__(self, name):
                self.name, self.argtypes = name, None

            def __call__(self, *args):
                libc.calls.append((self.name, *args))
                return 0 if self.name == "mallopt" and args[0] in libc.refuse else 1

        self.mallopt, self.malloc_trim = _Function("mallopt"), _Function("malloc_trim")


@pytest.mark.parametrize("refuse", [(), (embed_module.M_TRIM_THRESHOLD,), (embed_module.M_MMAP_MAX,)])
def test_heap_kept_sets_and_leaves_glibc_malloc_in_a_known_state(monkeypatch, refuse):
    import ctypes

    fake = _FakeLibc(refuse)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: fake)
    monkeypatch.setattr(embed_module.sys, "platform", "linux")
    monkeypatch.setattr(embed_module, "_confstr", lambda name: "glibc 2.36")
    with embed_module.heap_kept() as done:
        inside = list(fake.calls)
    m = embed_module
    if not refuse:
        assert done.startswith("glibc mallopt") and inside == [
            ("mallopt", m.M_MMAP_MAX, 0),
            ("mallopt", m.M_TRIM_THRESHOLD, -1),
        ]
        assert fake.calls[2:] == [
            ("mallopt", m.M_MMAP_MAX, m.DEFAULT_MMAP_MAX),
            ("mallopt", m.M_MMAP_THRESHOLD, 32 << 20),
            ("mallopt", m.M_TRIM_THRESHOLD, 64 << 20),
            ("malloc_trim", 0),
        ]
    elif refuse == (m.M_TRIM_THRESHOLD,):  # half applied: the first setting is undone at once
        assert done.startswith("unchanged") and inside[-1] == ("mallopt", m.M_MMAP_MAX, m.DEFAULT_MMAP_MAX)
        assert fake.calls == inside
    else:
        assert done.startswith("unchanged") and fake.calls == [("mallopt", m.M_MMAP_MAX, 0)]


def test_heap_kept_is_a_no_op_without_glibc(monkeypatch):
    import ctypes

    fake = _FakeLibc()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: fake)
    monkeypatch.setattr(embed_module, "_confstr", lambda name: "")  # musl, macOS, ...
    with embed_module.heap_kept() as done:
        pass
    assert done.startswith("unchanged") and fake.calls == []
