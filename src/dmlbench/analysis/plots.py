"""Seaborn figures for the report, one function per figure, each writing one PNG atomically.

Inputs are the long tables built by :mod:`dmlbench.analysis.report` with losses already
renamed to display names. Scores are fractions in [0, 1] and drawn in percent. Error bars
are 95% t-intervals over seeds (``scipy.stats.t``), never bootstrap; a cell with one run
has no bar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dmlbench.analysis.literature import DATASET_LABELS  # noqa: E402
from dmlbench.evaluate.intervals import t_interval  # noqa: E402
from dmlbench.io import atomic_path  # noqa: E402

METRIC_LABELS = {
    "precision_at_1": "P@1 (= R@1)",
    "recall_at_1": "R@1",
    "r_precision": "R-Precision",
    "map_at_r": "MAP@R",
}
SERIES_STYLE = {  # papers-vs-reality series: colour, marker
    "claimed": ("#c0392b", "o"),
    "baseline": ("#7f8c8d", "x"),
    "reference": ("#2471a3", "s"),
    "thesis": ("#1e8449", "D"),
    "ours": ("#111111", "o"),
}
DATASET_MARKERS = {"cub200": "o", "cars196": "s", "sop": "^", "inshop": "D"}


def metric_label(metric: str) -> str:
    if metric in METRIC_LABELS:
        return METRIC_LABELS[metric]
    if metric.startswith("recall_at_"):
        return "R@" + metric.removeprefix("recall_at_")
    return metric


def loss_palette(order: Sequence[str]) -> dict[str, tuple]:
    """One colour per loss, the same in every figure."""
    colours = sns.color_palette("tab10" if len(order) <= 10 else "husl", len(order))
    return dict(zip(order, colours, strict=True))


def _theme() -> None:
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.95)


def _t_errorbar(confidence: float):
    def interval(values: pd.Series) -> tuple[float, float]:
        result = t_interval(values.to_numpy(), confidence)
        if result.n < 2:
            return result.mean, result.mean
        return result.low, result.high

    return interval


def _interval_frame(data: pd.DataFrame, keys: list[str], value: str, confidence: float) -> pd.DataFrame:
    """mean, low, high, n of ``value`` per ``keys`` (t-interval; low = high = mean for n = 1)."""
    rows = []
    for key, group in data.groupby(keys, sort=False):
        interval = t_interval(group[value].dropna().to_numpy(), confidence)
        low, high = (interval.mean, interval.mean) if interval.n < 2 else (interval.low, interval.high)
        rows.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
                "mean": interval.mean,
                "low": low,
                "high": high,
                "n": interval.n,
            }
        )
    return pd.DataFrame(rows)


def save_figure(fig: plt.Figure, path: Path) -> Path:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png", metadata={"Software": None})
    plt.close(fig)
    return path


def _panel_label(frame: pd.DataFrame) -> pd.Series:
    """``dataset / backbone`` (the facet of most figures)."""
    return frame["dataset"].astype(str) + " / " + frame["backbone"].astype(str)


# --------------------------------------------------------------------------- results


def _metric_panels(runs: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """Rows of ``metrics`` with display labels, values in percent and a dataset/backbone panel."""
    return runs[runs["metric"].isin(metrics)].assign(
        metric=lambda d: d["metric"].map(metric_label), value=lambda d: 100 * d["value"], panel=_panel_label
    )


def _panel_titles(grid: sns.FacetGrid, data: pd.DataFrame) -> None:
    grid.set_titles("{col_name}" if data["panel"].nunique() == 1 else "{row_name}: {col_name}")


def metric_by_loss(
    runs: pd.DataFrame, metrics: list[str], path: Path, order: Sequence[str], confidence: float = 0.95
) -> Path:
    """Test metrics per loss (x, chronological) and embedding size (hue); panels: metric x dataset/backbone."""
    _theme()
    data = _metric_panels(runs, metrics)
    grid = sns.catplot(
        data=data,
        x="loss",
        y="value",
        hue="dim",
        col="metric",
        col_order=[metric_label(m) for m in metrics],
        row="panel" if data["panel"].nunique() > 1 else None,
        order=[o for o in order if o in set(data["loss"])],
        kind="point",
        errorbar=_t_errorbar(confidence),
        dodge=0.35 if data["dim"].nunique() > 1 else False,
        capsize=0.15,
        linestyle="none",
        sharey=False,
        height=3.4,
        aspect=1.2,
        palette="crest",
    )
    grid.set_axis_labels("", "test score (%)")
    _panel_titles(grid, data)
    for ax in grid.axes.flat:
        ax.tick_params(axis="x", rotation=30)
    grid.figure.suptitle(
        f"Test retrieval by loss (oldest left): seed mean and {int(confidence * 100)}% t-interval", y=1.03
    )
    return save_figure(grid.figure, path)


def recall_by_loss(runs: pd.DataFrame, path: Path, order: Sequence[str], confidence: float = 0.95) -> Path:
    """Recall@K per loss (x) and embedding size (hue): the thesis's Fig. 27/28 for every dataset/backbone."""
    _theme()
    recalls = sorted(
        {m for m in runs["metric"] if m.startswith("recall_at_")}, key=lambda m: int(m.removeprefix("recall_at_"))
    )
    data = _metric_panels(runs, recalls)
    grid = sns.catplot(
        data=data,
        x="loss",
        y="value",
        hue="dim",
        col="metric",
        col_order=[metric_label(m) for m in recalls],
        row="panel" if data["panel"].nunique() > 1 else None,
        order=[o for o in order if o in set(data["loss"])],
        kind="bar",
        errorbar=_t_errorbar(confidence),
        capsize=0.1,
        err_kws={"linewidth": 1.0},
        sharey=False,
        height=3.2,
        aspect=1.05,
        palette="crest",
    )
    grid.set_axis_labels("", "test Recall@K (%)")
    _panel_titles(grid, data)
    for ax in grid.axes.flat:
        ax.tick_params(axis="x", rotation=35)
    grid.figure.suptitle("Recall@K by loss and embedding size (thesis Fig. 27/28 style)", y=1.03)
    return save_figure(grid.figure, path)


