"""Figures of the "Papers versus reality" section: relative and absolute R@1 by publication year."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dmlbench.analysis.literature import DATASET_LABELS
from dmlbench.analysis.plots.style import save_figure, theme

SERIES_STYLE = {  # papers-vs-reality series: colour, marker (the marker is used by papers_absolute only)
    "claimed": ("#c0392b", "o"),
    "baseline": ("#7f8c8d", "x"),
    "reference": ("#2471a3", "s"),
    "thesis": ("#1e8449", "D"),
    "ours": ("#111111", "o"),
}


BORROWED = "†"  # a claim set against other papers' baseline numbers (sections/papers.py uses the same mark)
DATASET_MARKERS = {"cub200": "o", "cars196": "s", "sop": "^", "inshop": "D"}
OTHER_DATASET_MARKER = "P"  # a dataset no paper reports on (the offline demo's glyphs)
LEGEND_TEXT = {"fontsize": 8, "title_fontsize": 8, "frameon": False}  # the two legends of papers_vs_reality_figure


def dataset_marker(dataset: str) -> str:
    """papers_vs_reality's one meaning of a marker shape: the dataset, in every panel."""
    return DATASET_MARKERS.get(dataset, OTHER_DATASET_MARKER)


def papers_vs_reality(
    claimed: dict[str, pd.DataFrame],
    reference: dict[str, pd.DataFrame],
    ours: dict[str, pd.DataFrame],
    path: Path,
    ours_label: str,
) -> Path:
    """:func:`papers_vs_reality_figure` written to ``path``."""
    return save_figure(papers_vs_reality_figure(claimed, reference, ours, ours_label), path)


def papers_vs_reality_figure(
    claimed: dict[str, pd.DataFrame], reference: dict[str, pd.DataFrame], ours: dict[str, pd.DataFrame], ours_label: str
) -> plt.Figure:
    """Relative improvement over each baseline ``b`` by year: claimed by papers (a), re-measured (b).

    Colour = who measured, marker = dataset, hollow = ``uncertain``, † = a borrowed baseline. Our runs
    on a dataset no paper reports on (the demo) get their own row (c), so their wide intervals do not
    flatten the published points; in (b) a whisker beyond the published points' axis is cut with an
    arrow and its end printed. ``claimed[b]``: loss, display, year, dataset, improvement, uncertain
    (borrowed optional); ``reference[b]``: series, loss, year, dataset, improvement (uncertain
    optional); ``ours[b]``: loss, display, year, dataset, estimate, low, high (all percent).
    """
    theme()
    baselines = list(claimed)
    positions = _year_axis([*claimed.values(), *reference.values(), *ours.values()])
    published = set(DATASET_MARKERS)
    frames = [f for f in ours.values() if len(f)]
    own_row = any(not set(f["dataset"]) <= published for f in frames)
    rows = 3 if own_row else 2
    fig, axes = plt.subplots(
        rows, len(baselines), figsize=(6.4 * len(baselines), 4.3 * rows), squeeze=False, sharex=True
    )
    colours = {"claimed": SERIES_STYLE["claimed"][0], "ours": SERIES_STYLE["ours"][0]}
    for col, baseline in enumerate(baselines):
        top, bottom = axes[0, col], axes[1, col]
        frame = claimed[baseline]
        if len(frame):
            frame = frame.assign(x=_x(frame, positions))
            _scatter_by_dataset(top, frame, "improvement", colours["claimed"], size=36)
            _mark_borrowed(top, frame)
            _name_losses(top, frame, "improvement", 6)
        top.axhline(0, color="black", linewidth=0.8)
        top.set_title(f"(a) according to papers: over {baseline}")
        top.set_ylabel("claimed R@1 improvement (%)")
        top.margins(y=0.18)
        ref = reference.get(baseline, pd.DataFrame())
        levels = []
        if len(ref):
            ref = ref.assign(x=_x(ref, positions, -0.04))
            for index, (series, group) in enumerate(ref.groupby("series", sort=False)):
                colours[series] = SERIES_STYLE["reference" if index == 0 else "thesis"][0]
                _scatter_by_dataset(bottom, group, "improvement", colours[series], size=24, alpha=0.75)
            levels += list(ref["improvement"])
        mine = ours.get(baseline, pd.DataFrame())
        mine = mine.assign(x=_x(mine, positions, 0.06)) if len(mine) else mine
        bottom.axhline(0, color="black", linewidth=0.8)
        bottom.set_title(f"(b) according to re-runs under one protocol: over {baseline}")
        bottom.set_ylabel("measured P@1 improvement (%)")
        if own_row:
            ax = axes[2, col]
            _our_points(ax, mine, None)
            ax.axhline(0, color="black", linewidth=0.8)
            ax.set_title(f"(c) {ours_label}: over {baseline}")
            ax.set_ylabel("measured P@1 improvement (%)")
            ax.margins(y=0.15)
            bottom.margins(y=0.15)
        elif len(mine):
            levels += list(mine["estimate"])
            low, high = min(levels), max(levels)
            pad = max(0.15 * (high - low), 2.0)
            _our_points(bottom, mine, (low - pad, high + pad))
        else:
            bottom.margins(y=0.15)
        axes[-1, col].set_xlabel("year the loss was published")
        _set_year_ticks(axes[-1, col], positions)
    datasets = sorted({d for f in [*claimed.values(), *reference.values(), *frames] if len(f) for d in f["dataset"]})
    marker_handles = [
        _legend_entry(dataset_marker(d), "#555", DATASET_LABELS.get(d, d))
        for d in [*[d for d in DATASET_MARKERS if d in datasets], *[d for d in datasets if d not in DATASET_MARKERS]]
    ] + [_legend_entry("o", "#555", "hollow: not read in its own paper", hollow=True)]
    if any("borrowed" in f.columns and f["borrowed"].any() for f in claimed.values() if len(f)):
        marker_handles.append(_legend_entry(r"$\dagger$", "#555", "baseline from other papers"))
    names = {"claimed": "claimed by the loss's paper", "ours": f"{ours_label} (95% interval)"}
    colour_handles = [
        _legend_entry("s", colour, names.get(series, series))
        for series, colour in colours.items()
        if series != "ours" or frames
    ]
    # title 0.65 in above the marker legend whatever the rows: a fixed figure fraction overlaps them at 2 rows
    fig.suptitle("Papers versus reality: relative improvement over the old losses", y=1 + 0.65 / fig.get_figheight())
    fig.tight_layout()
    legends = (  # handles, title, placement above or below the panels, columns
        (marker_handles, "marker = dataset", "lower center", (0.5, 1.0), len(marker_handles)),
        (colour_handles, "colour = source of the number", "upper center", (0.5, 0.0), min(len(colour_handles), 3)),
    )
    for handles, title, loc, anchor, ncol in legends:
        fig.legend(handles=handles, title=title, loc=loc, bbox_to_anchor=anchor, ncol=ncol, **LEGEND_TEXT)
    return fig


