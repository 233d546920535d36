"""What the rendered report promises its reader: n stated once where it is constant, intervals
inside their range, captions quoting their tables' numbers, the flip as training applies it, the
demo's limits where its numbers are, and published numbers checked against our intervals."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pandas as pd
import pytest
from helpers.report_fakes import fake_outputs

from dmlbench.analysis import literature as lit
from dmlbench.analysis.report import report_stage
from dmlbench.analysis.reproduction import INCONCLUSIVE, LOWER, NO_TEST, reproduction_table
from dmlbench.analysis.sections.base import demo_note
from dmlbench.analysis.sections.setup import flip_note
from dmlbench.analysis.text import common_n, format_interval, format_signed_interval, signed_percent


def _section(text: str, heading: str) -> str:
    return text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]


def _tables(text: str) -> list[list[list[str]]]:
    """Every markdown table of ``text`` as rows of cells (header and rule left out)."""
    tables, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("| "):
            rows.append([c.strip() for c in line.split("|")[1:-1]])
        elif rows:
            tables.append(rows[2:])
            rows = []
    return tables


@pytest.fixture
def report(in_project, small_params, prepared_glyphs, mlflow_store) -> str:
    fake_outputs(small_params, prepared_glyphs)
    return report_stage(small_params, log_to_mlflow=False).read_text()


def test_rendered_report_keeps_its_promises(report, small_params):
    text = report
    # n once per table: no column repeats the same "(n=...)" in every one of its cells
    for table in _tables(text):
        for column in zip(*table, strict=True):
            ns = [re.search(r"\(n=[^)]*\)", c) for c in column]
            assert len(column) < 2 or not all(ns) or len({m.group(0) for m in ns}) > 1, column
    # every score interval lies inside [0, 100] and contains its mean
    for mean, low, high in re.findall(r"(?<![+\-\d.])(\d+\.\d) \[(-?\d+\.\d), (-?\d+\.\d)\]", text):
        assert 0 <= float(low) <= float(mean) <= float(high) <= 100, (mean, low, high)
    # Figure captions quote their tables' numbers, rounded the same way
    convergence = _section(text, "## Convergence")
    caption = re.search(r"averages (.+?) of \d+", convergence).group(1)
    table = {(r[0], r[1]): r[2] for r in _tables(convergence)[0]}
    quoted = re.findall(r"(\S[^,]*?) (\d+\.\d)(?:,|$)", caption)
    assert len(quoted) == len(small_params.losses)
    for name, value in quoted:
        assert table[(name, str(max(small_params.dims)))].split(" ")[0] == value, (name, value)
    papers = _section(text, "## Papers versus reality")
    ours = re.search(r"our runs ([+-]\d+\.\d%) to ([+-]\d+\.\d%) \(table above\)", papers)
    over_contrastive = [r[3].split(" [")[0] for r in _tables(papers)[-1] if r[2] == "contrastive"]
    assert ours and {ours.group(1), ours.group(2)} == {
        min(over_contrastive, key=float_pct),
        max(over_contrastive, key=float_pct),
    }
    # a one-backbone grid has no backbone figure, and says why
    size = _section(text, "## Embedding size and backbone")
    assert "backbones.png" not in text and "> No backbone figure (thesis Fig. 31): the grid has one backbone" in size
    # the demo's limits under the results and the tournament, and nothing published to reproduce
    results = _section(text, "## Results on the test classes")
    note = "> Demo data (`glyphs`; `tiny_cnn` from scratch, 2 epochs): these numbers rank the losses on this data"
    assert note.replace("2 epochs", f"{small_params.protocol.epochs} epochs") in results
    assert "> Demo data (`glyphs`" in _section(text, "## Tournament of losses")
    assert "Protocol `demo` follows no published setup: there is no published number to reproduce" in results
    # the flip as training applies it (glyphs are not flip-invariant)
    setup = _section(text, "## Setup")
    assert "(horizontal flip - protocol: hflip on; applied: off for glyphs (not flip-invariant))" in setup


def float_pct(cell: str) -> float:
    return float(cell.rstrip("%"))


def test_common_n_and_formats_state_n_once():
    assert common_n([3, 3, 2, 3]) == 3 and common_n([]) is None
    assert format_interval(0.5, 0.4, 0.6, 3, show_n=False) == "50.0 [40.0, 60.0]"
    assert format_interval(0.5, float("nan"), float("nan"), 1, show_n=False) == "50.0 (n=1, no interval)"
    assert format_signed_interval(0.123, 0.04, 0.211, "") == "+12.3% [+4.0, +21.1]"
    assert format_signed_interval(0.123, float("nan"), float("nan"), "n=1 vs 3") == "+12.3% (n=1 vs 3, no interval)"
    assert signed_percent(-0.0149) == "-1.5%"


def test_flip_note_follows_the_protocol_and_the_dataset(small_raw_params):
    import copy

    from dmlbench.params.load import parse_params

    raw = copy.deepcopy(small_raw_params)
    assert flip_note(parse_params(raw)).endswith("applied: off for glyphs (not flip-invariant))")
    raw["protocols"][raw["protocol"]]["augment"]["hflip"] = False
    assert flip_note(parse_params(raw)) == " (protocol: no horizontal flip)"


def test_demo_note_only_for_the_demo(small_params):
    assert demo_note(small_params).startswith("Demo data (`glyphs`")
    published = SimpleNamespace(protocol_name="thesis", datasets={"cub200": None})
    assert demo_note(published) is None


def test_published_numbers_are_classified_against_our_interval():
    """A thesis grid: the thesis's Table-5 number for contrastive on CUB200 (BN-Inception, 512-d) is
    one run (no interval), judged by the prediction interval of one run (and TOST)."""
    published = lit.published_for(lit.load_literature(), "thesis")
    row = published[
        (published["loss"] == "contrastive")
        & (published["dataset"] == "cub200")
        & (published["backbone"] == "bn_inception")
        & (published["dim"] == 512)
    ]
    assert len(row) == 1 and row["metric"].iloc[0] == "precision_at_1" and row["half_width"].isna().all()
    value = float(row["value"].iloc[0])  # percent
    cell = {"dataset": "cub200", "backbone": "bn_inception", "metric": "precision_at_1"}
    summary = pd.DataFrame(
        [
            {
                **cell,
                "loss": "contrastive",
                "dim": 512,
                "mean": value / 100 + 0.005,
                "low": value / 100 - 0.01,
                "high": value / 100 + 0.02,
                "n": 3,
            },
            {**cell, "loss": "contrastive", "dim": 64, "mean": 0.40, "low": 0.38, "high": 0.42, "n": 3},
            {**cell, "loss": "triplet", "dim": 512, "mean": 0.70, "low": float("nan"), "high": float("nan"), "n": 1},
        ]
    )
    table = reproduction_table(summary, published).set_index(["loss", "dim"])
    # 0.5 points above, se = 1.5 / t(0.975, 2) points; one published run: se x sqrt(1 + 3), half-width
    # t(0.975, 2) x 3 = 3.0 points: neither equivalent within 1 point nor different
    close = table.loc[("contrastive", 512)]
    assert close["outcome"] == INCONCLUSIVE
    assert close["verdict"] == "inconclusive (published value without interval: one run, prediction interval)"
    assert close["difference"] == pytest.approx(0.5) and close["difference_low"] == pytest.approx(-2.5)
    assert close["df"] == 2  # only our s is estimated: n - 1
    assert close["test_selected"] and math.isnan(close["best_difference"])  # the thesis kept its best test epoch
    outside = table.loc[("contrastive", 64)]
    thesis_64 = published[
        (published["loss"] == "contrastive")
        & (published["dataset"] == "cub200")
        & (published["backbone"] == "bn_inception")
        & (published["dim"] == 64)
    ]["value"].iloc[0]
    assert outside["outcome"] == LOWER and outside["difference"] == pytest.approx(40.0 - thesis_64)
    assert table.loc[("triplet", 512)]["outcome"] == NO_TEST


def test_reality_check_numbers_match_the_grid_dim_of_one_fold_model():
    """RC published 4 x 128-d concatenated (512-d) numbers: they belong to the grid's 128-d cells."""
    published = lit.published_for(lit.load_literature(), "reality_check")
    assert len(published) and set(published["dim"]) == {128}
    assert {"precision_at_1", "r_precision", "map_at_r"} <= set(published["metric"])
    assert lit.published_for(lit.load_literature(), "demo").empty
    proxy = lit.published_for(lit.load_literature(), "proxy_anchor")
    assert set(proxy["source"]) == {"Proxy-Anchor paper", "Proxy-Anchor official README"}


