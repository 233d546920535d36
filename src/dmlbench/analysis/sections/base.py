"""A report section and the document sections write into.

A section is a heading, its short name in the contents line and a ``write(analysis, doc)`` that
adds markdown and draws its figures through :meth:`Document.figure`, the caption beside the call
that draws it. Figures are numbered in the order the document places them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dmlbench.analysis.numbers import Analysis, t_bounds
from dmlbench.analysis.text import format_interval
from dmlbench.params.model import Params

DEMO_PROTOCOL, DEMO_DATASET = "demo", "glyphs"
# why a report has no wall-clock timings: they live outside DVC's outputs (reproducible hashes)
NO_TIMINGS = "they are kept in `artifacts/runlog/` and MLflow, not in DVC's outputs, and some run logs are missing here"

FIGURES = "figures"  # the figures' folder next to report.md


@dataclass
class Document:
    """Markdown lines of the report and the folder its figures are drawn into."""

    figure_dir: Path
    lines: list[str] = field(default_factory=list)
    figure_count: int = 0

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def figure(self, name: str, draw: Callable[[Path], Path], caption: str) -> None:
        """Draw ``<name>.png`` with ``draw(path)`` and place it with the next figure number."""
        path = draw(self.figure_dir / f"{name}.png")
        self.figure_count += 1
        self.add(
            f"![{name.replace('_', ' ')}]({FIGURES}/{path.name})", "", f"*Figure {self.figure_count}. {caption}*", ""
        )

    def note(self, text: str) -> None:
        """A quoted line: a figure or table the data cannot support, and why."""
        self.add(f"> {text}", "")

    def demo_note(self, params: Params) -> None:
        """:func:`demo_note` as a quoted line, where the grid is the demo's."""
        note = demo_note(params)
        if note:
            self.note(note)

    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass(frozen=True)
class Section:
    title: str  # the ``##`` heading
    short: str  # its name in the contents line
    write: Callable[[Analysis, Document], None]  # the section's body, below its heading


def demo_note(params: Params) -> str | None:
    """The demo's limits in one line, for the places its numbers appear (results, tournament, our
    relative improvements); None unless the grid trains the demo protocol or the demo dataset."""
    if params.protocol_name != DEMO_PROTOCOL and DEMO_DATASET not in params.datasets:
        return None
    protocol = params.protocol
    start = "ImageNet weights" if protocol.pretrained else "scratch"
    backbones = ", ".join(f"`{b}`" for b in params.backbones)
    datasets = ", ".join(f"`{d}`" for d in params.datasets)
    return (
        f"Demo data ({datasets}; {backbones} from {start}, {protocol.epochs} epochs): these numbers rank the "
        "losses on this data and protocol only; they say nothing about CUB200, Cars196, SOP or In-Shop."
    )


def seed_cell(
    values: pd.Series,
    confidence: float,
    n: int | None,
    lower: float = 0.0,
    upper: float = math.inf,
    scale: float = 100,
    digits: int = 1,
) -> str:
    """A table cell of per-seed ``values``: their mean and t-interval inside ``[lower, upper]``, as
    :func:`~dmlbench.analysis.text.format_interval` writes it, stating n where it is not ``n``."""
    low, high = t_bounds(values, confidence, lower, upper)
    return format_interval(values.mean(), low, high, len(values), scale, digits, show_n=len(values) != n)
