"""The report stage on a small synthetic results table: every section, figure, interval, and the MLflow run."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
from helpers.report_fakes import fake_outputs

from dmlbench import paths
from dmlbench.analysis.report import report_stage
from dmlbench.analysis.sections.results import table_metrics
from dmlbench.analysis.text import format_interval, format_signed_interval
from dmlbench.errors import DataError
from dmlbench.grid import Combo
from dmlbench.io import read_json
from dmlbench.tracking.report_run import log_report

PNG = b"\x89PNG\r\n\x1a\n"
SECTIONS = [
    "## Summary",
    "## Setup",
    "### Datasets",
    "### Grid and protocol",
    "### Software",
    "## Results on the test classes",
    "## Tournament of losses",
    "## Statistical tests",
    "## Papers versus reality",
    "## Embedding size and backbone",
    "## Convergence",
    "## Test-set feedback",
    "## Cost",
    "## Retrieval examples",
    "## Limitations",
]
FIGURES = [  # the demo grid's: 1 dataset, too few independent blocks for the Friedman and sign tests
    "metric_by_loss",
    "recall_by_loss",
    "bayesian_comparison",
    "papers_vs_reality",
    "papers_claims",
    "embedding_size",
    "convergence",
    "test_feedback",
    "cost",
    "gallery",
]


def _section(text: str, heading: str) -> str:
    return text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]


def _params(raw: dict, dims: list[int] | None = None, **report):
    """``raw`` params with other dims or ``report`` settings."""
    from dmlbench.params.load import parse_params

    raw = copy.deepcopy(raw)
    raw["report"].update(report)
    if dims is not None:
        raw["dims"] = dims
    return parse_params(raw)


def _probability(cell: str) -> float:
    """A probability cell of the Bayesian table: ``> 0.99``, ``< 0.01`` or two decimals."""
    return {"> 0.99": 0.995, "< 0.01": 0.005}.get(cell) or float(cell)


def _table_rows(text: str, first_cell: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith(f"| {first_cell}")
    ]


def test_report_has_every_section_figure_and_interval(in_project, small_params, prepared_glyphs, mlflow_store):
    fake_outputs(small_params, prepared_glyphs)
    path = report_stage(small_params)
    text = path.read_text()
    positions = [text.index(heading + "\n") for heading in SECTIONS]
    assert positions == sorted(positions)
    for heading in SECTIONS:
        assert _section(text, heading).strip(), f"{heading} is empty"
    # Every results cell carries a mean and its 95% interval inside [0, 100]; n (the same for every cell) once above.
    table = _section(text, "## Results on the test classes").split("![")[0]
    cells = [
        c.strip()
        for line in table.splitlines()
        if line.startswith("| ") and "---" not in line and not line.startswith("| loss")
        for c in line.split("|")[3:-1]
    ]
    assert len(cells) == len(small_params.combos()) * 6
    assert (
        "Every trained cell: mean over n = 3 seeds [95% t-interval over seeds, clipped to the metric's range]." in table
    )
    bounds = [re.fullmatch(r"(\d+\.\d) \[(\d+\.\d), (\d+\.\d)\]", c) for c in cells]
    assert all(bounds), cells[:3]
    assert all(0 <= float(m[2]) <= float(m[1]) <= float(m[3]) <= 100 for m in bounds)
    # The tournament puts the best loss first.
    tournament = _section(text, "## Tournament of losses")
    ranked = [line.split("|")[1].strip() for line in tournament.splitlines() if line.startswith("| ")][2:]
    assert ranked == ["Multi-Similarity (+miner)", "Proxy-Anchor", "Contrastive", "Triplet"]
    # 1 dataset (1 backbone x 2 dims = 2 experiments): no Friedman test, and the report says why
    tests = _section(text, "## Statistical tests")
    why = (
        "they need at least 2 independent blocks, and the independent unit is the dataset (Demšar 2006): "
        "backbones and embedding sizes on one dataset share its training and test images, so they are repeated "
        "measures of one block; this grid has 1 dataset (2 experiments: 1 backbone x 2 embedding sizes), so only "
        "the per-experiment tests over seeds apply; add datasets"
    )
    assert f"> Friedman and Nemenyi tests not run: {why}." in tests and "chi2(" not in tests
    summary = _section(text, "## Summary")
    assert f"- **Friedman and Nemenyi tests not run:** {why}." in summary
    # the demo's limits where its numbers are summarised; every fake run selected epoch 3 (>= the protocol's last)
    assert summary.startswith("\n- **Demo data:** these numbers come from the offline demo (`glyphs`")
    runs, last = len(small_params.runs()), small_params.protocol.epochs
    assert f"- **Still improving:** {runs} of {runs} models picked their last epoch ({last})" in summary
    # the first loss is not separated from the others by any test that ran: no winner
    assert "- **Tournament:** Multi-Similarity (+miner) ranks first over 2 experiments" in summary
    assert "no test separates it from Proxy-Anchor, Contrastive and Triplet" in summary
    assert "Tournament winner" not in summary
    assert "Blocks: the datasets, the independent unit of Demšar (2006)" in tests
    # no win rates over 1 dataset: the sign test counts independent blocks
    assert (
        "### Win rates\n\nNot run: win rates and their Holm-adjusted sign tests are pairwise comparisons after" in tests
    )
    assert "Holm p (m =" not in tests  # no table of Holm-adjusted sign tests
    # the tournament's interval is over datasets: 1 here, so none
    tournament_text = _section(text, "## Tournament of losses")
    assert "mean rank over datasets [95% CI] (n = 1)" in tournament_text
    assert "| Multi-Similarity (+miner) | 2 | 1.00 | 0.00 | 2 | - |" in tournament_text
    # Papers vs reality: the literature table and our relative improvements with intervals
    papers = _section(text, "## Papers versus reality")
    assert "| Proxy-Anchor | CUB200 | 68.4? (bn_inception-512); 69.1 (bn_inception-512)" in papers
    assert re.search(r"\| Triplet \| glyphs/tiny_cnn/64 \| contrastive \| -\d+\.\d% \[-\d+\.\d, -\d+\.\d\] \|", papers)
    # Test-set feedback: the best test epoch beats the selected one by 3 points of MAP@R in every run
    feedback = _section(text, "## Test-set feedback")
    # n counts seeds: each seed's value averages its 2 runs (2 embedding sizes; no folds here)
    assert (
        "mean over n = 3 seeds [95% t-interval over seeds, clipped to the range] unless a cell states its own n; "
        "each seed's value is the mean of its 2 models (2 embedding sizes)" in feedback
    )
    assert (
        "(95% t-interval over n = 3 seeds, clipped at 0; each seed's value is the mean of its 8 models over every "
        "loss and embedding size)" in summary
    )
    assert "| 3.0 [3.0, 3.0] |" in feedback  # every run gains exactly 3 points: a zero-width interval
    for figure in FIGURES:
        assert f"(figures/{figure}.png)" in text, figure
        assert (in_project / "reports" / "figures" / f"{figure}.png").read_bytes()[:8] == PNG
    assert sorted(p.stem for p in (in_project / "reports" / "figures").iterdir()) == sorted(FIGURES)
    captions = re.findall(r"^\*Figure (\d+)\. (.+)\*$", text, flags=re.M)
    assert [int(n) for n, _ in captions] == list(range(1, len(FIGURES) + 1))
    assert "offline demo dataset" in text and "no 512-d embedding" in text
    # where each loss's hyperparameters come from (the demo protocol sets Proxy-Anchor's proxy lr)
    setup = _section(text, "## Setup")
    n = len(small_params.combos()) * len(small_params.seeds)
    precision = f"- Training arithmetic (protocol `amp: auto`; per model in `run.json`): float32: {n} models (cpu)."
    assert precision in setup
    assert "  - Proxy-Anchor: param_lr_multiplier 10 (from protocol `demo`);" in setup
    assert (
        "  - Contrastive, Triplet, Multi-Similarity (+miner): the defaults (protocol `demo` publishes no values "
        "for them)." in setup
    )


def test_report_run_in_mlflow_is_logged_once_per_content(in_project, small_params, prepared_glyphs, mlflow_store):
    import mlflow

    fake_outputs(small_params, prepared_glyphs)
    report_stage(small_params)
    report_stage(small_params)  # same content (the figures are byte-identical): no new run

    def report_runs(view="active_only"):
        mlflow.set_tracking_uri(mlflow_store)
        return mlflow.search_runs(
            search_all_experiments=True,
            filter_string="tags.kind = 'report'",
            run_view_type={"active_only": 1, "all": 3}[view],
        )

    runs = report_runs()
    assert len(runs) == 1 and runs["status"].iloc[0] == "FINISHED"
    assert runs["metrics.mean_rank/multi_similarity"].iloc[0] == 1.0
    first = runs["run_id"].iloc[0]
    client = mlflow.tracking.MlflowClient(mlflow_store)
    artifacts = {f.path for f in client.list_artifacts(first, "report")}
    assert "report/report.md" in artifacts and "report/figures" in artifacts
    assert len(client.list_artifacts(first, "report/figures")) == len(FIGURES)

    # new content for the same grid (e.g. a result changed): a new run supersedes the old one
    report = in_project / "reports" / "report.md"
    report.write_text(report.read_text() + "\nchanged\n")
    log_report(small_params, report, in_project / "reports" / "figures", {"mean_rank/triplet": 4.0})
    active = report_runs()
    assert len(active) == 1 and active["run_id"].iloc[0] != first
    deleted = client.get_run(first)
    assert deleted.info.lifecycle_stage == "deleted"
    assert deleted.data.tags["superseded_by"] == active["run_id"].iloc[0]


def test_report_without_test_feedback_omits_that_figure_with_a_note(
    in_project, small_params, prepared_glyphs, mlflow_store
):
    fake_outputs(small_params, prepared_glyphs, with_feedback=False)
    text = report_stage(small_params, log_to_mlflow=False).read_text()
    feedback = _section(text, "## Test-set feedback")
    assert "Not measured for this grid" in feedback and "![" not in feedback
    assert not (in_project / "reports" / "figures" / "test_feedback.png").exists()
    assert "Test-set feedback was not recorded" in text


def test_report_shows_the_untrained_baseline_with_its_bootstrap_interval(
    in_project, small_params, prepared_glyphs, mlflow_store
):
    from dmlbench.evaluate.embed import embed_pretrained_stage
    from dmlbench.evaluate.stage import evaluate_pretrained_stage

    fake_outputs(small_params, prepared_glyphs)
    text = report_stage(small_params, log_to_mlflow=False).read_text()
    assert "*Pretrained*" not in text  # no baseline evaluated: no row, no note
    embed_pretrained_stage(small_params, "glyphs", "tiny_cnn", device="cpu")
    summary = evaluate_pretrained_stage(small_params, "glyphs", "tiny_cnn")
    text = report_stage(small_params, log_to_mlflow=False).read_text()
    table = _section(text, "## Results on the test classes").split("![")[0]
    row = next(line for line in table.splitlines() if line.startswith("| *Pretrained*"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    p1 = summary["test"]["precision_at_1"]
    # n (test classes, the unit the bootstrap resamples, the same for every metric) stated once, in the row's label
    label = f"n = {p1['n']} test classes; {p1['queries']:,} queries"
    assert cells[0] == f"*Pretrained* (random initialisation (torch seed 0), no training; {label})"
    assert int(cells[1]) == read_json(paths.pretrained_embedding_dir("glyphs", "tiny_cnn") / "meta.json")["dim"]
    assert cells[2] == f"{100 * p1['mean']:.1f} [{100 * p1['low']:.1f}, {100 * p1['high']:.1f}]"
    test_split = prepared_glyphs[1].split("test")
    assert (p1["n"], p1["queries"]) == (len(np.unique(test_split.labels)), len(test_split))  # classes, queries
    assert p1["low"] <= p1["mean"] <= p1["high"]
    assert all(re.fullmatch(r"\d+\.\d \[\d+\.\d, \d+\.\d\]", c) for c in cells[2:]), cells
    assert "bootstrap interval over the test classes (each drawn with all its queries" in table


def test_results_columns_follow_the_metrics_of_each_dataset():
    sop = [
        "map_at_r",
        "recall_at_1000",
        "recall_at_10",
        "precision_at_1",
        "recall_at_1",
        "recall_at_100",
        "r_precision",
    ]
    assert table_metrics(sop) == [
        "precision_at_1",
        "recall_at_10",
        "recall_at_100",
        "recall_at_1000",
        "r_precision",
        "map_at_r",
    ]
    cub = ["ami", "nmi", "recall_at_8", "recall_at_2", "map_at_r", "recall_at_4", "r_precision", "precision_at_1"]
    assert table_metrics(cub) == [
        "precision_at_1",
        "recall_at_2",
        "recall_at_4",
        "recall_at_8",
        "r_precision",
        "map_at_r",
        "nmi",
        "ami",
    ]


def test_format_interval():
    assert format_interval(0.621, 0.603, 0.639, 3) == "62.1 [60.3, 63.9] (n=3)"
    assert format_interval(0.621, 0.603, 0.639, 3, show_n=False) == "62.1 [60.3, 63.9]"
    assert format_interval(0.5, float("nan"), float("nan"), 1) == "50.0 (n=1, no interval)"
    assert format_interval(2.5, 1.0, 4.0, 4, scale=1, digits=2) == "2.50 [1.00, 4.00] (n=4)"
    # zero spread: no zero-width interval (the tournament's "1.00 [1.00, 1.00]" from two experiments)
    assert format_interval(1.0, 1.0, 1.0, 2, scale=1, digits=2, show_n=False) == "1.00 (all n=2 equal, no interval)"
    assert format_signed_interval(0.123, 0.04, 0.211, "n=3 vs 3") == "+12.3% [+4.0, +21.1] (n=3 vs 3)"


def test_report_fails_naming_the_missing_output(in_project, small_params):
    with pytest.raises(DataError, match=r"runs.json: missing \(run evaluate@glyphs-tiny_cnn-contrastive-32 first\)"):
        report_stage(small_params)


def test_gallery_neighbours_query_gallery_split_and_crop_to_sizes(tmp_path, monkeypatch):
    """Query/gallery embeddings: the nearest gallery rows, right/wrong flags, and images cropped to their sizes."""
    from types import SimpleNamespace

    from dmlbench.analysis import gallery

    classes = 5
    query_labels = np.arange(classes)
    gallery_labels = np.repeat(np.arange(classes), 3)
    basis = np.eye(8)[:classes]
    query = basis[query_labels]
    # per class c: two images near its query, and one that is exactly the query of class c - 1 (a wrong match)
    gallery_vectors = np.concatenate(
        [
            [basis[c] + 0.2 * np.eye(8)[7], basis[c] + 0.25 * np.eye(8)[7], basis[(c - 1) % classes]]
            for c in range(classes)
        ]
    )
    arrays = {
        "query_embeddings": query.astype(np.float32),
        "query_labels": query_labels,
        "gallery_embeddings": gallery_vectors.astype(np.float32),
        "gallery_labels": gallery_labels,
    }
    assert gallery.query_splits(arrays) == ("query", "gallery")
    found, correct = gallery.neighbours(arrays, np.array([0, 3]), k=3)
    # the nearest image to query c is row 3 * (c + 1) + 2 (class c + 1's third image): wrong; then c's own two
    assert found[0].tolist() == [5, 0, 1] and correct[0].tolist() == [False, True, True]
    assert found[1, 0] == 14 and not correct[1, 0]

    chosen = gallery.choose_queries(gallery_labels, 4, seed=0)
    assert len(set(gallery_labels[chosen])) == 4
    assert np.array_equal(chosen, gallery.choose_queries(gallery_labels, 4, seed=0))

    sizes = {"query": np.full((classes, 2), 10), "gallery": np.tile([12, 7], (len(gallery_labels), 1))}
    images = {"query": np.zeros((classes, 16, 16, 3), np.uint8), "gallery": np.zeros((15, 16, 16, 3), np.uint8)}
    labels = {"query": query_labels, "gallery": gallery_labels}
    prepared = SimpleNamespace(
        split=lambda name: SimpleNamespace(images=images[name], labels=labels[name], sizes=sizes[name])
    )
    npz = tmp_path / "embeddings.npz"
    np.savez(npz, **arrays)
    shapes, frames = [], []
    original = gallery._tile

    def spy(ax, image, colour, title):
        shapes.append(image.shape[:2])
        frames.append(colour)
        original(ax, image, colour, title)

    monkeypatch.setattr(gallery, "_tile", spy)
    out = gallery.retrieval_gallery([gallery.GalleryRun("a", npz)], prepared, tmp_path / "g.png", queries=2, k=3)
    assert out.read_bytes()[:8] == PNG
    assert shapes == [(10, 10), (12, 7), (12, 7), (12, 7)] * 2  # query cropped to 10x10, neighbours to 12x7
    assert frames.count(gallery.WRONG) == 2 and frames.count(gallery.QUERY) == 2  # one wrong neighbour per query


def test_report_bayesian_comparison_per_experiment(in_project, small_params, prepared_glyphs, mlflow_store):
    """The demo grid: 2 experiments x 3 seeds; each pair of tournament neighbours compared per experiment."""
    from scipy import stats

    fake_outputs(small_params, prepared_glyphs)
    text = report_stage(small_params, log_to_mlflow=False).read_text()
    tests = _section(text, "## Statistical tests")
    bayes = tests.split("### Bayesian comparison\n", 1)[1].split("### Win rates", 1)[0]
    rows = [row for row in _table_rows(bayes, "") if row[1].startswith("glyphs/")]
    pairs = ["Multi-Similarity (+miner) vs Proxy-Anchor", "Proxy-Anchor vs Contrastive", "Contrastive vs Triplet"]
    assert [row[:3] for row in rows] == [[p, f"glyphs/tiny_cnn/{d}", "3"] for p in pairs for d in (32, 64)]
    # 6 to 12 points apart with 0.6-point noise: A is practically better (ROPE 1 point) in every experiment
    assert all(_probability(row[4]) >= 0.95 and row[5:] == ["< 0.01", "< 0.01"] for row in rows), rows
    # the difference column: mean paired seed difference with its 95% t-interval, in points
    scores = {
        loss: read_json(paths.evaluation_dir(Combo("glyphs", "tiny_cnn", loss, 32)) / "runs.json")["runs"]
        for loss in ("multi_similarity", "proxy_anchor")
    }
    ms, pa = ([s[f"seed{k}"]["metrics"]["map_at_r"] for k in range(3)] for s in scores.values())
    diff = np.array(ms) - np.array(pa)
    mean, half = diff.mean(), stats.t.ppf(0.975, 2) * diff.std(ddof=1) / np.sqrt(3)
    assert rows[0][3] == f"{100 * mean:+.1f} [{100 * (mean - half):+.1f}, {100 * (mean + half):+.1f}]"
    assert "(within ± 1 point, the ROPE, `report.rope`)" in bayes and "n = 3 matched seeds" in bayes
    assert (
        "Across datasets: not run; the Bayesian signed-rank test needs at least 5 independent datasets and this "
        "grid has 1 dataset (2 experiments: 1 backbone x 2 embedding sizes)."
    ) in bayes
    assert "each pair is chosen after seeing the data" in bayes
    assert "`HierarchicalTest`, Corani et al. 2017) is not run: it needs pystan" in bayes
    assert "(figures/bayesian_comparison.png)" in bayes
    summary = _section(text, "## Summary")
    assert (
        "- **Bayesian comparison** of tournament neighbours, per experiment over its n = 3 seeds (ROPE ± 1 point "
        "of test MAP@R; a verdict needs P >= 0.95): Multi-Similarity (+miner) vs Proxy-Anchor: Multi-Similarity "
        "(+miner) better in 2 of 2 experiments; "
    ) in summary
    assert (
        "The experiments come from 1 dataset (2 experiments: 1 backbone x 2 embedding sizes): those of one dataset "
        "are not independent replications, and each pair was picked as neighbours in the ranking these same scores "
        "produced; no test across datasets (it needs 5 datasets)."
    ) in summary
    assert "conditions on that experiment's data split" in _section(text, "## Limitations")


def test_report_blocks_setting_is_refused_in_one_line(small_raw_params):
    """Seed or experiment blocks are not independent: the setting that offered them is gone, and an old
    params.yaml that still sets it says what to do."""
    from dmlbench.errors import ConfigError

    with pytest.raises(ConfigError, match="report: blocks was removed: .*; delete report.blocks"):
        _params(small_raw_params, blocks="experiment_seed")


def test_report_with_one_dataset_and_five_dims_runs_no_test_across_experiments(
    in_project, small_raw_params, prepared_glyphs, mlflow_store
):
    """5 embedding sizes of one dataset are 5 experiments but 1 independent block: no Friedman test, no
    signed-rank test across them, no sign tests; the limitations say what the tournament is then."""
    params = _params(small_raw_params, dims=[16, 24, 32, 48, 64])
    fake_outputs(params, prepared_glyphs)
    text = report_stage(params, log_to_mlflow=False).read_text()
    tests = _section(text, "## Statistical tests")
    assert "chi2(" not in tests and "critical_difference" not in tests
    assert (
        "this grid has 1 dataset (5 experiments: 1 backbone x 5 embedding sizes), so only the per-experiment" in tests
    )
    assert [row for row in _table_rows(tests, "") if len(row) > 1 and row[1] == "across datasets"] == []
    assert "Across datasets: not run" in tests and "### Win rates\n\nNot run:" in tests
    assert "Tournament winner" not in _section(text, "## Summary")
    assert "1 dataset: no independent blocks to compare the losses across, so only the per-experiment tests" in (
        _section(text, "## Limitations")
    )
    assert not (in_project / "reports" / "figures" / "critical_difference.png").exists()


def test_cross_validation_table_shows_fold_models_like_the_thesis_and_the_ensemble_like_rc():
    """Thesis Table 12 reports fold models as mean +/- sd; RC the concatenated ensemble."""
    import pandas as pd

    from dmlbench.analysis import literature as lit
    from dmlbench.analysis.cross_validation import cross_validation_table, fold_rows

    cell = {"dataset": "cub200", "backbone": "bn_inception", "loss": "multi_similarity", "dim": 512}
    table_13 = [64.25, 63.67, 63.60, 63.76, 64.28, 64.24, 63.35, 63.33, 63.23, 62.34]  # thesis Table 13
    runs_json = {
        "runs": {
            "seed0": {
                "seed": 0,
                "metrics": {"precision_at_1": 0.66},
                "folds": {f"fold{i}": {"precision_at_1": v / 100} for i, v in enumerate(table_13)},
            },
            "seed1": {"seed": 1, "metrics": {"precision_at_1": 0.68}, "folds": {}},
        }
    }
    folds = pd.DataFrame(fold_rows(runs_json, cell))
    assert len(folds) == 10 and set(folds["fold"]) == {f"fold{i}" for i in range(10)}
    runs = pd.DataFrame(
        [{**cell, "seed": s, "metric": "precision_at_1", "value": v} for s, v in ((0, 0.66), (1, 0.68))]
    )
    rows = cross_validation_table(runs, folds, lit.load_literature(), {"multi_similarity": "MS"}, 0.95)
    # over 2 seeds: 67.0 -/+ t(0.975, 1) x sem = 67.0 -/+ 12.706 x 1.0 = [54.3, 79.7], inside [0, 100]
    assert rows == [
        [
            "MS",
            "`cub200` / `bn_inception`",
            "512",
            "67.0 [54.3, 79.7] (n=2 seeds)",
            "63.6 ± 0.6 sd (n=10 models)",
            "63.61 (Table 12)",
        ]
    ]
    assert cross_validation_table(runs, pd.DataFrame(), lit.load_literature(), {}, 0.95) == []


def test_a_winner_only_when_the_tests_separate_it_from_every_other_loss():
    """The headline says "winner" only when Nemenyi (after a significant Friedman test) or the
    Bayesian comparison across experiments separates the first loss from every other loss."""
    import pandas as pd

    from dmlbench.analysis import bayesian as bz
    from dmlbench.analysis.friedman import FriedmanResult
    from dmlbench.analysis.numbers import Tests
    from dmlbench.analysis.sections.summary import tournament_headline
    from dmlbench.analysis.tournament import experiment_ranks, tournament

    names = {"a": "A", "b": "B", "c": "C"}
    scores = pd.DataFrame(
        [(f"e{i}", loss, score) for i in range(6) for loss, score in (("a", 0.9), ("b", 0.5 + i / 100), ("c", 0.2))],
        columns=["experiment", "loss", "score"],
    )
    ranking, ranks = tournament(scores), experiment_ranks(scores)

    def headline(tests: Tests) -> str:
        return tournament_headline(ranking, ranks, names, "MAP@R", tests, 0.05)

    skipped = Tests(skipped="they need at least 5 independent blocks")
    text = headline(skipped)
    assert text.startswith(
        "- **Tournament:** A ranks first over 6 experiments ranked by test MAP@R (alone at rank 1 in 6 of 6)"
    )
    assert "no test separates it from B and C" in text and "Friedman and Nemenyi tests were not run" in text
    assert "Tournament winner" not in text and text.endswith("No winner.")

    friedman = FriedmanResult(12.0, 0.002, 6, 3, pd.Series({"a": 1.0, "b": 2.0, "c": 3.0}))
    nemenyi = pd.DataFrame(
        [[1.0, 0.04, 0.001], [0.04, 1.0, 0.04], [0.001, 0.04, 1.0]], index=list("abc"), columns=list("abc")
    )
    text = headline(Tests(friedman=friedman, nemenyi=nemenyi))
    assert text.startswith("- **Tournament winner:** A ranks first")
    assert text.endswith("the tests separate it from every other loss (Nemenyi, alpha = 0.05).")

    close = nemenyi.copy()
    close.loc["a", "b"] = close.loc["b", "a"] = 0.2  # Nemenyi cannot tell A from B
    text = headline(Tests(friedman=friedman, nemenyi=close))
    assert "Tournament winner" not in text
    assert "no test separates it from B (it is separated from C: Nemenyi, alpha = 0.05)" in text

    flat = FriedmanResult(1.0, 0.6, 6, 3, friedman.mean_ranks)  # Friedman finds nothing: Nemenyi does not count
    text = headline(Tests(friedman=flat, nemenyi=nemenyi))
    assert "no test separates it from B and C" in text and "the Friedman test finds no difference" in text

    def across(better: float) -> pd.DataFrame:
        row = {
            "a": "a",
            "b": "b",
            "experiment": bz.ACROSS,
            "test": "signed-rank",
            "n": 6,
            "better": better,
            "equivalent": 1 - better,
            "worse": 0.0,
            "difference": 0.3,
            "low": 0.2,
            "high": 0.4,
        }
        return pd.DataFrame([row])

    decided = Tests(friedman=friedman, nemenyi=close, bayes=across(0.97))
    text = headline(decided)
    assert text.startswith("- **Tournament winner:**")
    assert "(Nemenyi, alpha = 0.05; Bayesian signed-rank across datasets, P >= 0.95)" in text
    text = headline(Tests(friedman=friedman, nemenyi=close, bayes=across(0.94)))
    assert "no test separates it from B" in text


def test_a_tie_for_first_has_no_winner():
    import pandas as pd

    from dmlbench.analysis.numbers import Tests
    from dmlbench.analysis.sections.summary import tournament_headline
    from dmlbench.analysis.tournament import experiment_ranks, tournament

    names = {"a": "A", "b": "B", "c": "C"}
    results = pd.DataFrame(
        [("e1", "a", 0.5), ("e1", "b", 0.4), ("e1", "c", 0.1), ("e2", "a", 0.3), ("e2", "b", 0.6), ("e2", "c", 0.2)],
        columns=["experiment", "loss", "score"],
    )
    tests = Tests(skipped="they need at least 5 independent blocks")
    headline = tournament_headline(tournament(results), experiment_ranks(results), names, "MAP@R", tests, 0.05)
    assert headline == "- **Tournament:** A and B tie for first over 2 experiments ranked by test MAP@R; no winner."