def test_reproduction_table_in_the_report_says_per_cell_whether_and_by_how_much():
    from dmlbench.analysis.sections.results import reproduction_lines

    published = pd.DataFrame(
        [
            {
                "loss": "contrastive",
                "dataset": "cub200",
                "backbone": "bn_inception",
                "dim": 512,
                "metric": "precision_at_1",
                "value": v,
                "source": "thesis",
                "uncertain": False,
            }
            for v in (63.28,)
        ]
    )
    cell = {
        "dataset": "cub200",
        "backbone": "bn_inception",
        "loss": "contrastive",
        "dim": 512,
        "metric": "precision_at_1",
    }
    summary = pd.DataFrame([{**cell, "mean": 0.60, "low": 0.58, "high": 0.62, "n": 3}])
    analysis = SimpleNamespace(
        params=SimpleNamespace(
            protocol_name="thesis", evaluate=SimpleNamespace(confidence=0.95), report=SimpleNamespace(rope=0.01)
        ),
        reproduction=reproduction_table(summary, published),
        names={"contrastive": "Contrastive"},
    )
    text = "\n".join(reproduction_lines(analysis))
    # the thesis's 63.28 (one run, no interval) against our 60.0 [58.0, 62.0], n = 3: ours - published
    # = -3.28 points; one published run: prediction se = s sqrt(1/3 + 1) = (2 / 4.303) sqrt(3) sqrt(4/3)
    # = 0.930 points, half-width 4.303 x 0.930 = 4.0: [-7.3, +0.7]; TOST p = P(T_2 > -2.28 / 0.930) = 0.93
    row = (
        "| Contrastive | cub200/bn_inception/512 | P@1 = R@1 | 63.28 (thesis) | 60.0 [58.0, 62.0] | -3.3 [-7.3, +0.7] "
        "| 0.93 | inconclusive (published value without interval: one run, prediction interval) |"
    )
    assert row in text and "0 of 1 published numbers reproduced; 1 inconclusive." in text and "n = 3 seeds" in text
    assert "within ± 1 point (`report.rope`)" in text and "se = h / t(0.975, n - 1)" in text
    assert "published (± 95% half-width, n runs)" in text and "(1 of 1 here)" in text
    assert "se = s sqrt(1/n + 1)" in text and "best test epoch" not in text  # source "thesis": not a setup label
    # under the thesis setup's own label the number kept its best test epoch: a like-with-like column
    label = "thesis (epoch picked on the test set)"
    best = pd.DataFrame([{**cell, "seed": s, "best_value": v} for s, v in enumerate((0.62, 0.63, 0.64))])
    analysis.reproduction = reproduction_table(summary, published.assign(source=label), best=best)
    text = "\n".join(reproduction_lines(analysis))
    # best-epoch mean 63.0, sd 1 point: 63.0 -/+ 4.303 / sqrt(3) = [60.5, 65.5];
    # -0.28 -/+ 4.303 sqrt(1/3 + 1) = [-5.25, +4.69]
    assert "ours at best test epoch" in text and "Sec. 3.5.2" in text
    assert "| 63.0 [60.5, 65.5] | -0.3 [-5.2, +4.7] | inconclusive (published value without interval" in text
    # a Reality Check number carries its half-width and n into the table and the Welch test
    analysis.params.protocol_name = "reality_check"
    rc = lit.published_for(lit.load_literature(), "reality_check")
    rc = rc[(rc["loss"] == "contrastive") & (rc["dataset"] == "cub200") & (rc["metric"] == "precision_at_1")]
    summary = pd.DataFrame([{**cell, "dim": 128, "mean": 0.6813, "low": 0.6713, "high": 0.6913, "n": 10}])
    analysis.reproduction = reproduction_table(summary, rc)
    text = "\n".join(reproduction_lines(analysis))
    published = "68.13 ± 0.31 (n=10) (Reality Check, 4 x 128-d concatenated)"
    assert f"| {published} | 68.1 [67.1, 69.1] | +0.0 [-1.0, +1.0] |" in text
    assert "| reproduced (equivalent within ± 1 point) |" in text and "1 of 1 published numbers reproduced." in text
    # the report's rope is the margin, whatever margin the table was built with
    analysis.params.report.rope = 0.001
    assert "| inconclusive |" in "\n".join(reproduction_lines(analysis))
    analysis.params.protocol_name = "demo"
    assert "follows no published setup" in "\n".join(reproduction_lines(analysis))


