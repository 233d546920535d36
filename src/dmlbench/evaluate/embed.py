"""Embeddings with the evaluation transform (the Reality Check's Resize(256) -> CenterCrop(227)),
and the ``embed@<run>`` / ``embed_pretrained@<ds>-<bb>`` stages.

``artifacts/embeddings/<run>/embeddings.npz``: ``<split>_embeddings`` (float32, unit L2 norm, manifest
order) and ``<split>_labels`` of each non-empty split among test, val, query, gallery; ``meta.json``:
run, fold, grid_key and config_hash (how the evaluate stage finds the MLflow run), model_md5, splits
(row counts), dim. ``embed_pretrained``: the untrained trunk's pooled features, same layout under
``artifacts/embeddings/<ds>/<bb>/pretrained/``. Non-finite embeddings are never written.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmlbench import paths
from dmlbench.data.augment import eval_transform, resolve_interpolation
from dmlbench.devices import default_device
from dmlbench.errors import ConfigError, DataError, NonFiniteEmbeddings
from dmlbench.grid import RunSpec
from dmlbench.params.model import Params
from dmlbench.params.protocol import AugmentConfig, augment_for
from dmlbench.params.run import RunConfig, run_config
from dmlbench.safe_load import load_plain

EMBEDDINGS = "embeddings.npz"
META = "meta.json"
EMBED_SPLITS = ("test", "val", "query", "gallery")
PRETRAINED_INIT_SEED = 0  # random initialisation of trunks without pretrained weights

# glibc <malloc.h> mallopt() parameters (man 3 mallopt:
# https://man7.org/linux/man-pages/man3/mallopt.3.html)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
DEFAULT_MMAP_MAX = 65536
# After any mallopt call glibc no longer adjusts its thresholds itself, so leaving the block sets
# the values its dynamic adjustment reaches at most on 64-bit: mmap above 32 MiB, trim above 2 x that.
AFTER_MMAP_THRESHOLD, AFTER_TRIM_THRESHOLD = 32 << 20, 64 << 20


@contextlib.contextmanager
def heap_kept() -> Iterator[str]:
    """Inside: glibc serves large blocks from the heap and keeps freed memory for reuse
    (``mallopt(M_MMAP_MAX, 0)``, ``M_TRIM_THRESHOLD -1``): activations above the mmap threshold are
    otherwise a fresh, page-faulted ``mmap`` per pass, as much system time as compute on the CPU
    (benchmarks/embed_memory.py). On exit mmap and trimming resume and ``malloc_trim`` returns free
    memory. Not for nesting or threads; yields what was done; a no-op outside Linux glibc."""
    libc: Any = None  # ctypes.CDLL of the C library where it is glibc
    if sys.platform.startswith("linux") and "glibc" in _confstr("CS_GNU_LIBC_VERSION"):
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    applied = libc is not None and libc.mallopt(M_MMAP_MAX, 0) == 1
    if applied and libc.mallopt(M_TRIM_THRESHOLD, -1) != 1:
        libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)  # half applied: undo
        applied = False
    if not applied:
        yield "unchanged (not Linux glibc, or mallopt refused)"
        return
    try:
        yield "glibc mallopt: M_MMAP_MAX 0, M_TRIM_THRESHOLD -1"
    finally:
        libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        libc.mallopt(M_MMAP_THRESHOLD, AFTER_MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, AFTER_TRIM_THRESHOLD)
        libc.malloc_trim(0)


def _confstr(name: str) -> str:
    try:
        return os.confstr(name) or ""
    except (ValueError, OSError):  # name unknown on this platform
        return ""


class _InputBatches:
    """uint8 image batches on ``device``, without a fresh host buffer per batch: on the CPU a
    C-contiguous slice as it is (no copy), else one reused staging buffer; on CUDA one pinned staging
    buffer and one device buffer (``non_blocking``: the blocking copy of the previous result to the
    host has finished it before the staging buffer is reused). Pinned memory:
    https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers
    """

    def __init__(self, images: np.ndarray, batch_size: int, device: torch.device):
        self.device = device
        self.shape = (min(batch_size, len(images)), *images.shape[1:])
        self.dtype = images.dtype
        self.host: torch.Tensor | None = None  # staging buffer, allocated on first need
        self.on_device: torch.Tensor | None = None

    def _stage(self, chunk: np.ndarray, pinned: bool) -> torch.Tensor:
        if self.host is None:
            dtype = torch.from_numpy(np.empty(0, self.dtype)).dtype  # torch's dtype of the images' dtype
            self.host = torch.empty(self.shape, dtype=dtype, pin_memory=pinned)
        np.copyto(self.host.numpy()[: len(chunk)], chunk)
        return self.host[: len(chunk)]

    def get(self, images: np.ndarray, start: int, stop: int) -> torch.Tensor:
        chunk = images[start:stop]
        if self.device.type == "cpu":
            if isinstance(chunk, np.ndarray) and chunk.flags.c_contiguous:
                with warnings.catch_warnings():  # a read-only memmap: the view is only read
                    warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
                    return torch.from_numpy(np.asarray(chunk))  # a view: no copy
            return self._stage(chunk, pinned=False)
        if self.device.type != "cuda":
            return torch.from_numpy(np.ascontiguousarray(chunk)).to(self.device)
        host = self._stage(chunk, pinned=True)
        if self.on_device is None:
            self.on_device = torch.empty(self.shape, dtype=host.dtype, device=self.device)
        return self.on_device[: len(chunk)].copy_(host, non_blocking=True)


# oneDNN (CPU) and cuDNN run convolutions faster in NHWC: on the CPU 2.2x for the demo's tiny_cnn
# (benchmarks/channels_last.py); the embeddings are the same up to float rounding.
INFERENCE_FORMAT = torch.channels_last


@torch.no_grad()
def compute_embeddings(
    model: torch.nn.Module,
    images: np.ndarray,
    eval_resize: int,
    crop_size: int,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    features: bool = False,
    sizes: np.ndarray | None = None,
    progress: bool = False,
    squash: bool = False,
    interpolation: str = "weights",
) -> np.ndarray:
    """``images``: uint8 ``N x S x S x 3`` -> float32 ``N x dim`` (model in eval mode).
    ``features=True``: the pooled trunk features instead of the head's output. ``sizes`` (N x 2 valid
    h/w), ``squash`` and ``interpolation`` (``weights``: the model's) go to the eval transform."""
    count = len(images)
    if count == 0:
        return np.zeros((0, 0), dtype=np.float32)
    batches = _InputBatches(images, batch_size, torch.device(device))
    # the weights' resize kernel (EmbeddingModel) unless the protocol names one
    interpolation = resolve_interpolation(interpolation, getattr(model, "interpolation", "bilinear"))
    was_training = model.training
    model.eval()
    result: np.ndarray | None = None
    starts = range(0, count, batch_size)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc="embedding", unit="batch", leave=False)
    try:
        for start in starts:
            stop = min(start + batch_size, count)
            batch = batches.get(images, start, stop)
            window = None if sizes is None else sizes[start:stop]
            inputs = eval_transform(
                batch, eval_resize, crop_size, sizes=window, interpolation=interpolation, squash=squash
            )
            out = model.features(inputs) if features else model(inputs)
            if result is None:
                result = np.empty((count, *out.shape[1:]), dtype=np.float32)
            torch.from_numpy(result[start:stop]).copy_(out)  # to float32 on the host, in place
    finally:
        model.train(was_training)
    assert result is not None  # count > 0: the loop ran
    return result


