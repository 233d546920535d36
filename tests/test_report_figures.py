"""Report figures that must stay readable: tick labels that never overlap, a colour bar on the
cells' scale, and papers-vs-reality points that our wide demo intervals do not flatten."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from dmlbench.analysis.plots import cost as cost_plots
from dmlbench.analysis.plots import embedding_size as size_plots
from dmlbench.analysis.plots import feedback as feedback_plots
from dmlbench.analysis.plots import papers as paper_plots
from dmlbench.analysis.plots import results as result_plots
from dmlbench.analysis.plots import statistical_tests as test_plots
from dmlbench.analysis.plots.style import labels_overlap

LONG_NAMES = [  # ten losses with long display names, the most a report grid is expected to hold
    "Contrastive (Hadsell et al. 2006)",
    "Triplet with semi-hard mining",
    "Lifted Structure (thesis code)",
    "Multi-Similarity (+miner)",
    "Multi-Similarity without miner",
    "Proxy-NCA with scaled softmax",
    "Margin with learnable beta per class",
    "ArcFace additive angular margin",
    "SoftTriple with ten centres",
    "Proxy-Anchor (Kim et al. 2020)",
]


def _runs(metrics: list[str]) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [
        {"dataset": "glyphs", "backbone": "tiny_cnn", "loss": loss, "dim": dim, "seed": seed, "metric": m, "value": v}
        for loss in LONG_NAMES
        for dim in (32, 64)
        for seed in range(3)
        for m, v in zip(metrics, rng.uniform(0.2, 0.8, len(metrics)), strict=True)
    ]
    return pd.DataFrame(rows)


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plotting functions hand to ``save_figure`` (still drawn to disk)."""
    figures: list[plt.Figure] = []
    for module in (result_plots, size_plots, feedback_plots, cost_plots):
        original = module.save_figure

        def spy(fig, path, original=original):
            figures.append(fig)
            return original(fig, path)

        monkeypatch.setattr(module, "save_figure", spy)
    return figures


def _assert_no_overlap(fig: plt.Figure) -> None:
    renderer = FigureCanvasAgg(fig).get_renderer()  # save_figure closed it: a fresh canvas, same layout
    axes = [ax for ax in fig.axes if any(t.get_visible() and t.get_text() for t in ax.get_xticklabels())]
    assert axes
    for ax in axes:
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        assert len(labels) == len(LONG_NAMES)
        assert not labels_overlap(labels, renderer, pad=0.0), [t.get_text() for t in labels]


def test_loss_tick_labels_never_overlap_with_ten_long_names(tmp_path, drawn):
    metrics = ["map_at_r", "r_precision", "precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4"]
    runs = _runs(metrics)
    result_plots.metric_by_loss(runs, ["map_at_r", "r_precision", "precision_at_1"], tmp_path / "m.png", LONG_NAMES)
    result_plots.recall_by_loss(runs, tmp_path / "r.png", LONG_NAMES)
    size_plots.backbones(runs, "precision_at_1", 64, tmp_path / "b.png", LONG_NAMES)
    bias = pd.DataFrame(
        {"loss": np.repeat(LONG_NAMES, 4), "dim": np.tile([32, 64], 20), "bias": 0.01, "metric": "map_at_r"}
    )
    feedback_plots.test_feedback(bias, tmp_path / "f.png", LONG_NAMES)
    costs = bias.assign(train_seconds=10.0, images_per_second=900.0, device="cpu")
    cost_plots.cost(costs, tmp_path / "c.png", LONG_NAMES)
    assert len(drawn) == 5
    for fig in drawn:
        _assert_no_overlap(fig)


def test_overlap_check_sees_overlapping_labels():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xticks(range(10), LONG_NAMES)  # ten long names side by side on a 3-inch axis
    assert labels_overlap(ax.get_xticklabels(), fig.canvas.get_renderer())
    plt.close(fig)


def test_win_rate_colour_bar_is_on_the_cells_scale(tmp_path, monkeypatch):
    captured = {}
    original = test_plots.save_figure
    monkeypatch.setattr(
        test_plots, "save_figure", lambda fig, path: captured.setdefault("fig", fig) and original(fig, path)
    )
    rates = pd.DataFrame(
        [
            {"loss": a, "opponent": b, "rate": r, "low": max(r - 0.3, 0), "high": min(r + 0.3, 1), "n": 4}
            for a, b, r in (("A", "B", 0.75), ("B", "A", 0.25))
        ]
    )
    test_plots.win_rate_heatmap(rates, ["A", "B"], tmp_path / "w.png")
    fig = captured["fig"]
    colour_bar = fig.axes[-1]  # seaborn adds the colour bar's axes last
    assert colour_bar.get_ylim() == (0.0, 1.0)
    assert "fraction" in colour_bar.get_ylabel()
    cells = [t.get_text() for t in fig.axes[0].texts if t.get_text()]
    assert cells[0].startswith("0.75\n[0.45, 1.00]") or cells[0].startswith("0.25")


def _claims() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"loss": "margin", "display": "Margin", "year": 2017, "dataset": d, "improvement": v, "uncertain": u}
            for d, v, u in (("cub200", 140.0, False), ("cars196", 260.0, True))
        ]
    )