def test_papers_section_sets_each_claim_against_its_own_paper_or_marks_it_borrowed():
    """Papers vs reality: one table row per claim with its gain over the number its own paper reports;
    a borrowed baseline (other papers, same backbone and size) marked † with how many papers and
    counted apart; `-` and a note where neither exists; the figure caption says what each point of
    panel (a) is set against, with the counts."""
    from dmlbench.analysis import claims as cl
    from dmlbench.analysis.sections.papers import borrowed_caption, claims_lines, figure_caption_claims

    literature, methods = lit.load_literature(), lit.load_methods()
    claimed = {}
    for baseline in ("contrastive", "triplet"):
        claims = cl.claimed_improvements(literature, baseline)
        claimed[baseline] = claims.assign(display=claims["loss"].map(lambda x: lit.display_name(x, methods)))
    text = "\n".join(claims_lines(claimed))
    rows = {(r[0], r[2], r[3]): r[4:] for r in _tables(text)[0]}
    assert len(rows) == 35 and "†" not in str(rows)
    assert rows[("Normalized Softmax", "Cars196", "84.2? (resnet50-512)")] == ["+288% vs 21.7", "-"]
    assert rows[("Psomas proxy loss", "CUB200", "65.42 (bn_inception-512)")] == ["+3% vs 63.28", "+6% vs 61.98"]
    assert rows[("Proxy-Anchor", "CUB200", "68.4? (bn_inception-512)")] == ["-", "-"]  # paper + README: one row
    assert (
        "(35 claims from 39 `literature.csv` rows; over contrastive 9 against their own paper's number, 0 borrowed, "
        "26 with neither; over triplet 3 against their own paper's number, 0 borrowed, 32 with neither)"
    ) in text
    assert "Unicom 2023 (vit_l14_336-n/s: CUB200, Cars196, SOP, In-Shop)" in text
    assert borrowed_caption(claimed) == ""
    assert figure_caption_claims(claimed) == (
        "(a) as claimed by papers, each point one claim set against the baseline number its own paper reports "
        "(over contrastive 9 of 35 claims, over triplet 3 of 35 claims); claims with neither are not plotted "
        "(over contrastive 26, over triplet 32)"
    )
    # were Hyp-ViT's CUB200 claim set against 2 other papers' numbers at its cell (median 70)
    borrowed = claimed["contrastive"].copy()
    hyp = borrowed.index[(borrowed["loss"] == "hyp_vit") & (borrowed["dataset"] == "cub200")]
    columns = ["baseline_kind", "borrowed", "baseline_value", "baseline_papers", "improvement"]
    borrowed.loc[hyp, columns] = [cl.BORROWED, True, 70.0, 2, 100 * (85.6 / 70 - 1)]
    text = "\n".join(claims_lines({"contrastive": borrowed}))
    rows = {(r[0], r[2]): r[4] for r in _tables(text)[0]}
    assert rows[("Hyp-ViT", "CUB200")] == "+22% vs 70† (2 papers)"
    assert "over contrastive 9 against their own paper's number, 1 borrowed, 25 with neither" in text
    assert borrowed_caption({"contrastive": borrowed}) == (
        " Points marked † in (a) set a claim against the median of other papers' numbers at its backbone and "
        "embedding size because its own paper reports none (claims table above): over contrastive Hyp-ViT "
        "(CUB200) (1 of 10 claims)."
    )
    assert "or, marked †, against other papers' numbers at the same backbone and size" in figure_caption_claims(
        {"contrastive": borrowed}
    )
    assert claims_lines({"contrastive": pd.DataFrame()}) == []


