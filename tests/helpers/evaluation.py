"""``evaluate.backend: auto`` forced onto either CPU path.

``auto`` (and k-means, which always decides on its own) takes the certified bf16 ``screened`` path
on a CPU with native bf16 (AVX512-BF16 or AMX: Zen 4/5, Sapphire Rapids) and the fp32 faiss path on
any other CPU: on one machine only one of them would ever run in the suite, and a bug in the other
would pass unseen. :class:`CpuEvaluationPaths` forces auto's choice either way (the screened path
runs on any CPU: bf16 products are emulated where there is no native support, only slower) and
records which ranking and k-means code actually ran.
"""

from __future__ import annotations

import contextlib

import pytest

CPU_EVALUATION_PATHS = ("screened", "faiss")


class CpuEvaluationPaths:
    """``force(path)``: a context in which ``auto`` resolves to ``path`` ("screened" or "faiss") on
    the CPU, as it does on a CPU with / without native bf16; it yields the set of what ran inside,
    e.g. ``{"rank:screened", "kmeans:screened"}``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self._monkeypatch = monkeypatch

    @staticmethod
    def assert_took(ran: set[str], path: str, kmeans: bool = True) -> None:
        """``path``'s ranking (and k-means) ran, the other path's did not. (The screened ranking
        may also call the fp32 torch ranking, for queries whose certificate fails.)"""
        other = next(p for p in CPU_EVALUATION_PATHS if p != path)
        assert f"rank:{path}" in ran and f"rank:{other}" not in ran, ran
        if kmeans:
            assert f"kmeans:{path}" in ran and f"kmeans:{other}" not in ran, ran

    @staticmethod
    def _spy(target, name: str, record: set[str]):
        def spy(*args, **kwargs):
            record.add(name)
            return target(*args, **kwargs)

        return spy

    def force(self, path: str):
        import faiss
        import torch

        from dmlbench.evaluate import clustering, knn, screen

        if path not in CPU_EVALUATION_PATHS:
            raise ValueError(f"path must be one of {CPU_EVALUATION_PATHS}, got {path!r}")
        native_bf16 = path == "screened"
        ran: set[str] = set()

        @contextlib.contextmanager
        def forced():
            with self._monkeypatch.context() as patch:
                # every module that asks whether the CPU has native bf16 (each imported the function)
                for module in (screen, knn, clustering):
                    patch.setattr(module, "fast_bf16_matmul", lambda: native_bf16)
                # the CPU paths, also on a machine with a GPU (auto would take CUDA or faiss-gpu)
                for module in (knn, clustering):
                    patch.setattr(module, "faiss_gpus", lambda: 0)
                patch.setattr(torch.cuda, "is_available", lambda: False)
                patch.setattr(screen, "rank_screened", self._spy(screen.rank_screened, "rank:screened", ran))
                patch.setattr(knn, "_rank_faiss", self._spy(knn._rank_faiss, "rank:faiss", ran))
                patch.setattr(knn, "rank_torch", self._spy(knn.rank_torch, "rank:torch", ran))
                patch.setattr(
                    clustering, "_kmeans_screened", self._spy(clustering._kmeans_screened, "kmeans:screened", ran)
                )
                patch.setattr(clustering, "_kmeans_torch", self._spy(clustering._kmeans_torch, "kmeans:torch", ran))
                patch.setattr(faiss, "Kmeans", self._spy(faiss.Kmeans, "kmeans:faiss", ran))
                assert knn.resolve_backend("auto", "cpu") == (path, "cpu"), "auto did not follow the forced CPU"
                yield ran

        return forced()