def _legend_entry(marker: str, colour: str, label: str, hollow: bool = False) -> plt.Line2D:
    """A legend handle: one marker (``hollow``: its outline only), no line."""
    face = "none" if hollow else None
    return plt.Line2D([], [], marker=marker, linestyle="none", markerfacecolor=face, color=colour, label=label)


def _name_losses(ax, frame: pd.DataFrame, column: str, lift: float) -> None:
    """Each loss's display name above its highest point of ``column``, slanted."""
    for _, part in frame.groupby("loss", sort=False):
        ax.annotate(
            part["display"].iloc[0],
            (part["x"].iloc[0], part[column].max()),
            textcoords="offset points",
            xytext=(0, lift),
            fontsize=6.5,
            color="#444",
            ha="left",
            rotation=35,
        )


def _scatter_by_dataset(ax, frame: pd.DataFrame, column: str, colour: str, size: float, alpha: float = 1.0) -> None:
    """Points of one source (one colour), a marker per dataset, hollow where ``uncertain``."""
    uncertain = frame["uncertain"] if "uncertain" in frame.columns else pd.Series(False, index=frame.index)
    for (dataset, hollow), part in frame.assign(hollow=uncertain.astype(bool)).groupby(["dataset", "hollow"]):
        ax.scatter(
            part["x"],
            part[column],
            marker=dataset_marker(dataset),
            s=size,
            facecolors="none" if hollow else colour,
            edgecolors=colour,
            linewidths=1.2,
            alpha=alpha,
        )


def _mark_borrowed(ax, frame: pd.DataFrame) -> None:
    """A † beside each claim whose baseline is borrowed from other papers (its paper reports none)."""
    if "borrowed" not in frame.columns:
        return
    for row in frame[frame["borrowed"].astype(bool)].itertuples():
        ax.annotate(BORROWED, (row.x, row.improvement), textcoords="offset points", xytext=(4, -3), fontsize=7)


def _our_points(ax, mine: pd.DataFrame, limits: tuple[float, float] | None) -> None:
    """Our runs: mean and interval, a marker per dataset; with ``limits``, the y axis is set to them
    and a whisker beyond them is cut at the edge, marked by an arrow and the whisker's end."""
    if not len(mine):
        return
    colour = SERIES_STYLE["ours"][0]
    low_end, high_end = (-np.inf, np.inf) if limits is None else limits
    for row in mine.itertuples():
        low, high = max(row.low, low_end), min(row.high, high_end)
        ax.errorbar(
            [row.x],
            [row.estimate],
            yerr=[[row.estimate - low], [high - row.estimate]],
            fmt=dataset_marker(row.dataset),
            color=colour,
            capsize=3,
        )
        for end, edge, arrow, offset in ((row.high, high_end, "^", 4), (row.low, low_end, "v", -10)):
            if (end > edge) if arrow == "^" else (end < edge):
                ax.plot([row.x], [edge], marker=arrow, color=colour, markersize=7, clip_on=False)
                ax.annotate(f"{end:+.0f}%", (row.x, edge), textcoords="offset points", xytext=(5, offset), fontsize=7)
        ax.annotate(row.display, (row.x, high), textcoords="offset points", xytext=(3, 3), fontsize=7)
    if limits is not None:
        ax.set_ylim(*limits)


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
    literature: pd.DataFrame, reference: pd.DataFrame, ours: pd.DataFrame, path: Path, ours_title: str
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
                _name_losses(ax, claims, "value", 5)
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
    handles = [
        _legend_entry(
            "o", SERIES_STYLE["claimed"][0], "claimed by the loss's paper (hollow: not read in its own paper)"
        ),
        _legend_entry("x", SERIES_STYLE["baseline"][0], "contrastive, as reported by papers"),
        _legend_entry("+", SERIES_STYLE["baseline"][0], "triplet, as reported by papers"),
        *[
            _legend_entry(*SERIES_STYLE["reference" if i == 0 else "thesis"][::-1], series)  # (marker, colour)
            for i, series in enumerate(dict.fromkeys(reference["series"]))
        ],
        _legend_entry("o", SERIES_STYLE["ours"][0], "our runs (95% t-interval)"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=7.5, frameon=False, bbox_to_anchor=(0.5, -0.06))
    fig.suptitle("What papers claimed, what they compared against, and what re-runs under one protocol measured", y=1.0)
    fig.tight_layout()
    return save_figure(fig, path)
