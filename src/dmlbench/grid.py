"""The grid's cells: a (dataset, backbone, loss, dim) combination and a run (plus its seed).

A leaf module (no dmlbench imports): paths, tracking and the stages name runs without loading
the params schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, order=True)
class Combo:
    """One cell of the grid without its seed: what seeds are averaged over."""

    dataset: str
    backbone: str
    loss: str
    dim: int

    @property
    def key(self) -> str:
        """The DVC matrix suffix, e.g. ``glyphs-tiny_cnn-contrastive-64``."""
        return f"{self.dataset}-{self.backbone}-{self.loss}-{self.dim}"

    @property
    def relpath(self) -> Path:
        return Path(self.dataset, self.backbone, self.loss, str(self.dim))

    def with_seed(self, seed: int) -> "RunSpec":
        return RunSpec(self.dataset, self.backbone, self.loss, self.dim, seed)


@dataclass(frozen=True, order=True)
class RunSpec:
    """One training run: a grid cell and a seed."""

    dataset: str
    backbone: str
    loss: str
    dim: int
    seed: int

    @property
    def combo(self) -> Combo:
        return Combo(self.dataset, self.backbone, self.loss, self.dim)

    @property
    def key(self) -> str:
        """The DVC matrix suffix, e.g. ``glyphs-tiny_cnn-contrastive-64-0``."""
        return f"{self.combo.key}-{self.seed}"

    @property
    def grid_key(self) -> str:
        """Human-readable identity used as an MLflow tag, e.g. ``glyphs/tiny_cnn/contrastive/64/seed0``."""
        return str(self.relpath)

    @property
    def relpath(self) -> Path:
        return self.combo.relpath / f"seed{self.seed}"