def nonfinite_rows(embeddings: np.ndarray) -> int:
    """How many rows of ``embeddings`` hold a NaN or an infinity (0: every value is finite)."""
    if embeddings.size == 0 or np.isfinite(embeddings).all():
        return 0
    return int((~np.isfinite(embeddings)).reshape(len(embeddings), -1).any(axis=1).sum())


DIVERGED = "the model diverged: re-train it with a lower learning rate (optimizer.lr) or gradient clipping (grad_clip)"
UNTRAINED = "the untrained trunk's features overflow: check its weights (backbones.<name>.weights_path)"


def require_finite(embeddings: np.ndarray, who: str, split: str, remedy: str = DIVERGED) -> None:
    """:class:`~dmlbench.errors.NonFiniteEmbeddings` naming ``who`` (the run), ``split`` and
    ``remedy`` when a row of ``embeddings`` is not finite: one line, not a traceback from the metric code."""
    bad = nonfinite_rows(embeddings)
    if bad:
        raise NonFiniteEmbeddings(f"{who}: {bad} of {len(embeddings)} {split} embeddings are not finite; {remedy}")


def load_trained_model(
    config: RunConfig, device: torch.device, fold: int | None = None
) -> tuple[torch.nn.Module, dict]:
    """The selected model of the run (``fold``: one fold model); refuses weights trained under a
    different config, and a file holding more than tensors and plain values (read weights-only:
    :func:`dmlbench.safe_load.load_plain`)."""
    run = config.run
    model_path = paths.model_dir(run, fold) / "model.pt"
    if not model_path.exists():
        raise DataError(f"{model_path}: missing (run the train@{run.key} stage first)")
    saved = load_plain(model_path, f"re-run train@{run.key} to write it again")
    if saved["config_hash"] != config.config_hash:
        raise ConfigError(f"{model_path}: trained with other params than params.yaml now has; re-run train@{run.key}")
    model = config.build_model(pretrained=False)  # the trained weights replace the initial ones
    model.load_state_dict(saved["state_dict"])
    return model.to(device, memory_format=INFERENCE_FORMAT).eval(), saved


