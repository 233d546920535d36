"""kNN ``auto`` and faiss's GPUs: faiss ranks on the GPU only when it has GPU support *and* was built
for torch's CUDA major (one CUDA stack per process); else torch on CUDA, else the CPU backends.
Capabilities are faked: no GPU, no faiss-gpu here."""

from __future__ import annotations

import importlib.metadata

import faiss
import pytest
import torch

from dmlbench.evaluate import clustering
from dmlbench.evaluate import knn as knn_module
from dmlbench.evaluate.knn import faiss_cuda_major, faiss_gpu_usable, faiss_gpus, resolve_backend

FAISS_GPU_REQUIRES = {  # Requires-Dist of the wheels on PyPI (faiss-gpu 1.15.1, faiss-gpu-cu12 1.14.1.post1)
    "faiss-gpu": ["numpy>=1.25", "packaging", "nvidia-cuda-runtime-cu12<13,>=12.6", "nvidia-cublas-cu12<13,>=12.6"],
    "faiss-gpu-cu12": ["numpy<3,>=2", "packaging", "nvidia-cuda-runtime-cu12>=12.1.105"],
}


@pytest.mark.parametrize(
    ("count", "faiss_cuda", "torch_cuda", "usable"),
    [
        (2, 12, "12.6", 2),  # faiss-gpu next to torch cu126: faiss on the GPUs
        (2, 12, "13.0", 0),  # next to the default CUDA 13 torch: not used
        (1, 11, "12.6", 0),
        (0, 12, "12.6", 0),  # faiss-cpu
        (1, None, "12.6", 0),  # a faiss whose CUDA is not known (e.g. a conda build): not trusted
        (1, 12, None, 0),  # a CPU-only torch
    ],
)
def test_faiss_gpus_count_only_with_torchs_cuda_major(count, faiss_cuda, torch_cuda, usable):
    assert faiss_gpu_usable(count, faiss_cuda, torch_cuda) == usable


def _installed(monkeypatch, name: str | None):
    def requires(dist):
        if dist != name:
            raise importlib.metadata.PackageNotFoundError(dist)
        return FAISS_GPU_REQUIRES[dist]

    monkeypatch.setattr(importlib.metadata, "requires", requires)


@pytest.mark.parametrize("name", ["faiss-gpu", "faiss-gpu-cu12"])
def test_faiss_cuda_major_is_read_from_the_wheels_metadata(monkeypatch, name):
    _installed(monkeypatch, name)
    assert faiss_cuda_major() == 12


def test_faiss_cpu_has_no_cuda_major():
    assert faiss_cuda_major() is None  # this environment: faiss-cpu
    assert faiss_gpus() == 0


@pytest.mark.parametrize(
    ("torch_cuda", "knn_backend", "kmeans"), [("12.6", "faiss", "faiss"), ("13.0", "torch", "torch")]
)
def test_auto_picks_faiss_gpu_only_for_a_matching_cuda(monkeypatch, torch_cuda, knn_backend, kmeans):
    _installed(monkeypatch, "faiss-gpu")
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1, raising=False)  # faiss with GPU support (faked)
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    monkeypatch.setattr(knn_module, "fast_bf16_matmul", lambda: False)
    assert resolve_backend("auto", "cuda") == (knn_backend, "cuda")
    assert clustering.resolve_kmeans_backend("cuda") == kmeans
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0, raising=False)  # faiss-cpu next to a CUDA torch
    assert resolve_backend("auto", "cuda") == ("torch", "cuda")
    assert resolve_backend("auto", "cpu") == ("faiss", "cpu")