def test_still_improving_states_what_the_last_epoch_added():
    """Runs that picked their last epoch: the gain of that epoch over the one before, in the selection metric."""
    from dmlbench.analysis.sections.summary import last_epoch_gains

    rows = []
    curves = {0: [0.40, 0.50, 0.56], 1: [0.40, 0.55, 0.54], 2: [0.30, 0.45, 0.47]}  # seed 1 peaked at epoch 2
    for seed, scores in curves.items():
        for epoch, score in enumerate(scores, start=1):
            cell = {"dataset": "glyphs", "backbone": "tiny_cnn", "loss": "triplet", "dim": 32, "fold": None}
            rows.append({**cell, "seed": seed, "epoch": epoch, "val/map_at_r": score})
    analysis = SimpleNamespace(
        results=SimpleNamespace(history=pd.DataFrame(rows)),
        params=SimpleNamespace(protocol=SimpleNamespace(selection_metric="map_at_r")),
    )
    gains = last_epoch_gains(analysis)
    assert sorted(gains.round(6)) == [0.02, 0.06]


def test_summary_headline_is_over_claims_against_their_own_papers_baseline():
    """The summary's papers-vs-reality bullet: the median over the claims set against their own paper's
    contrastive number (9 on literature.csv, median +86% = 78.2/42), borrowed ones counted apart,
    claims with neither only counted as left out; no bullet without a claim to compare."""
    from dmlbench.analysis import claims as cl
    from dmlbench.analysis.sections.summary import papers_headline

    claims = cl.claimed_improvements(lit.load_literature(), "contrastive")
    reference = {"contrastive": pd.DataFrame({"improvement": [-2.0, 0.5, 3.0]})}

    def headline(frame: pd.DataFrame) -> str | None:
        papers = SimpleNamespace(claimed={"contrastive": frame}, reference=reference, ours={"contrastive": []})
        return papers_headline(SimpleNamespace(papers=papers))

    assert headline(claims) == (
        "- **Papers vs reality:** papers claimed a median +86% R@1 over contrastive against the contrastive number "
        "their own paper reports (n = 9 claims from 2 papers; a claim is one paper's number for one loss, dataset, "
        "backbone and embedding size); 26 claims have neither baseline and are not counted; the Reality Check and "
        "the thesis re-measured a median +0.5% (n = 3: each loss on each dataset in each study)."
    )
    borrowed = claims.copy()
    hyp = borrowed.index[borrowed["loss"] == "hyp_vit"]
    borrowed.loc[hyp, ["baseline_kind", "improvement"]] = [cl.BORROWED, 10.0]
    assert (
        "; 4 claims set against other papers' contrastive numbers at the same backbone and size give a median "
        "+10%; 22 claims have neither" in headline(borrowed)
    )
    assert headline(claims[claims["baseline_kind"] == cl.NONE]) is None