def embed_splits(
    dataset: str,
    model: torch.nn.Module,
    device: torch.device,
    augment: AugmentConfig,
    batch_size: int,
    features: bool = False,
    fold: int | None = None,
    who: str | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Unit-norm embeddings and labels of every non-empty evaluation split of ``dataset`` (``fold``: that
    fold's validation classes); :class:`~dmlbench.errors.NonFiniteEmbeddings` naming ``who`` if any is
    not finite. On the CPU in :func:`heap_kept` (peak RSS up: ResNet50, 224 px, batch 256:
    3.95 -> 8.40 GB, benchmarks/embed_memory.py)."""
    from dmlbench.data.cache import PreparedDataset
    from dmlbench.evaluate.knn import normalize_rows

    data = PreparedDataset.load(paths.prepared_dir(dataset))
    arrays: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for name in EMBED_SPLITS:
        split = data.split(name, fold=fold if name == "val" else None)
        if len(split) == 0:
            continue
        with heap_kept() if torch.device(device).type == "cpu" else contextlib.nullcontext():
            embeddings = compute_embeddings(
                model,
                split.images,
                augment.eval_resize,
                augment.crop_size,
                batch_size,
                device,
                features=features,
                sizes=getattr(split, "sizes", None),
                progress=True,
                squash=augment.eval == "squash",
                interpolation=augment.interpolation,
            )
        require_finite(embeddings, who or dataset, name, UNTRAINED if features else DIVERGED)
        arrays[f"{name}_embeddings"] = normalize_rows(embeddings)
        arrays[f"{name}_labels"] = split.labels
        counts[name] = len(split)
    if not counts:
        raise DataError(f"{paths.prepared_dir(dataset)}: no test, val, query or gallery images to embed")
    return arrays, counts


def _write(target: Path, arrays: dict[str, Any], meta: dict[str, Any]) -> None:
    """``embeddings.npz`` and ``meta.json`` into the folder ``target``."""
    from dmlbench.io import write_json

    np.savez(target / EMBEDDINGS, **arrays)
    write_json(target / META, meta)


def embed_stage(params: Params, run: RunSpec, device: torch.device | str | None = None) -> dict[str, Any]:
    """Embed with the run's selected model, or with each of its fold models into ``fold<f>/``."""
    from dmlbench.io import atomic_dir, md5_file, read_json

    config = run_config(params, run)
    protocol = config.protocol  # the run's: its augment may be overridden for the dataset (eval_batch_size is not)
    device = default_device(device)
    metas = []
    with atomic_dir(paths.embedding_dir(run)) as tmp:
        for fold in paths.folds_in(paths.model_dir(run)):
            model, _ = load_trained_model(config, device, fold)
            run_info = read_json(paths.model_dir(run, fold) / "run.json")
            who = run.key if fold is None else f"{run.key} fold {fold}"
            arrays, counts = embed_splits(
                run.dataset, model, device, protocol.augment, protocol.eval_batch_size, fold=fold, who=who
            )
            meta = {
                "run": run.key,
                "fold": fold,
                "grid_key": run_info["grid_key"],
                "config_hash": run_info["config_hash"],
                "model_md5": md5_file(paths.model_dir(run, fold) / "model.pt"),
                "splits": counts,
                "dim": run.dim,
            }
            target = tmp if fold is None else tmp / f"fold{fold}"
            target.mkdir(parents=True, exist_ok=True)
            _write(target, arrays, meta)
            metas.append(meta)
    return metas[0] if len(metas) == 1 else {"run": run.key, "folds": metas}


def _state_md5(model: torch.nn.Module) -> str:
    buffer = io.BytesIO()
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, buffer)
    return hashlib.md5(buffer.getvalue()).hexdigest()


def embed_pretrained_stage(
    params: Params, dataset: str, backbone: str, device: torch.device | str | None = None
) -> dict[str, Any]:
    """Pooled trunk features of the untrained trunk (the "Pretrained" row of the tables)."""
    from dmlbench.io import atomic_dir
    from dmlbench.models import build_model

    params.check_listed(dataset, backbone)
    device = default_device(device)
    protocol = params.protocol
    augment = augment_for(protocol.augment, protocol.overrides, dataset, backbone)  # per dataset (overrides)
    torch.manual_seed(PRETRAINED_INIT_SEED)
    # Not a run (no loss, dim or seed): the keys are read one by one, as dvc.yaml lists them.
    model = build_model(
        backbone,
        params.backbones[backbone],
        dim=1,  # the head is not used: features() stops at the pooled trunk output
        pooling=protocol.pooling,
        pretrained=protocol.pretrained,
        frozen_bn=protocol.frozen_bn,
    ).to(device, memory_format=INFERENCE_FORMAT)
    key = f"{paths.pretrained_key(dataset, backbone)}-{paths.PRETRAINED}"
    arrays, counts = embed_splits(dataset, model, device, augment, protocol.eval_batch_size, features=True, who=key)
    meta = {
        "run": key,
        "model_md5": _state_md5(model),
        "weights": "pretrained"
        if protocol.pretrained
        else f"random initialisation (torch seed {PRETRAINED_INIT_SEED})",
        "pooling": protocol.pooling,
        "splits": counts,
        "dim": int(next(iter(arrays.values())).shape[1]),
    }
    with atomic_dir(paths.pretrained_embedding_dir(dataset, backbone)) as tmp:
        _write(tmp, arrays, meta)
    return meta
