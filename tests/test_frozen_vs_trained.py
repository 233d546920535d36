"""Frozen trunk versus trained: the paired bootstrap gain against hand-computed values and
a simulation, and the report section on a fabricated demo-like run collection with a real frozen
trunk evaluation."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import report_fakes
from conftest import small_params_dict
from report_fakes import fake_outputs

from dmlbench import paths
from dmlbench.analysis import literature as lit
from dmlbench.analysis.collect import collect_results
from dmlbench.analysis.numbers import analyse
from dmlbench.analysis.paired_gain import paired_gain
from dmlbench.analysis.sections import frozen_vs_trained
from dmlbench.analysis.sections.base import Document
from dmlbench.evaluate.metrics import per_query_metrics


def test_equal_scores_gain_exactly_zero_with_a_zero_width_interval():
    rng = np.random.default_rng(1)
    frozen = rng.integers(0, 2, 50).astype(float)
    gain = paired_gain(np.vstack([frozen, frozen, frozen]), frozen, resamples=300)
    assert (gain.estimate, gain.low, gain.high) == (0.0, 0.0, 0.0)
    assert (gain.queries, gain.seeds, gain.resamples) == (50, 3, 300)


def test_gain_is_the_mean_over_seeds_of_the_per_query_difference():
    # seed 0 gains queries 0 and 1 (2/4), seed 1 gains query 0 only (1/4): (0.5 + 0.25) / 2
    trained = np.array([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    gain = paired_gain(trained, np.zeros(4), resamples=500)
    assert gain.estimate == pytest.approx(0.375)
    assert 0.0 <= gain.low <= 0.375 <= gain.high <= 1.0
    # every query right after training and wrong before: every replicate is +1, the bound of the range
    best = paired_gain(np.ones((2, 30)), np.zeros(30), resamples=200)
    assert (best.estimate, best.low, best.high) == (1.0, 1.0, 1.0)
    worst = paired_gain(np.zeros((1, 30)), np.ones(30), resamples=200)
    assert (worst.estimate, worst.low, worst.high) == (-1.0, -1.0, -1.0)


def test_pairing_makes_the_interval_narrower_than_ignoring_it():
    """Trained = frozen plus a few queries gained: paired, the interval covers only the gained
    queries' chance; an unpaired difference of two proportions would be about 5x as wide."""
    rng = np.random.default_rng(2)
    frozen = (rng.random(400) < 0.5).astype(float)
    trained = frozen.copy()
    trained[np.flatnonzero(frozen == 0)[:20]] = 1.0  # 20 of 400 queries gained: +5 points
    gain = paired_gain(trained[None, :], frozen, resamples=2000)
    assert gain.estimate == pytest.approx(0.05)
    unpaired = 1.96 * np.sqrt(2 * 0.5 * 0.5 / 400)  # ~0.069 half-width
    assert gain.high - gain.low < unpaired
    assert 0.0 <= gain.low < 0.05 < gain.high


def test_interval_covers_the_true_gain_in_a_simulation():
    """Per query a difficulty; the frozen trunk answers right with p = 0.4 + noise, each trained
    seed with p = 0.6 + noise: true gain 0.2. The 95% interval covers it in about 95% of 100 draws."""
    rng = np.random.default_rng(3)
    covered, inside = 0, True
    for _ in range(100):
        difficulty = rng.normal(0, 0.15, 200)
        frozen = (rng.random(200) < np.clip(0.4 + difficulty, 0, 1)).astype(float)
        p_trained = np.clip(0.6 + difficulty, 0, 1)
        trained = (rng.random((3, 200)) < p_trained).astype(float)
        true_gain = float(np.mean(p_trained - np.clip(0.4 + difficulty, 0, 1)))
        gain = paired_gain(trained, frozen, resamples=400, seed=int(rng.integers(1 << 30)))
        covered += gain.low <= true_gain <= gain.high
        inside &= -1.0 <= gain.low <= gain.estimate <= gain.high <= 1.0
    assert inside
    assert 88 <= covered <= 100


def test_paired_gain_refuses_mismatched_queries():
    with pytest.raises(ValueError, match="same queries"):
        paired_gain(np.zeros((2, 5)), np.zeros(4))


def _write_per_query(params) -> dict:
    """per_query.npz of every fabricated run, from its embeddings (what the evaluate stage keeps)."""
    trained_p1 = {}
    for combo in params.combos():
        arrays = {}
        for seed in params.seeds:
            with np.load(paths.embedding_dir(combo.with_seed(seed)) / "embeddings.npz") as stored:
                values = per_query_metrics(stored["test_embeddings"], stored["test_labels"], backend="torch")
            arrays.update({f"seed{seed}/{name}": v for name, v in values.items()})
            trained_p1[(combo.loss, combo.dim, seed)] = values["precision_at_1"]
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
        f"(n={frozen['n']} queries)"
    )
    # the fakes rank Multi-Similarity (2019) first; focus dim = the grid's largest (64); every loss of
    # this grid (contrastive, triplet, Multi-Similarity, Proxy-Anchor) was run by a 2020 study
    best = rows["best 2020 loss"]
    assert best[0] == "Multi-Similarity (+miner) (2019)" and best[1] == "64"
    assert rows["best newer loss"][0] == "none in this grid (a 2020 study ran every loss)"
    assert "newer losses: none." in text
    with np.load(paths.pretrained_evaluation_dir("glyphs", "tiny_cnn") / "per_query.npz") as stored:
        frozen_p1 = stored["pretrained/precision_at_1"]
    expected = np.mean([trained[("multi_similarity", 64, s)].mean() for s in small_params.seeds]) - frozen_p1.mean()
    match = re.fullmatch(r"([+-]\d+\.\d) \[([+-]\d+\.\d), ([+-]\d+\.\d)\] \(n = (\d+) x (\d+)\)", best[3])
    assert match, best[3]
    estimate, low, high = (float(match.group(i)) for i in (1, 2, 3))
    assert estimate == pytest.approx(100 * expected, abs=0.051)
    assert -100 <= low <= estimate <= high <= 100
    assert (int(match.group(4)), int(match.group(5))) == (len(frozen_p1), len(small_params.seeds))


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
        assert re.fullmatch(r"[+-]\d+\.\d \[[+-]\d+\.\d, [+-]\d+\.\d\] \(n = \d+ x 3\)", rows[tier][3]), rows[tier]
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