def embedding_size(
    runs: pd.DataFrame, metrics: list[str], path: Path, order: Sequence[str], confidence: float = 0.95
) -> Path:
    """Test score against embedding size (log2 axis), one line per loss."""
    _theme()
    data = _metric_panels(runs, metrics)
    losses = [o for o in order if o in set(data["loss"])]
    grid = sns.relplot(
        data=data,
        x="dim",
        y="value",
        hue="loss",
        hue_order=losses,
        palette=loss_palette(losses),
        col="metric",
        col_order=[metric_label(m) for m in metrics],
        row="panel" if data["panel"].nunique() > 1 else None,
        kind="line",
        marker="o",
        errorbar=_t_errorbar(confidence),
        err_style="bars",
        err_kws={"capsize": 3},
        facet_kws={"sharey": False},
        height=3.4,
        aspect=1.2,
    )
    dims = sorted(data["dim"].unique())
    for ax in grid.axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.minorticks_off()
    grid.set_axis_labels("embedding size", "test score (%)")
    _panel_titles(grid, data)
    grid.figure.suptitle("Effect of the embedding size", y=1.03)
    return save_figure(grid.figure, path)


def backbones(
    runs: pd.DataFrame, metric: str, dim: int, path: Path, order: Sequence[str], confidence: float = 0.95
) -> Path:
    """One metric per loss with one bar per backbone, at one embedding size (thesis Fig. 31)."""
    _theme()
    data = runs[(runs["metric"] == metric) & (runs["dim"] == dim)].assign(value=lambda d: 100 * d["value"])
    grid = sns.catplot(
        data=data,
        x="loss",
        y="value",
        hue="backbone",
        col="dataset" if data["dataset"].nunique() > 1 else None,
        order=[o for o in order if o in set(data["loss"])],
        kind="bar",
        errorbar=_t_errorbar(confidence),
        capsize=0.1,
        err_kws={"linewidth": 1.0},
        height=3.6,
        aspect=1.6,
        palette="Set2",
    )
    grid.set_axis_labels("", f"test {metric_label(metric)} (%)")
    for ax in grid.axes.flat:
        ax.tick_params(axis="x", rotation=30)
    single = data["backbone"].nunique() == 1
    grid.figure.suptitle(
        f"Backbones compared at embedding size {dim}" + (" (this grid has only one backbone)" if single else ""), y=1.03
    )
    return save_figure(grid.figure, path)


# --------------------------------------------------------------------------- training


