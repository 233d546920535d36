"""Frozen trunk versus trained: the gain's interval over seeds and test classes against hand-computed
values and a simulation, and the report section on a fabricated demo-like run collection with a real frozen
trunk evaluation."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import report_fakes
from helpers.project import small_params_dict
from helpers.report_fakes import fake_outputs
from scipy import stats

from dmlbench import paths
from dmlbench.analysis import literature as lit
from dmlbench.analysis.collect import collect_results
from dmlbench.analysis.numbers import analyse
from dmlbench.analysis.paired_gain import paired_gain
from dmlbench.analysis.sections import frozen_vs_trained
from dmlbench.analysis.sections.base import Document
from dmlbench.evaluate.intervals import bootstrap_interval
from dmlbench.evaluate.metrics import per_query_metrics


def test_equal_scores_gain_exactly_zero_with_a_zero_width_interval():
    rng = np.random.default_rng(1)
    frozen = rng.integers(0, 2, 50).astype(float)
    gain = paired_gain(np.vstack([frozen, frozen, frozen]), frozen, np.arange(50) // 5, resamples=300)
    assert (gain.estimate, gain.low, gain.high) == (0.0, 0.0, 0.0)
    assert (gain.queries, gain.classes, gain.seeds, gain.resamples) == (50, 10, 3, 300)
    assert gain.label == "n = 3 seeds; 50 queries in 10 classes"


def test_interval_is_the_seeds_t_interval_when_every_class_gains_alike():
    """Hand-computed: 3 seeds, 4 queries in 2 classes, frozen 0. Seed gains 0.5, 1, 0: mean 0.5, sd 0.5.
    Seed-mean differences per query 2/3, 1/3, 2/3, 1/3: each class sums to 1, so every class
    resample gives 0.5 (no class part) and the interval is the t-interval over the 3 seeds:
    0.5 -/+ t_{0.975, 2} 0.5 / sqrt(3) = 0.5 -/+ 1.2422, clipped to [-1, 1]."""
    trained = np.array([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    gain = paired_gain(trained, np.zeros(4), np.array([0, 0, 1, 1]), resamples=500)
    half = 4.302653 * 0.5 / math.sqrt(3)
    assert gain.estimate == pytest.approx(0.5) and gain.seed_half_width == pytest.approx(half, rel=1e-6)
    assert (gain.class_low, gain.class_high) == (0.5, 0.5)
    assert (gain.low, gain.high) == pytest.approx((0.5 - half, 1.0))  # -0.742, and +1.742 clipped to +1


def test_interval_is_at_least_as_wide_as_the_seeds_spread_implies():
    """The old two-level bootstrap resampled 3 seeds like queries: about 2.7x too narrow. The interval
    is never narrower than t_{S-1} s / sqrt(S) on either side, and adds the class part in quadrature."""
    rng = np.random.default_rng(4)
    classes = np.repeat(np.arange(40), 10)  # 400 queries in 40 classes
    frozen = (rng.random(400) < 0.3).astype(float)
    trained = (rng.random((3, 400)) < np.array([[0.55], [0.65], [0.75]])).astype(float)  # seeds differ a lot
    gain = paired_gain(trained, frozen, classes, resamples=1000, seed=2)
    per_seed = (trained - frozen).mean(axis=1)
    seeds_only = 4.302653 * per_seed.std(ddof=1) / math.sqrt(3)
    assert gain.estimate == pytest.approx(per_seed.mean())
    assert gain.estimate - gain.low >= seeds_only and gain.high - gain.estimate >= seeds_only
    assert gain.estimate - gain.low == pytest.approx(math.hypot(seeds_only, gain.estimate - gain.class_low))
    assert gain.high - gain.estimate == pytest.approx(math.hypot(seeds_only, gain.class_high - gain.estimate))
    # the class part is the class-cluster bootstrap of the seed-mean per-query difference
    alone = bootstrap_interval((trained - frozen).mean(axis=0), 0.95, 1000, "percentile", 2, clusters=classes)
    assert (gain.class_low, gain.class_high) == (alone.low, alone.high)


def test_one_seed_gets_the_class_bootstrap_only_and_clustering_widens_it():
    """One seed: the interval is the class-cluster percentile bootstrap. Queries of a class that all
    gain or all lose together: resampling classes (20 of 20 queries) is about sqrt(20) x wider than
    resampling queries as if independent."""
    rng = np.random.default_rng(2)
    classes = np.repeat(np.arange(30), 20)
    gained = np.repeat(rng.random(30) < 0.5, 20).astype(float)  # a class gains in every query or in none
    gain = paired_gain(gained[None, :], np.zeros(600), classes, resamples=2000)
    assert math.isnan(gain.seed_half_width) and (gain.low, gain.high) == (gain.class_low, gain.class_high)
    naive = paired_gain(gained[None, :], np.zeros(600), np.arange(600), resamples=2000)
    assert (gain.high - gain.low) / (naive.high - naive.low) == pytest.approx(math.sqrt(20), rel=0.2)
    p = gained.mean()
    assert gain.high - gain.low == pytest.approx(2 * 1.96 * math.sqrt(p * (1 - p) / 30), rel=0.15)


def test_gain_stays_in_its_range():
    best = paired_gain(np.ones((2, 30)), np.zeros(30), np.arange(30) % 3, resamples=200)
    assert (best.estimate, best.low, best.high) == (1.0, 1.0, 1.0)
    worst = paired_gain(np.zeros((1, 30)), np.ones(30), np.arange(30) % 3, resamples=200)
    assert (worst.estimate, worst.low, worst.high) == (-1.0, -1.0, -1.0)


def test_interval_covers_the_true_gain_in_a_simulation():
    """A new test set of 40 classes each draw; each class a difficulty shared by its 10 queries; each
    seed a training effect shared by all its queries. True gain 0.2 over classes and seeds: the 95%
    interval covers it in at least about 95% of 100 draws (the method errs on the wide side)."""
    rng = np.random.default_rng(3)
    classes = np.repeat(np.arange(40), 10)
    covered = 0
    for _ in range(100):
        difficulty = np.repeat(rng.normal(0, 0.15, 40), 10)
        p_frozen = np.clip(0.4 + difficulty, 0, 1)
        p_trained = np.clip(0.6 + difficulty + rng.normal(0, 0.03, (3, 1)), 0, 1)
        frozen = (rng.random(400) < p_frozen).astype(float)
        trained = (rng.random((3, 400)) < p_trained).astype(float)
        gain = paired_gain(trained, frozen, classes, resamples=400, seed=int(rng.integers(1 << 30)))
        covered += gain.low <= 0.2 <= gain.high
        assert -1.0 <= gain.low <= gain.estimate <= gain.high <= 1.0
    assert covered >= 90


def test_paired_gain_refuses_mismatched_queries():
    with pytest.raises(ValueError, match="same queries"):
        paired_gain(np.zeros((2, 5)), np.zeros(4), np.zeros(4))
    with pytest.raises(ValueError, match="one class label per query: 3 labels for 4 queries"):
        paired_gain(np.zeros((2, 4)), np.zeros(4), np.zeros(3))


def _write_per_query(params) -> dict:
    """per_query.npz of every fabricated run, from its embeddings (what the evaluate stage keeps)."""
    trained_p1 = {}
    for combo in params.combos():
        arrays = {}
        for seed in params.seeds:
            with np.load(paths.embedding_dir(combo.with_seed(seed)) / "embeddings.npz") as stored:
                values = per_query_metrics(stored["test_embeddings"], stored["test_labels"], backend="torch")
            arrays.update({f"seed{seed}/{name}": v for name, v in values.arrays().items()})
            trained_p1[(combo.loss, combo.dim, seed)] = values.metrics["precision_at_1"]
        np.savez(paths.evaluation_dir(combo) / "per_query.npz", **arrays)
    return trained_p1


def _section(params) -> str:
    doc = Document(Path("figures"))  # the section draws no figure
    frozen_vs_trained.write(analyse(params, collect_results(params)), doc)
    return doc.text()


def _rows(text: str) -> dict[str, list[str]]:
    """The glyphs/tiny_cnn table of the section: first cell -> the other cells."""
    table = text.split("### `glyphs` / `tiny_cnn`")[1].split("\n\n")[1]
    return {row.split("|")[1].strip(): [c.strip() for c in row.split("|")[2:-1]] for row in table.splitlines()[2:]}


def _frozen_trunk(params) -> None:
    from dmlbench.evaluate.embed import embed_pretrained_stage
    from dmlbench.evaluate.stage import evaluate_pretrained_stage

    embed_pretrained_stage(params, "glyphs", "tiny_cnn", device="cpu")
    evaluate_pretrained_stage(params, "glyphs", "tiny_cnn")


def test_section_on_a_fabricated_grid_with_a_real_frozen_trunk(in_project, small_params, prepared_glyphs, mlflow_store):
    from dmlbench.evaluate.embed import embed_pretrained_stage
    from dmlbench.evaluate.stage import evaluate_pretrained_stage

    fake_outputs(small_params, prepared_glyphs)
    text = _section(small_params)
    assert "No frozen-trunk evaluation" in text and "LVD-142M" in text  # nothing to compare, still the caveat
    embed_pretrained_stage(small_params, "glyphs", "tiny_cnn", device="cpu")
    frozen = evaluate_pretrained_stage(small_params, "glyphs", "tiny_cnn")["test"]["precision_at_1"]
    text = _section(small_params)  # no per-query values of the trained runs yet: scores, no gain
    assert "No gain interval for: Multi-Similarity (+miner), P@1 = R@1: seed 0's per-query values are missing" in text

    trained = _write_per_query(small_params)
    text = _section(small_params)
    rows = _rows(text)
    frozen_row = rows["frozen trunk (random initialisation (torch seed 0))"]
    assert frozen_row[2] == f"{100 * frozen['mean']:.1f} [{100 * frozen['low']:.1f}, {100 * frozen['high']:.1f}] " + (
        f"(n={frozen['n']} classes; {frozen['queries']:,} queries)"
    )
    with np.load(paths.pretrained_evaluation_dir("glyphs", "tiny_cnn") / "per_query.npz") as stored:
        test_classes = len(np.unique(stored["pretrained/query_label"]))
    assert frozen["n"] == test_classes == 20 and frozen["interval"] == "class-bootstrap-percentile"
    # the fakes rank Multi-Similarity (2019) first; focus dim = the grid's largest (64); every loss of
    # this grid (contrastive, triplet, Multi-Similarity, Proxy-Anchor) was run by a 2020 study
    best = rows["best 2020 loss"]
    assert best[0] == "Multi-Similarity (+miner) (2019)" and best[1] == "64"
    assert rows["best newer loss"][0] == "none in this grid (a 2020 study ran every loss)"
    assert "newer losses: none." in text
    with np.load(paths.pretrained_evaluation_dir("glyphs", "tiny_cnn") / "per_query.npz") as stored:
        frozen_p1 = stored["pretrained/precision_at_1"]
    expected = np.mean([trained[("multi_similarity", 64, s)].mean() for s in small_params.seeds]) - frozen_p1.mean()
    match = re.fullmatch(
        r"([+-]\d+\.\d) \[([+-]\d+\.\d), ([+-]\d+\.\d)\] \(n = (\d+) seeds; ([\d,]+) queries in (\d+) classes\)",
        best[3],
    )
    assert match, best[3]
    estimate, low, high = (float(match.group(i)) for i in (1, 2, 3))
    assert estimate == pytest.approx(100 * expected, abs=0.051)
    assert -100 <= low <= estimate <= high <= 100
    seeds, queries, classes = int(match.group(4)), int(match.group(5).replace(",", "")), int(match.group(6))
    assert (seeds, queries, classes) == (len(small_params.seeds), len(frozen_p1), test_classes)
    per_seed = [trained[("multi_similarity", 64, s)].mean() - frozen_p1.mean() for s in small_params.seeds]
    seeds_only = 100 * stats.t.ppf(0.975, seeds - 1) * np.std(per_seed, ddof=1) / math.sqrt(seeds)
    assert high - low >= 2 * seeds_only - 0.1  # never narrower than the seeds' own t-interval (rounding: 0.1)
    # an evaluation written before the classes were kept: the section still builds and says why there is no gain
    frozen_file = paths.pretrained_evaluation_dir("glyphs", "tiny_cnn") / "per_query.npz"
    with np.load(frozen_file) as stored:
        older = {key: stored[key] for key in stored.files if not key.endswith("/query_label")}
    np.savez(frozen_file, **older)
    text = _section(small_params)
    assert "the frozen trunk's per-query classes are missing (its evaluation predates them: re-run it)" in text


def test_a_grid_with_a_2020_loss_and_a_newer_one_shows_both_tiers(
    in_project, default_raw_params, prepared_glyphs, mlflow_store, monkeypatch
):
    """Multi-Similarity (Reality Check and thesis) and SupCon (NeurIPS 2020, run by neither study):
    the 2020 tier is not "published up to 2020" - SupCon is a 2020 paper and still the newer tier's."""
    from dmlbench.params.load import parse_params

    params = parse_params(small_params_dict(default_raw_params, losses={"multi_similarity": {}, "supcon": {}}))
    monkeypatch.setitem(report_fakes.QUALITY, "supcon", 0.65)  # ranked below Multi-Similarity (0.7)
    fake_outputs(params, prepared_glyphs)
    _frozen_trunk(params)
    _write_per_query(params)
    text = _section(params)
    rows = _rows(text)
    assert rows["best 2020 loss"][:2] == ["Multi-Similarity (+miner) (2019)", "64"]
    assert rows["best newer loss"][:2] == ["SupCon (2020)", "64"]
    for tier in ("best 2020 loss", "best newer loss"):  # both get a gain with its interval
        assert re.fullmatch(
            r"[+-]\d+\.\d \[[+-]\d+\.\d, [+-]\d+\.\d\] \(n = 3 seeds; [\d,]+ queries in 20 classes\)", rows[tier][3]
        ), rows[tier]
    assert "In this grid, 2020 losses: Multi-Similarity (+miner) (2019); newer losses: SupCon (2020)." in text
    assert "`methods.csv` column `studies_2020`" in text


