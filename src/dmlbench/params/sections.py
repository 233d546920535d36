"""The ``evaluate``, ``report`` and ``tracking`` sections of ``params.yaml``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from dmlbench.schema import StrictModel


def _distinct_sorted(values: list[int] | None, key: str) -> list[int] | None:
    if values is not None and len(set(values)) != len(values):
        raise ValueError(f"{key} has repeated values: {values}")
    return None if values is None else sorted(values)


class DatasetEvaluateConfig(StrictModel):
    """Per-dataset overrides of ``evaluate`` (unset keys fall back to the section's values)."""

    recall_at: list[PositiveInt] | None = Field(None, min_length=1)
    clustering: bool | None = None

    @field_validator("recall_at")
    @classmethod
    def _recall_at(cls, values: list[int] | None) -> list[int] | None:
        return _distinct_sorted(values, "recall_at")


class BootstrapConfig(StrictModel):
    """Bootstrap interval of one run over its test classes: ``resamples`` resamples of the classes
    (each with all its queries), ``method`` as in ``scipy.stats.bootstrap`` (BCa costs O(classes^2)), seeded."""

    resamples: int = Field(1000, ge=100, le=100_000)
    method: Literal["percentile", "basic", "BCa"] = "percentile"
    seed: NonNegativeInt = 0


class EvaluateConfig(StrictModel):
    """Test-set evaluation (``dmlbench.evaluate``). ``per_dataset.<name>`` overrides ``recall_at`` and
    ``clustering`` (NMI/AMI from k-means, k = classes); ``confidence``: of the seed t-interval and the
    class-cluster bootstrap; ``backend`` (``auto``: faiss on GPUs, the certified bf16 ``screened``
    search on CPUs with native bf16, else faiss): all give the same results."""

    recall_at: list[PositiveInt] = Field(default_factory=lambda: [1, 2, 4, 8], min_length=1)
    per_dataset: dict[str, DatasetEvaluateConfig] = Field(default_factory=dict)
    clustering: bool = True
    kmeans_niter: PositiveInt = 20
    confidence: float = Field(0.95, gt=0, lt=1)
    bootstrap: BootstrapConfig = BootstrapConfig()
    backend: Literal["auto", "faiss", "torch", "screened"] = "auto"

    @field_validator("recall_at")
    @classmethod
    def _recall_at(cls, values: list[int]) -> list[int]:
        return sorted(_distinct_sorted(values, "recall_at") or [])

    def recall_ks(self, dataset: str) -> tuple[int, ...]:
        """The K of Recall@K for ``dataset`` (its override, else ``recall_at``), ascending."""
        override = self.per_dataset.get(dataset)
        return tuple(override.recall_at if override and override.recall_at else self.recall_at)

    def clustering_for(self, dataset: str) -> bool:
        override = self.per_dataset.get(dataset)
        return self.clustering if override is None or override.clustering is None else override.clustering


class GalleryConfig(StrictModel):
    """Retrieval gallery: ``queries`` test images of distinct classes (drawn with ``seed``), top ``neighbours``."""

    queries: PositiveInt = Field(4, le=12)
    neighbours: PositiveInt = Field(4, le=8)
    max_losses: PositiveInt = Field(4, le=10)
    seed: NonNegativeInt = 0


class ReportConfig(StrictModel):
    """What the report ranks by and how it tests differences. ``focus_dim``: the figures' embedding size
    (512 if in ``dims``, else the largest); ``alpha``: Friedman/Nemenyi level; ``rope``: half-width of
    practical equivalence in metric units (0.01 = 1 point). Blocks are the datasets, not a setting."""

    primary_metric: Literal["precision_at_1", "r_precision", "map_at_r", "recall_at_1"] = "map_at_r"
    title: str = "dmlbench report"
    focus_dim: PositiveInt | None = None
    alpha: float = Field(0.05, gt=0, lt=0.5)
    rope: float = Field(0.01, gt=0, lt=0.5)
    gallery: GalleryConfig = GalleryConfig()

    @model_validator(mode="before")
    @classmethod
    def _blocks_removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "blocks" in data:
            raise ValueError(
                "blocks was removed: the statistical tests always use the datasets as their independent blocks "
                "(the experiments of one dataset share its images); delete report.blocks"
            )
        return data


class TrackingConfig(StrictModel):
    """MLflow settings; the store is ``$MLFLOW_TRACKING_URI`` or ``sqlite:///<repo>/mlflow.db``."""

    experiment: str = Field("dmlbench", min_length=1)