def convergence(
    history: pd.DataFrame, metric: str, dim: int, path: Path, order: Sequence[str], confidence: float = 0.95
) -> Path:
    """Validation ``metric`` against epoch and against cumulative training seconds (Proxy-Anchor Fig. 2).

    Lines are seed means, bands t-intervals; without a validation split the training loss is drawn.
    """
    _theme()
    data = history[history["dim"] == dim].assign(panel=_panel_label)
    column = f"val/{metric}"
    has_val = column in data.columns and data[column].notna().any()
    if has_val:
        data = data.dropna(subset=[column]).assign(value=lambda d: 100 * d[column])
        ylabel = f"validation {metric_label(metric)} (%)"
    else:
        data = data.assign(value=data["train/loss"])
        ylabel = "training loss (no validation split)"
    if "train/elapsed_seconds" in data.columns and data["train/elapsed_seconds"].notna().any():
        data = data.assign(seconds=data["train/elapsed_seconds"])
    elif "train/epoch_seconds" in data.columns:
        data = data.sort_values("epoch").assign(
            seconds=lambda d: d.groupby(["panel", "loss", "seed"])["train/epoch_seconds"].cumsum()
        )
    x_axes = [("epoch", "epoch")] + ([("seconds", "training time (s)")] if "seconds" in data.columns else [])
    panels = list(dict.fromkeys(data["panel"]))
    losses = [o for o in order if o in set(data["loss"])]
    palette = loss_palette(losses)
    fig, axes = plt.subplots(
        len(panels), len(x_axes), figsize=(5.2 * len(x_axes), 3.6 * len(panels)), squeeze=False, sharey="row"
    )
    for row, panel in enumerate(panels):
        block = data[data["panel"] == panel]
        stats = _interval_frame(block, ["loss", "epoch"], "value", confidence)
        if "seconds" in block.columns:
            seconds = block.groupby(["loss", "epoch"])["seconds"].mean().rename("seconds").reset_index()
            stats = stats.merge(seconds, on=["loss", "epoch"])
        for col, (x, xlabel) in enumerate(x_axes):
            ax = axes[row, col]
            for loss in losses:
                line = stats[stats["loss"] == loss].sort_values("epoch")
                ax.plot(line[x], line["mean"], marker="o", markersize=3, color=palette[loss], label=loss)
                ax.fill_between(line[x], line["low"], line["high"], color=palette[loss], alpha=0.18, linewidth=0)
            ax.set_xlabel(xlabel)
            if x == "epoch":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(ylabel if col == 0 else "")
            ax.set_title(f"{panel}, dim {dim}" + (" - against wall time" if x == "seconds" else ""))
    axes[0, -1].legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.suptitle("Convergence on the validation classes (what model selection reads)", y=1.01)
    fig.tight_layout()
    return save_figure(fig, path)


def test_feedback(bias: pd.DataFrame, path: Path, order: Sequence[str], confidence: float = 0.95) -> Path:
    """Best-on-test minus selected-on-validation score per run (percentage points), by loss and dim."""
    _theme()
    data = bias.assign(gain=100 * bias["bias"])
    losses = [o for o in order if o in set(data["loss"])]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(losses) + 2), 3.8))
    sns.stripplot(
        data=data,
        x="loss",
        y="gain",
        hue="dim",
        order=losses,
        dodge=True,
        alpha=0.45,
        palette="crest",
        ax=ax,
        legend=False,
        size=4,
    )
    sns.pointplot(
        data=data,
        x="loss",
        y="gain",
        hue="dim",
        order=losses,
        dodge=0.4 if data["dim"].nunique() > 1 else False,
        errorbar=_t_errorbar(confidence),
        capsize=0.12,
        linestyle="none",
        palette="crest",
        ax=ax,
        markers="D",
    )
    ax.axhline(0, color="black", linewidth=0.8)
    metric = metric_label(str(data["metric"].iloc[0]))
    ax.set_ylabel(f"test {metric}: best epoch - selected epoch (pp)")
    ax.set_xlabel("")
    ax.tick_params(axis="x", rotation=30)
    ax.set_title("What picking the epoch on the test set would have added (test-set feedback)")
    ax.legend(title="dim", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return save_figure(fig, path)


def cost(costs: pd.DataFrame, path: Path, order: Sequence[str]) -> Path:
    """Training seconds per run and training throughput (images/s) per loss and embedding size."""
    _theme()
    losses = [o for o in order if o in set(costs["loss"])]
    device = ", ".join(sorted(set(costs["device"].astype(str))))
    fig, axes = plt.subplots(1, 2, figsize=(max(9.0, 1.6 * len(losses) + 4), 3.8))
    for ax, column, label in (
        (axes[0], "train_seconds", f"training time per run (s, {device})"),
        (axes[1], "images_per_second", "training throughput (images/s)"),
    ):
        sns.barplot(
            data=costs,
            x="loss",
            y=column,
            hue="dim",
            order=losses,
            errorbar=("pi", 100),
            capsize=0.1,
            err_kws={"linewidth": 1.0},
            palette="crest",
            ax=ax,
        )
        ax.set_ylabel(label)
        ax.set_xlabel("")
        ax.tick_params(axis="x", rotation=30)
    axes[0].get_legend().remove()
    sns.move_legend(axes[1], "center left", bbox_to_anchor=(1.0, 0.5), title="dim", frameon=False)
    fig.suptitle("Cost per run: bars = mean over runs, whiskers = min to max", y=1.02)
    fig.tight_layout()
    return save_figure(fig, path)


# --------------------------------------------------------------------------- statistics


def critical_difference_diagram(
    ranks: pd.Series, pvalues: pd.DataFrame, cd: float, path: Path, alpha: float, title: str
) -> Path:
    """Demšar CD diagram (scikit-posthocs): mean ranks; bars join losses Nemenyi cannot separate."""
    import scikit_posthocs as sp

    _theme()
    sns.set_style("white")
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.32 * len(ranks)))
    sp.critical_difference_diagram(ranks, pvalues, alpha=alpha, ax=ax)  # CD value is in the title
    ax.set_title(title, fontsize=10, pad=28)
    return save_figure(fig, path)