def test_a_recipe_with_a_reference_loss_shows_it_beside_the_tiers(
    in_project, default_raw_params, prepared_glyphs, mlflow_store, monkeypatch
):
    """A protocol naming its source's loss (``reference_loss``, as hyp_vit and berton2025 do): its row
    under every trunk, with its gain, whether or not it is the best of its tier."""
    from dmlbench.params.load import parse_params

    raw = small_params_dict(default_raw_params, losses={"multi_similarity": {}, "supcon": {}})
    raw["protocols"][raw["protocol"]]["reference_loss"] = "supcon"
    params = parse_params(raw)
    monkeypatch.setitem(report_fakes.QUALITY, "supcon", 0.65)
    fake_outputs(params, prepared_glyphs)
    _frozen_trunk(params)
    _write_per_query(params)
    text = _section(params)
    rows = _rows(text)
    assert list(rows)[1:] == ["best 2020 loss", "best newer loss", "the recipe's own loss"]
    assert rows["the recipe's own loss"][:2] == ["SupCon (2020)", "64"]
    assert rows["the recipe's own loss"][2:] == rows["best newer loss"][2:]  # the same cells: the same loss
    assert "Every loss trained under one recipe, protocol `demo`; *the recipe's own loss* is" in text
    params = parse_params(small_params_dict(default_raw_params, losses={"multi_similarity": {}, "supcon": {}}))
    assert "the recipe's own loss" not in _section(params)  # no reference_loss: no row, no sentence


