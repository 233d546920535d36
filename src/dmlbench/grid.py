"""The grid's cells: a (dataset, backbone, loss, dim) combination and a run (plus its seed).

``variant``: "" for the grid itself; ``published`` for a baseline cell of a tuned protocol (the
published hyperparameters trained at ``tuning.dim`` with every seed, ``tuning.baselines``), stored
at the loss level as ``<loss>-published`` (loss names have no hyphen).

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
    variant: str = ""

    @property
    def loss_level(self) -> str:
        """The loss's place in paths and keys: ``contrastive``, or ``contrastive-published``."""
        return f"{self.loss}-{self.variant}" if self.variant else self.loss

    @property
    def key(self) -> str:
        """The DVC matrix suffix, e.g. ``glyphs-tiny_cnn-contrastive-64``."""
        return f"{self.dataset}-{self.backbone}-{self.loss_level}-{self.dim}"

    @property
    def relpath(self) -> Path:
        """``glyphs/tiny_cnn/contrastive/64``; a baseline cell has one dim (``tuning.dim``), so its
        path leaves it out (``glyphs/tiny_cnn/contrastive-published``): dvc.yaml names its outputs
        without a dim that ``tuning.dim: null`` (the grid's largest) would leave unresolved."""
        if self.variant:
            return Path(self.dataset, self.backbone, self.loss_level)
        return Path(self.dataset, self.backbone, self.loss_level, str(self.dim))

    @property
    def stage(self) -> str:
        """The DVC stage that evaluates this cell: ``evaluate@<key>``, or for a baseline cell
        ``baseline@<dataset>-<backbone>-<loss>-<variant>`` (which also trains it)."""
        if not self.variant:
            return f"evaluate@{self.key}"
        return f"baseline@{self.dataset}-{self.backbone}-{self.loss}-{self.variant}"

    def with_seed(self, seed: int) -> RunSpec:
        return RunSpec(self.dataset, self.backbone, self.loss, self.dim, seed, self.variant)


@dataclass(frozen=True, order=True)
class RunSpec:
    """One training run: a grid cell and a seed."""

    dataset: str
    backbone: str
    loss: str
    dim: int
    seed: int
    variant: str = ""

    @property
    def combo(self) -> Combo:
        return Combo(self.dataset, self.backbone, self.loss, self.dim, self.variant)

    @property
    def key(self) -> str:
        """The DVC matrix suffix, e.g. ``glyphs-tiny_cnn-contrastive-64-0``."""
        return f"{self.combo.key}-{self.seed}"

    @property
    def stage(self) -> str:
        """The DVC stage that trains this run: ``train@<key>``, or for a baseline run the
        cell's ``baseline@<dataset>-<backbone>-<loss>-<variant>`` (every seed, at ``tuning.dim``)."""
        return f"train@{self.key}" if not self.variant else self.combo.stage

    @property
    def grid_key(self) -> str:
        """Human-readable identity used as an MLflow tag, e.g. ``glyphs/tiny_cnn/contrastive/64/seed0``."""
        return str(self.relpath)

    @property
    def relpath(self) -> Path:
        return self.combo.relpath / f"seed{self.seed}"