BAYES_COLOURS = {"better": "#2471a3", "equivalent": "#bdc3c7", "worse": "#c0392b"}


def bayesian_comparison(table: pd.DataFrame, path: Path, rope: str) -> Path:
    """Stacked bars per (neighbour pair, experiment): P(A better) | P(equivalent) | P(B better).

    ``table``: the rows of :func:`dmlbench.analysis.bayesian.compare_neighbours` with a, b as
    display names; rows without a posterior are left out. ``rope``: its half-width, e.g. ``1 point``.
    Probabilities print as ``> 0.99`` rather than rounding to a certainty.
    """
    _theme()
    rows = table.dropna(subset=["better"]).reset_index(drop=True)
    labels = [f"{r.a} vs {r.b}\n{r.experiment} (n={int(r.n)})" for r in rows.itertuples()]
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.55 * len(rows)))
    left = np.zeros(len(rows))
    names = {
        "better": "A practically better",
        "equivalent": f"equivalent (ROPE ± {rope})",
        "worse": "B practically better",
    }
    for part in ("better", "equivalent", "worse"):
        values = rows[part].to_numpy(dtype=float)
        ax.barh(labels, values, left=left, color=BAYES_COLOURS[part], label=names[part], edgecolor="white")
        for y, (x0, v) in enumerate(zip(left, values, strict=True)):
            if v >= 0.12:
                ax.text(x0 + v / 2, y, "> 0.99" if v >= 0.995 else f"{v:.2f}", ha="center", va="center", fontsize=8)
        left += values
    ax.axvline(0.95, color="#555555", linewidth=0.8, linestyle=":")
    ax.axvline(0.05, color="#555555", linewidth=0.8, linestyle=":")
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("posterior probability (A = better-ranked loss of the pair)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8, frameon=False)
    ax.grid(axis="y", visible=False)
    return save_figure(fig, path)


def win_rate_heatmap(rates: pd.DataFrame, order: Sequence[str], path: Path, confidence: float = 0.95) -> Path:
    """How often the row loss beats the column loss, with the Wilson interval in each cell."""
    _theme()
    losses = [o for o in order if o in set(rates["loss"])]
    matrix = rates.pivot(index="loss", columns="opponent", values="rate").reindex(index=losses, columns=losses)
    labels = matrix.copy().astype(object)
    for row in rates.itertuples():
        text = "n/a" if np.isnan(row.rate) else f"{row.rate:.2f}\n[{row.low:.2f}, {row.high:.2f}]\nn={row.n}"
        labels.loc[row.loss, row.opponent] = text
    for loss in losses:
        labels.loc[loss, loss] = ""
    size = 1.2 * len(losses) + 2
    sns.set_style("white")
    fig, ax = plt.subplots(figsize=(size + 1, size * 0.8))
    sns.heatmap(
        100 * matrix.astype(float),
        annot=labels.to_numpy(),
        fmt="",
        cmap="RdBu",
        center=50,
        vmin=0,
        vmax=100,
        cbar_kws={"label": "row beats column (% of blocks)"},
        annot_kws={"fontsize": 8},
        linewidths=0.5,
        ax=ax,
    )
    ax.set_xlabel("opponent")
    ax.set_ylabel("")
    ax.set_title(f"Win rates with {int(confidence * 100)}% Wilson intervals (ties left out)")
    return save_figure(fig, path)


# --------------------------------------------------------------------------- papers vs reality


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
    _theme()
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
    _theme()
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