def _reference() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"series": s, "loss": "margin", "year": 2017, "dataset": d, "improvement": v}
            for s, d, v in (("RC", "cub200", -6.0), ("RC", "cars196", 3.0), ("Thesis", "sop", 9.0))
        ]
    )


def _ours(dataset: str) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "loss": "margin",
                "display": "Margin",
                "year": 2017,
                "dataset": dataset,
                "estimate": 40,
                "low": -60,
                "high": 160,
            }
        ]
    )


def _legend_titles(fig: plt.Figure) -> list[str]:
    return [legend.get_title().get_text() for legend in fig.legends]


def test_papers_vs_reality_gives_demo_runs_their_own_row():
    """Demo runs (a dataset no paper reports on) get row (c): the re-runs' axis stays theirs."""
    claims, reference = {"contrastive": _claims()}, {"contrastive": _reference()}
    fig = paper_plots.papers_vs_reality_figure(claims, reference, {"contrastive": _ours("glyphs")}, "our runs")
    axes = np.array(fig.axes[:3])
    assert [ax.get_title().split(" ", 1)[0] for ax in axes] == ["(a)", "(b)", "(c)"]
    low, high = axes[1].get_ylim()
    assert -20 < low < -6 and 9 < high < 20  # set by the re-runs (-6 to +9), not by our -60 to +160
    low, high = axes[2].get_ylim()
    assert low <= -60 and high >= 160
    assert _legend_titles(fig) == ["marker = dataset", "colour = source of the number"]
    markers = [t.get_text() for t in fig.legends[0].get_texts()]
    assert markers == ["CUB200", "Cars196", "SOP", "glyphs", "hollow: not read in its own paper"]
    plt.close(fig)


def test_papers_vs_reality_cuts_our_whisker_on_a_published_dataset():
    claims, reference = {"contrastive": _claims()}, {"contrastive": _reference()}
    fig = paper_plots.papers_vs_reality_figure(claims, reference, {"contrastive": _ours("cub200")}, "our runs")
    assert len(fig.axes) == 2
    low, high = fig.axes[1].get_ylim()
    assert low > -60 and 40 < high < 160  # our mean (+40) is on the axis, its whisker ends are not
    printed = {t.get_text() for t in fig.axes[1].texts}
    assert {"+160%", "-60%"} <= printed  # the cut whiskers' ends are printed at the edges
    plt.close(fig)


def test_papers_vs_reality_marks_claims_set_against_borrowed_baselines():
    """A † beside each claim in (a) whose baseline is other papers' median, and a legend entry for it."""
    claims = _claims().assign(borrowed=[True, False])
    fig = paper_plots.papers_vs_reality_figure(
        {"contrastive": claims}, {"contrastive": _reference()}, {"contrastive": _ours("cub200")}, "our runs"
    )
    daggers = [t for t in fig.axes[0].texts if t.get_text() == paper_plots.BORROWED]
    assert len(daggers) == 1 and daggers[0].xy[1] == 140.0
    assert [t.get_text() for t in fig.legends[0].get_texts()][-1] == "baseline from other papers"
    plt.close(fig)
    fig = paper_plots.papers_vs_reality_figure(
        {"contrastive": claims.assign(borrowed=False)}, {"contrastive": _reference()}, {}, "our runs"
    )
    assert not [t for t in fig.axes[0].texts if t.get_text() == paper_plots.BORROWED]
    assert "baseline from other papers" not in [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close(fig)


def test_one_marker_per_dataset_in_every_papers_panel():
    assert paper_plots.dataset_marker("cub200") == "o" and paper_plots.dataset_marker("sop") == "^"
    assert paper_plots.dataset_marker("glyphs") == paper_plots.OTHER_DATASET_MARKER
    assert paper_plots.OTHER_DATASET_MARKER not in paper_plots.DATASET_MARKERS.values()


CD_SCRIPT = """
import sys
from pathlib import Path
import numpy as np, pandas as pd
from dmlbench.analysis.plots.statistical_tests import critical_difference_diagram
names = ["contrastive", "triplet", "multi_similarity", "proxy_anchor", "arcface", "circle", "ntxent"]
ranks = pd.Series([2.0, 2.4, 3.1, 3.5, 4.4, 5.0, 5.6], index=names)
apart = np.abs(ranks.to_numpy()[:, None] - ranks.to_numpy()[None, :]) > 1.6  # overlapping cliques
pvalues = pd.DataFrame(np.where(apart, 0.01, 1.0), index=names, columns=names)
critical_difference_diagram(ranks, pvalues, 1.6, Path(sys.argv[1]), 0.05, "CD")
"""


def test_the_critical_difference_diagram_is_the_same_file_in_every_process(tmp_path):
    """scikit-posthocs draws the crossbars by iterating sets of the loss names; str hashes are salted
    per process (PYTHONHASHSEED), so without stable labels two renders of one result differ."""
    import os
    import subprocess
    import sys

    written = []
    for seed in ("1", "2", "3"):
        out = tmp_path / f"cd{seed}.png"
        env = {**os.environ, "PYTHONHASHSEED": seed, "MPLBACKEND": "Agg"}
        subprocess.run([sys.executable, "-c", CD_SCRIPT, str(out)], env=env, check=True)
        written.append(out.read_bytes())
    assert written[0] == written[1] == written[2]
