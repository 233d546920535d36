"""The report is a loop over registered sections: each section module is registered once, the
contents line links every heading by GitHub's anchor, and a new section is one module + one line."""

from __future__ import annotations

import importlib
import pkgutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dmlbench.analysis import sections
from dmlbench.analysis.report import render
from dmlbench.analysis.sections.base import Section
from dmlbench.analysis.statistics import RatioInterval
from dmlbench.analysis.text import slug
from dmlbench.evaluate.intervals import t_interval


def test_every_section_module_is_registered_once_in_reading_order():
    modules = [m.name for m in pkgutil.iter_modules(sections.__path__) if m.name != "base"]
    declared = [importlib.import_module(f"dmlbench.analysis.sections.{m}").SECTION for m in modules]
    assert sorted(declared, key=lambda s: s.title) == sorted(sections.SECTIONS, key=lambda s: s.title)
    assert len({s.title for s in sections.SECTIONS}) == len(sections.SECTIONS) == len(modules) == 14
    assert [s.title for s in sections.SECTIONS][:4] == ["Summary", "Setup", "Tuning", "Results on the test classes"]
    assert sections.SECTIONS[-1].title == "Limitations"


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("Results on the test classes", "results-on-the-test-classes"),
        ("Test-set feedback", "test-set-feedback"),
        ("Papers versus reality", "papers-versus-reality"),
        ("Cross-validation: the fold models", "cross-validation-the-fold-models"),
        ("P@1 = R@1 (%)", "p1--r1-"),
    ],
)
def test_slug_is_githubs_heading_anchor(heading, anchor):
    assert slug(heading) == anchor


def test_a_new_section_is_one_registry_entry_with_its_figure_numbered_in_place(small_params, tmp_path, monkeypatch):
    def first(analysis, doc):
        doc.add("first body", "")
        doc.figure("one", lambda p: p.write_bytes(b"png") and p, "The first figure.")

    def extra(analysis, doc):
        doc.note("nothing to draw here")
        doc.figure("two", lambda p: p.write_bytes(b"png") and p, "The second figure.")

    registered = (Section("First part", "First", first), Section("An extra section", "Extra", extra))
    monkeypatch.setattr("dmlbench.analysis.report.SECTIONS", registered)
    text = render(SimpleNamespace(params=small_params), tmp_path)
    assert "**Contents:** [First](#first-part) · [Extra](#an-extra-section)" in text
    body = text[text.index("## First part") :]
    assert (
        body.splitlines()
        == [
            "## First part",
            "",
            "first body",
            "",
            "![one](figures/one.png)",
            "",
            "*Figure 1. The first figure.*",
            "",
            "## An extra section",
            "",
            "> nothing to draw here",
            "",
            "![two](figures/two.png)",
            "",
            "*Figure 2. The second figure.*",
            "",
        ][:-1]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.png", "two.png"]


def test_feedback_figure_does_not_depend_on_the_global_random_state(tmp_path):
    """Seaborn's strip plot jitters with numpy's global RNG; the figure is the same whatever ran before."""
    from dmlbench.analysis.plots.feedback import test_feedback as draw

    rng = np.random.default_rng(3)
    bias = pd.DataFrame(
        {
            "loss": np.repeat(["Contrastive", "Triplet"], 6),
            "dim": np.tile([16, 32], 6),
            "bias": rng.uniform(0, 0.05, 12),
            "metric": "map_at_r",
        }
    )
    np.random.seed(1)
    first = draw(bias, tmp_path / "a.png", ["Contrastive", "Triplet"]).read_bytes()
    np.random.seed(2)
    np.random.uniform(size=17)
    before = np.random.get_state()[1].copy()
    second = draw(bias, tmp_path / "b.png", ["Contrastive", "Triplet"]).read_bytes()
    assert first == second
    assert (np.random.get_state()[1] == before).all()  # the caller's RNG state is put back


def test_figures_draw_the_mean_where_there_is_no_interval():
    one = t_interval([0.4])
    assert one.bounds_or_mean() == (0.4, 0.4)
    three = t_interval([0.4, 0.5, 0.6])
    assert three.bounds_or_mean() == (three.low, three.high) and three.low < 0.5 < three.high
    assert RatioInterval(0.2, float("nan"), float("nan"), 1, 3).bounds_or_estimate() == (0.2, 0.2)
    assert RatioInterval(0.2, 0.1, 0.3, 3, 3).bounds_or_estimate() == (0.1, 0.3)


def test_cost_intervals_are_over_seeds_with_embedding_sizes_averaged_within_each(tmp_path, monkeypatch):
    """Two embedding sizes are two cells, not repeats: seed s's value is the mean of its 32-d and 64-d
    runs. Seconds (32, 64) per seed: (10, 14), (12, 16), (11, 15) -> 12, 14, 13: mean 13, sd 1,
    13 -/+ t(0.975, 2) / sqrt(3) = [10.5, 15.5] with n = 3 seeds (pooled as 6 runs: [10.7, 15.3], n = 6)."""
    from dmlbench.analysis.sections import cost
    from dmlbench.analysis.sections.base import Document

    monkeypatch.setattr(cost.plots, "cost", lambda costs, path, order: path)  # the figure is not what is tested
    seconds = {(0, 32): 10.0, (0, 64): 14.0, (1, 32): 12.0, (1, 64): 16.0, (2, 32): 11.0, (2, 64): 15.0}
    costs = pd.DataFrame(
        [
            {"dataset": "glyphs", "backbone": "tiny", "loss": "Triplet", "dim": dim, "seed": seed,
             "train_seconds": value, "images_per_second": 1000.0 + value, "epochs": 3, "device": "cpu"}
            for (seed, dim), value in seconds.items()
        ]
    )  # fmt: skip
    analysis = SimpleNamespace(
        results=SimpleNamespace(timings=True, selections=pd.DataFrame(columns=["dataset"])),
        costs=costs,
        display=lambda frame: frame,
        order=["Triplet"],
        params=SimpleNamespace(evaluate=SimpleNamespace(confidence=0.95)),
    )
    doc = Document(tmp_path)
    cost.write(analysis, doc)
    text = doc.text()
    assert "mean over n = 3 seeds per loss [95% t-interval over seeds, clipped at 0]" in text
    assert "each seed's value is the mean of its 2 runs (2 embedding sizes)" in text
    assert "| Triplet | 13.0 [10.5, 15.5] | 1013 [1011, 1015] |" in text
