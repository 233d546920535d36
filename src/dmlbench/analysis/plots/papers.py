"""Figures of the "Papers versus reality" section: relative and absolute R@1 by publication year."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dmlbench.analysis.literature import DATASET_LABELS
from dmlbench.analysis.plots.style import save_figure, theme

SERIES_STYLE = {  # papers-vs-reality series: colour, marker
    "claimed": ("#c0392b", "o"),
    "baseline": ("#7f8c8d", "x"),
    "reference": ("#2471a3", "s"),
    "thesis": ("#1e8449", "D"),
    "ours": ("#111111", "o"),
}


DATASET_MARKERS = {"cub200": "o", "cars196": "s", "sop": "^", "inshop": "D"}


def papers_vs_reality(
    claimed: dict[str, pd.DataFrame],
    reference: dict[str, pd.DataFrame],
    ours: dict[str, pd.DataFrame],
    path: Path,
    ours_label: str,
) -> Path:
    """Relative improvement over each baseline by year: claimed by papers (top) and re-measured (bottom).

    ``claimed[b]``: loss, display, year, dataset, improvement, uncertain; ``reference[b]``:
    series, loss, year, dataset, improvement; ``ours[b]``: loss, display, year, estimate, low,
    high (all percent) - for baseline ``b``. Losses of one year are spread apart horizontally.
    """
    theme()
    baselines = list(claimed)
    positions = _year_axis([*claimed.values(), *reference.values(), *ours.values()])
    fig, axes = plt.subplots(2, len(baselines), figsize=(6.4 * len(baselines), 8.6), squeeze=False, sharex=True)
    for col, baseline in enumerate(baselines):
        top, bottom = axes[0, col], axes[1, col]
        frame = claimed[baseline]
        if len(frame):
            frame = frame.assign(x=_x(frame, positions))
            for (dataset, uncertain), part in frame.groupby(["dataset", "uncertain"]):
                colour = SERIES_STYLE["claimed"][0]
                top.scatter(
                    part["x"],
                    part["improvement"],
                    marker=DATASET_MARKERS.get(dataset, "o"),
                    s=36,
                    facecolors="none" if uncertain else colour,
                    edgecolors=colour,
                    linewidths=1.2,
                )
            for _, part in frame.groupby("loss", sort=False):
                top.annotate(
                    part["display"].iloc[0],
                    (part["x"].iloc[0], part["improvement"].max()),
                    textcoords="offset points",
                    xytext=(0, 6),
                    fontsize=6.5,
                    color="#444",
                    ha="left",
                    rotation=35,
                )
        top.axhline(0, color="black", linewidth=0.8)
        top.set_title(f"(a) according to papers: over {baseline}")
        top.set_ylabel("claimed R@1 improvement (%)")
        top.margins(y=0.18)
        ref = reference.get(baseline, pd.DataFrame())
        if len(ref):
            ref = ref.assign(x=_x(ref, positions, -0.04))
            for index, (series, group) in enumerate(ref.groupby("series", sort=False)):
                colour, marker = SERIES_STYLE["reference" if index == 0 else "thesis"]
                bottom.scatter(
                    group["x"], group["improvement"], marker=marker, s=22, color=colour, alpha=0.7, label=series
                )
        mine = ours.get(baseline, pd.DataFrame())
        if len(mine):
            mine = mine.assign(x=_x(mine, positions, 0.06))
            bottom.errorbar(
                mine["x"],
                mine["estimate"],
                yerr=[mine["estimate"] - mine["low"], mine["high"] - mine["estimate"]],
                fmt="o",
                color=SERIES_STYLE["ours"][0],
                capsize=3,
                label=ours_label,
            )
            for row in mine.itertuples():
                bottom.annotate(row.display, (row.x, row.high), textcoords="offset points", xytext=(3, 3), fontsize=7)
        bottom.axhline(0, color="black", linewidth=0.8)
        bottom.set_title(f"(b) according to re-runs under one protocol: over {baseline}")
        bottom.set_ylabel("measured P@1 improvement (%)")
        bottom.set_xlabel("year the loss was published")
        _set_year_ticks(bottom, positions)
        bottom.margins(y=0.15)
        bottom.legend(fontsize=7, loc="best", frameon=True)
    handles = [
        plt.Line2D([], [], marker=m, linestyle="none", color="#555", label=DATASET_LABELS[d])
        for d, m in DATASET_MARKERS.items()
    ] + [
        plt.Line2D(
            [],
            [],
            marker="o",
            linestyle="none",
            markerfacecolor="none",
            color="#555",
            label="hollow: value not verified",
        )
    ]
    fig.suptitle("Papers versus reality: relative improvement over the old losses", y=1.03)
    fig.tight_layout()
    fig.legend(
        handles=handles, fontsize=8, loc="upper center", ncol=len(handles), frameon=False, bbox_to_anchor=(0.5, 1.005)
    )
    return save_figure(fig, path)


def _year_axis(frames: Sequence[pd.DataFrame]) -> dict[float, int]:
    """Years present in ``frames`` -> evenly spaced positions (no empty decade between 2006 and 2016)."""
    years = sorted({float(y) for frame in frames if len(frame) for y in frame["year"].dropna()})
    return {year: i for i, year in enumerate(years)}


def _set_year_ticks(ax, positions: dict[float, int]) -> None:
    ax.set_xticks(list(positions.values()), [str(int(y)) for y in positions])
    ax.set_xlim(-0.6, len(positions) - 0.4)


def _x(frame: pd.DataFrame, positions: dict[float, int], shift: float = 0.0) -> pd.Series:
    return frame["year"].astype(float).map(positions) + _jitter(frame) + shift


def _jitter(frame: pd.DataFrame, width: float = 0.16) -> np.ndarray:
    """Horizontal offsets that spread the losses of one year apart (deterministic, by loss name)."""
    if frame.empty:
        return np.zeros(0)
    offsets: dict[tuple, float] = {}
    for year, losses in frame.groupby("year")["loss"]:
        names = sorted(set(losses))
        for i, loss in enumerate(names):
            offsets[(year, loss)] = (i - (len(names) - 1) / 2) * width
    return np.array([offsets[(y, loss)] for y, loss in zip(frame["year"], frame["loss"], strict=True)], dtype=float)


def papers_absolute(
    literature: pd.DataFrame,
    reference: pd.DataFrame,
    ours: pd.DataFrame,
    path: Path,
    ours_title: str,
) -> Path:
    """R@1 by year per dataset: claims, the baselines papers reported, the re-runs, and our runs.

    ``literature``: claimed and baseline rows (loss display name in ``display``); ``reference``:
    re-run rows with ``series`` and ``year``; ``ours``: loss, display, year, dataset, mean, low,
    high (percent). Datasets without re-run numbers get no panel; our runs get their own panel
    unless they are on a published dataset.
    """
    theme()
    datasets = [d for d in DATASET_LABELS if d in set(reference["dataset"])]
    own_panel = len(ours) > 0 and not set(ours["dataset"]) <= set(datasets)
    panels = datasets + ([ours_title] if own_panel else [])
    positions = _year_axis([literature[literature["dataset"].isin(datasets)], reference, ours])
    columns = 2 if len(panels) > 2 else len(panels)
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.2 * columns, 4.4 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat[: len(panels)], panels, strict=True):
        if panel in datasets:
            published = literature[literature["dataset"] == panel]
            claims = published[published["kind"] == "claimed"]
            if len(claims):
                claims = claims.assign(x=_x(claims, positions))
                colour = SERIES_STYLE["claimed"][0]
                for uncertain, part in claims.groupby("uncertain"):
                    ax.scatter(
                        part["x"],
                        part["value"],
                        s=34,
                        marker="o",
                        edgecolors=colour,
                        facecolors="none" if uncertain else colour,
                    )
                for _, part in claims.groupby("loss", sort=False):
                    ax.annotate(
                        part["display"].iloc[0],
                        (part["x"].iloc[0], part["value"].max()),
                        textcoords="offset points",
                        xytext=(0, 5),
                        fontsize=6.5,
                        color="#444",
                        rotation=35,
                    )
            for loss, marker in (("contrastive", "x"), ("triplet", "+")):
                part = published[(published["kind"] == "baseline") & (published["loss"] == loss)]
                ax.scatter(
                    part["year"].astype(float).map(positions),
                    part["value"],
                    marker=marker,
                    s=40,
                    color=SERIES_STYLE["baseline"][0],
                )
            ref = reference[reference["dataset"] == panel]
            ref = ref.assign(x=_x(ref, positions))
            for index, (_, group) in enumerate(ref.groupby("series", sort=False)):
                colour, marker = SERIES_STYLE["reference" if index == 0 else "thesis"]
                ax.scatter(group["x"] + 0.05 * index, group["value"], marker=marker, s=20, color=colour, alpha=0.75)
            mine = ours[ours["dataset"] == panel] if len(ours) else ours
            ax.set_title(DATASET_LABELS[panel])
        else:
            mine = ours
            ax.set_title(ours_title)
        if len(mine):
            mine = mine.assign(x=_x(mine, positions, 0.05))
            ax.errorbar(
                mine["x"],
                mine["mean"],
                yerr=[mine["mean"] - mine["low"], mine["high"] - mine["mean"]],
                fmt="o",
                color=SERIES_STYLE["ours"][0],
                capsize=3,
            )
            if panel not in datasets:
                for row in mine.itertuples():
                    ax.annotate(row.display, (row.x, row.high), textcoords="offset points", xytext=(3, 3), fontsize=7)
        ax.set_xlabel("year the loss was published")
        ax.set_ylabel("R@1 = P@1 (%)")
        _set_year_ticks(ax, positions)
        ax.margins(y=0.15)
    handles = (
        [
            plt.Line2D(
                [],
                [],
                marker="o",
                linestyle="none",
                color=SERIES_STYLE["claimed"][0],
                label="claimed by the loss's paper (hollow: not verified)",
            ),
            plt.Line2D(
                [],
                [],
                marker="x",
                linestyle="none",
                color=SERIES_STYLE["baseline"][0],
                label="contrastive, as reported by papers",
            ),
            plt.Line2D(
                [],
                [],
                marker="+",
                linestyle="none",
                color=SERIES_STYLE["baseline"][0],
                label="triplet, as reported by papers",
            ),
        ]
        + [
            plt.Line2D(
                [],
                [],
                marker=SERIES_STYLE["reference" if i == 0 else "thesis"][1],
                linestyle="none",
                color=SERIES_STYLE["reference" if i == 0 else "thesis"][0],
                label=series,
            )
            for i, series in enumerate(dict.fromkeys(reference["series"]))
        ]
        + [
            plt.Line2D(
                [], [], marker="o", linestyle="none", color=SERIES_STYLE["ours"][0], label="our runs (95% t-interval)"
            )
        ]
    )
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=7.5, frameon=False, bbox_to_anchor=(0.5, -0.06))
    fig.suptitle("What papers claimed, what they compared against, and what re-runs under one protocol measured", y=1.0)
    fig.tight_layout()
    return save_figure(fig, path)