def test_the_tiers_come_from_methods_csv():
    """The 2020 tier is what methods.csv says the two studies ran; the newer losses are Tuplet Margin,
    Smooth-AP, SupCon, Sub-center ArcFace, Circle and Hyp-ViT's sphere loss, which neither ran."""
    from dmlbench.losses import LOSSES

    methods = lit.load_methods()
    newer = {loss for loss in LOSSES if not frozen_vs_trained.in_2020_tier(loss, methods)}
    assert newer == {"tuplet_margin", "smooth_ap", "supcon", "subcenter_arcface", "circle", "hyp_vit_sphere"}
    assert lit.studies_2020("proxy_anchor", methods) == ("thesis",)
    assert lit.studies_2020("cosface", methods) == ("reality_check",)
    assert lit.studies_2020("triplet", methods) == ("reality_check", "thesis")
    assert lit.studies_2020("not_a_loss", methods) == ()


def test_literature_table_lists_frozen_models_and_test_selected_methods():
    methods = lit.load_methods()
    lines = "\n".join(frozen_vs_trained.literature_lines(lit.load_literature(methods=methods), methods))
    rows = {
        r.split("|")[1].strip() + " " + r.split("|")[3].strip(): r for r in lines.splitlines() if r.startswith("| ")
    }
    # OML zoo, read in the repository: DINOv2 ViT-L/14 with registers 84.0 / 87.1, without 84.4 / 69.2
    assert "| 84 | 87.1 | 57.1 | 34 |" in rows["frozen `vit_l14_dinov2_reg` vit_l14_dinov2_reg"]
    assert "| 84.4 | 69.2 |" in rows["frozen `vit_l14_dinov2` vit_l14_dinov2"]
    assert "no training on it" in rows["frozen `resnet50` resnet50"]
    hyp = rows["Hyp-ViT vit_s16"]  # read in the results table the official README links: not marked
    assert "selects on the test classes" in hyp and "| 85.6 | 86.5 | 85.9 | 92.5 |" in hyp
    assert "| 85.8 | 88.8 | 86.3 | 93.2 |" in rows["SEE vit_s16"]
    assert (
        "no training on it" in rows["Unicom vit_l14_336"]
        and "| 89.2 | 97.3 | 74.5 | 86.7 |" in rows["Unicom vit_l14_336"]
    )
