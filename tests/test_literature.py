"""The published-numbers data files: schema validation, cross-checks with the sources, improvement arithmetic."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dmlbench.analysis import claims as cl
from dmlbench.analysis import literature as lit
from dmlbench.errors import DataError

# the 14 methods the Reality Check ran (params.yaml, protocols.reality_check)
RC_METHODS = {
    "contrastive", "triplet", "ntxent", "proxy_nca", "margin", "margin_per_class", "normalized_softmax",
    "cosface", "arcface", "fastap", "snr", "multi_similarity_without_miner", "multi_similarity", "soft_triple",
}  # fmt: skip


@pytest.fixture(scope="module")
def literature() -> pd.DataFrame:
    return lit.load_literature()


def _lookup(literature, **where) -> float:
    rows = literature
    for column, value in where.items():
        rows = rows[rows[column] == value]
    assert len(rows) == 1, where
    return float(rows["value"].iloc[0])


def test_every_row_is_sourced_and_typed(literature):
    assert set(literature["kind"]) == set(lit.KINDS)
    assert literature["source"].str.len().min() > 5
    assert literature["value"].between(0, 100).all()
    # the thesis's R@1 tables: 7 tables (CUB x 3 backbones, Cars x 3, SOP x BN-Inception) x 4 dims x 10 losses
    thesis = literature[(literature["paper"] == lit.THESIS) & (literature["setting"] == "test_selection")]
    assert len(thesis) == 280 and thesis.groupby(["dataset", "backbone", "dim"]).size().eq(10).all()
    # the Reality Check tables: 3 datasets x 15 methods x (concatenated, separated) x 3 metrics
    rc = literature[(literature["paper"] == lit.REALITY_CHECK) & literature["setting"].str.startswith("rc_c")]
    assert len(rc) == 3 * 15 * 3
    # numbers read off a figure are flagged
    assert literature[literature["setting"] == "rc_figure_mapr"]["uncertain"].all()


def test_every_row_names_a_paper_table_or_an_official_repository_file(literature):
    """A row's source is a paper's table, figure or section (the Reality Check, the thesis), or a
    repository file at a commit; no row cites a work item, a memory or a reference note. A number
    read in another paper's table than its own is flagged uncertain and says so."""
    text = literature[["paper", "source", "note"]].astype(str).agg(" ".join, axis=1)
    for word in ("issue", "recalled", "notes", "not checked", "Papers with Code"):
        assert not text.str.contains(word, case=False).any(), word
    paper = literature["source"].str.match(r"(Musgrave et al\. 2020 \(arXiv:2003\.08505\) Table [4-6]|Psomas 2020)")
    repository = literature["source"].str.match(r"[\w-]+/[\w.-]+ \S+\.(md|png) at [0-9a-f]{7}\b")
    assert (paper | repository).all(), literature.loc[~(paper | repository), "source"].unique()
    secondary = literature["source"].str.contains("not read in")
    assert literature.loc[secondary, "uncertain"].all()
    assert set(literature.loc[literature["uncertain"] & ~secondary, "setting"]) == {"rc_figure_mapr"}
    # SEE and every 2021+ method has its authors and title
    recent = literature[(literature["year"] >= 2021) & (literature["loss"] != "pretrained")]
    assert set(recent["paper"].str.split(",").str[0]) == {"Ermolov et al.", "An et al.", "Le & Woo"}


def test_published_intervals_are_a_column_that_matches_the_notes_and_the_paper(literature):
    """The Reality Check's Tables 4-6 print mean ± 95% half-width over 10 runs for every trained loss
    (3 datasets x 14 losses x 6 columns = 252 cells); the pretrained trunk (no training runs) and
    the numbers read off its MAP@R figure (which draws no interval) have none, and say so."""
    rc = literature[literature["paper"] == lit.REALITY_CHECK]
    assert len(rc) == 312
    with_interval = rc[rc["half_width"].notna()]
    assert len(with_interval) == 3 * 14 * 6 and (with_interval["n_published"] == 10).all()
    assert set(with_interval["setting"]) == {"rc_concatenated", "rc_separated"}
    without = rc[rc["half_width"].isna()]
    assert len(without) == 60 and without["n_published"].isna().all()
    assert set(without[without["setting"] != "rc_figure_mapr"]["loss"]) == {"pretrained"}
    assert (without["setting"] == "rc_figure_mapr").sum() == 42
    assert without["note"].str.contains("no interval: ").all()
    # no other paper publishes an interval: a claim, a baseline or a thesis run is one number
    assert literature[literature["paper"] != lit.REALITY_CHECK]["half_width"].isna().all()
    # the column is the note's "95% CI half-width x" wherever the note quotes one
    for note, column in zip(literature["note"], literature["half_width"], strict=True):
        quoted = lit.note_half_width(note)
        assert (quoted is None and pd.isna(column)) or quoted == column, (note, column)
    # and the paper's (Musgrave et al. 2020, Tables 4-6): first and last rows, both settings, the widest
    rc_cell = dict(paper=lit.REALITY_CHECK)
    for loss, dataset, setting, metric, value, half in [
        ("contrastive", "cub200", "rc_concatenated", "precision_at_1", 68.13, 0.31),
        ("soft_triple", "cub200", "rc_separated", "map_at_r", 21.31, 0.14),
        ("margin_per_class", "cars196", "rc_separated", "map_at_r", 15.88, 0.39),
        ("multi_similarity_without_miner", "cars196", "rc_concatenated", "map_at_r", 28.07, 0.22),
        ("arcface", "sop", "rc_separated", "precision_at_1", 70.88, 1.51),
        ("snr", "sop", "rc_concatenated", "r_precision", 47.43, 0.13),
    ]:
        where = dict(rc_cell, loss=loss, dataset=dataset, setting=setting, metric=metric)
        assert _lookup(literature, **where) == value
        assert _lookup(literature.assign(value=literature["half_width"]), **where) == half
    # the grid's view carries them: the Reality Check's 128-d cells with their half-width and n
    published = lit.published_for(literature, "reality_check")
    trained = published[published["loss"] != "pretrained"]
    assert trained["half_width"].notna().all() and (trained["n_published"] == 10).all()
    assert lit.published_for(literature, "thesis")["half_width"].isna().all()


def test_numbers_agree_with_the_sources_prose(literature):
    """Values the thesis quotes in its text match its tables; the Reality Check table matches its slides."""
    thesis = dict(paper=lit.THESIS, setting="test_selection", metric="recall_at_1")
    # §4.1.2: "SoftTriple ... while we report R@1 equal to 66.76" (BN-Inception, 512, CUB)
    assert (
        _lookup(literature, **thesis, loss="soft_triple", dataset="cub200", backbone="bn_inception", dim=512) == 66.76
    )
    # §4.1.2: "we report a R@1 equal to 56.98% for ProxyNCA" (Table 7a)
    assert _lookup(literature, **thesis, loss="proxy_nca", dataset="cub200", backbone="bn_inception", dim=64) == 56.98
    # §4.1.4: "while we report 85.29%" (SoftTriple, Cars, BN-Inception 512) and Margin "81.98%"
    assert (
        _lookup(literature, **thesis, loss="soft_triple", dataset="cars196", backbone="bn_inception", dim=512) == 85.29
    )
    assert _lookup(literature, **thesis, loss="margin", dataset="cars196", backbone="bn_inception", dim=512) == 81.98
    rc = dict(paper=lit.REALITY_CHECK, metric="precision_at_1")
    assert _lookup(literature, **rc, loss="contrastive", dataset="cub200", setting="rc_concatenated") == 68.13
    assert _lookup(literature, **rc, loss="cosface", dataset="cars196", setting="rc_separated") == 74.67
    # the claim the thesis quotes for SoftTriple equals the claimed row
    assert _lookup(literature, kind="claimed", loss="soft_triple", dataset="cub200") == 65.4


def test_every_claim_is_counted_once_and_own_and_borrowed_baselines_apart_on_the_real_file(literature):
    """Hand-counted on literature.csv: 39 claimed R@1 rows - ProxyNCA 1, Margin 1, Normalized Softmax 6
    (2 sizes x 3 datasets), Multi-Similarity 4, SoftTriple 2, Proxy-Anchor 10 (4 from its paper's
    tables + 6 from its README, of which the 4 BN-Inception 512-d ones repeat the paper's cells),
    the thesis 3, Hyp-ViT 4, SEE 4, Unicom 4 - are 35 claims. Over contrastive, Zhai & Wu report
    contrastive on CUB200, Cars196 and SOP (6 claims) and the thesis ran it beside its loss (3): 9
    own; no baseline row names a backbone and a size, so none is borrowed; 26 have neither. Over
    triplet only the thesis has its own number: 3."""
    counts = {b: cl.count_claims(cl.claimed_improvements(literature, b)) for b in ("contrastive", "triplet")}
    assert counts["contrastive"] == cl.ClaimCounts(
        claims=35, rows=39, own=9, borrowed=0, none=26, papers_own=2, papers_borrowed=0
    )
    assert counts["triplet"] == cl.ClaimCounts(
        claims=35, rows=39, own=3, borrowed=0, none=32, papers_own=1, papers_borrowed=0
    )
    contrastive = cl.claimed_improvements(literature, "contrastive")
    # Proxy-Anchor's paper and README print the BN-Inception 512-d CUB200 cell: one claim, the paper's 68.4
    pa = contrastive[(contrastive["loss"] == "proxy_anchor") & (contrastive["dataset"] == "cub200")]
    assert sorted(zip(pa["backbone"], pa["value"], pa["rows"], strict=True)) == [
        ("bn_inception", 68.4, 2),
        ("resnet50", 69.9, 1),
    ]
    # the median over the 9 own-baseline claims, by hand: the 5th of
    # +1.06 (77.92/77.10) +3.38 (65.42/63.28) +6.36 (84.12/79.09) +79.0 (75.2/42) +86.2 (78.2/42)
    # +114 (56.5/26.4) +132 (61.3/26.4) +276 (81.6/21.7) +288 (84.2/21.7)
    assert cl.median_improvement(contrastive, cl.OWN) == pytest.approx(100 * (78.2 / 42 - 1))
    assert math.isnan(cl.median_improvement(contrastive, cl.BORROWED))
    own = contrastive[contrastive["baseline_kind"] == cl.OWN].set_index(["loss", "dataset", "dim"])
    assert own.loc[("thesis_proxy", "cub200", 512), "baseline_value"] == 63.28  # the thesis's own run, same cell
    assert own.loc[("normalized_softmax", "cars196", 128), "improvement"] == pytest.approx(100 * (81.6 / 21.7 - 1))
    none = contrastive[contrastive["baseline_kind"] == cl.NONE]
    assert none["improvement"].isna().all() and (none["baseline_papers"] == 0).all() and not none["borrowed"].any()


def _synthetic(tmp_path, rows: list[tuple]) -> pd.DataFrame:
    """A literature.csv of (loss, paper, year, dataset, backbone, dim, setting, value, kind) rows."""
    records = []
    for loss, paper, year, dataset, backbone, dim, setting, value, kind in rows:
        record = dict.fromkeys(lit.LITERATURE_COLUMNS, "")
        record.update(loss=loss, paper=paper, venue="V", year=str(year), dataset=dataset, backbone=backbone,
                      dim=str(dim), setting=setting, metric="recall_at_1", value=str(value), kind=kind,
                      source="paper table", uncertain="false")  # fmt: skip
        records.append(record)
    path = tmp_path / "literature.csv"
    pd.DataFrame(records, columns=list(lit.LITERATURE_COLUMNS)).to_csv(path, index=False)
    return lit.load_literature(path)


SYNTHETIC = [
    # P1 claims CUB200 in its table and again (better) in its README: one claim, valued 60 (its table)
    ("multi_similarity", "P1", 2019, "cub200", "bn_inception", 512, "as_published", 60.0, "claimed"),
    ("multi_similarity", "P1", 2019, "cub200", "bn_inception", 512, "official_readme", 62.0, "claimed"),
    ("contrastive", "P1", 2019, "cub200", "", "", "as_published", 30.0, "baseline"),  # its own: +100%
    # P1 claims Cars196 and reports no contrastive there: borrowed from P2 and P3 (same cell, earlier)
    ("multi_similarity", "P1", 2019, "cars196", "bn_inception", 512, "as_published", 80.0, "claimed"),
    ("contrastive", "P2", 2018, "cars196", "bn_inception", 512, "as_published", 40.0, "baseline"),
    ("contrastive", "P3", 2018, "cars196", "bn_inception", 512, "as_published", 50.0, "baseline"),
    ("contrastive", "P4", 2018, "cars196", "bn_inception", 64, "as_published", 10.0, "baseline"),  # other size
    ("contrastive", "P5", 2020, "cars196", "bn_inception", 512, "as_published", 70.0, "baseline"),  # later
    ("contrastive", "P6", 2018, "cars196", "", "", "as_published", 20.0, "baseline"),  # no cell named
    ("contrastive", "P7", 2018, "cars196", "bn_inception", 512, "rc_concatenated", 65.0, "reproduction"),  # a re-run
    # P8 claims SOP; nobody reports contrastive on SOP: neither baseline
    ("margin", "P8", 2017, "sop", "resnet50", 128, "as_published", 70.0, "claimed"),
    # P9 names no size: another paper's number at resnet50 without a size cannot be matched
    ("margin", "P9", 2019, "cub200", "resnet50", "", "as_published", 50.0, "claimed"),
    ("contrastive", "P10", 2018, "cub200", "resnet50", "", "as_published", 25.0, "baseline"),
]


def test_the_claim_counter_on_a_small_table_counts_each_claim_once_and_own_and_borrowed_apart(tmp_path):
    literature = _synthetic(tmp_path, SYNTHETIC)
    found = cl.claimed_improvements(literature, "contrastive").set_index(["paper", "dataset"])
    assert len(found) == 4  # 5 claimed rows, the README row repeating P1's CUB200 cell
    p1 = found.loc[("P1", "cub200")]
    assert (p1["value"], p1["rows"], p1["setting"]) == (60.0, 2, "as_published")
    assert (p1["baseline_kind"], p1["baseline_value"], p1["improvement"]) == (cl.OWN, 30.0, 100.0)
    cars = found.loc[("P1", "cars196")]
    assert (cars["baseline_kind"], cars["baseline_value"], cars["baseline_papers"]) == (cl.BORROWED, 45.0, 2)
    assert cars["borrowed"] and cars["improvement"] == pytest.approx(100 * (80 / 45 - 1))
    assert cars["baseline_from"] == "median of 2 other papers at bn_inception-512"
    for key in (("P8", "sop"), ("P9", "cub200")):
        assert found.loc[key, "baseline_kind"] == cl.NONE and math.isnan(found.loc[key, "improvement"])
    assert found.loc[("P9", "cub200"), "baseline_from"] == (
        "none: its paper reports no contrastive number and no other paper one at resnet50-size not given"
    )
    counts = cl.count_claims(found.reset_index())
    assert counts == cl.ClaimCounts(claims=4, rows=5, own=1, borrowed=1, none=2, papers_own=1, papers_borrowed=1)
    assert cl.median_improvement(found.reset_index(), cl.OWN) == 100.0
    # without P1's own CUB200 contrastive the claim has neither (no other paper reports CUB200 at its cell)
    alone = _synthetic(tmp_path, [r for r in SYNTHETIC if r[1:4] != ("P1", 2019, "cub200") or r[-1] == "claimed"])
    assert cl.count_claims(cl.claimed_improvements(alone, "contrastive")) == cl.ClaimCounts(4, 5, 0, 1, 3, 0, 1)
    assert cl.count_claims(cl.claimed_improvements(literature.iloc[0:0], "contrastive")) == cl.ClaimCounts(
        0, 0, 0, 0, 0, 0, 0
    )


def test_a_claim_is_never_set_against_a_baseline_of_another_backbone_or_size(literature):
    """Hyp-ViT (ViT-S/16, 384-d) gets no improvement from the CNN papers' contrastive numbers; a
    contrastive CUB200 number published for a ViT-S/16 at 384-d before 2022 would be its borrowed
    baseline, one at another size would not; the CNN claims keep their own baselines."""
    claims = cl.claimed_improvements(literature, "contrastive")
    hyp = claims[claims["loss"] == "hyp_vit"]
    assert len(hyp) == 4 and (hyp["baseline_kind"] == cl.NONE).all()
    vit = literature.iloc[[0]].assign(
        loss="contrastive", paper="A ViT paper", year=2021, dataset="cub200", backbone="vit_s16", kind="baseline",
        value=70.0, setting="as_published", metric="recall_at_1",
    )  # fmt: skip
    for dim, expected in ((384, cl.BORROWED), (768, cl.NONE)):
        claims = cl.claimed_improvements(pd.concat([literature, vit.assign(dim=dim)]), "contrastive")
        hyp = claims[(claims["loss"] == "hyp_vit") & (claims["dataset"] == "cub200")].iloc[0]
        assert hyp["baseline_kind"] == expected, dim
    assert hyp["improvement"] != hyp["improvement"]  # NaN at 768-d
    hyp = cl.claimed_improvements(pd.concat([literature, vit.assign(dim=384)]), "contrastive")
    hyp = hyp[(hyp["loss"] == "hyp_vit") & (hyp["dataset"] == "cub200")].iloc[0]
    assert hyp["improvement"] == pytest.approx(100 * (85.6 / 70 - 1)) and hyp["baseline_papers"] == 1
    assert cl.count_claims(claims).own == 9  # the CNN claims' own baselines are unchanged


def test_methods_csv_says_which_2020_study_ran_each_loss_as_their_rows_show(literature):
    """``studies_2020`` (the frozen-vs-trained section's tiers) agrees with the Reality Check's and
    the thesis's own rows in literature.csv, loss by loss."""
    methods = lit.load_methods()
    for loss in methods.loc[methods["registered"].astype(bool), "loss"]:
        ran = tuple(
            sorted(
                key
                for key, paper in lit.STUDIES_2020.items()
                if (literature[literature["loss"] == loss]["paper"] == paper).any()
            )
        )
        assert lit.studies_2020(loss, methods) == ran, loss
    assert {loss for loss in methods["loss"] if "reality_check" in lit.studies_2020(loss, methods)} == RC_METHODS


def _write(tmp_path, rows: list[list[str]], header=lit.LITERATURE_COLUMNS):
    frame = pd.DataFrame(rows, columns=list(header))
    path = tmp_path / "literature.csv"
    frame.to_csv(path, index=False)
    return path


GOOD = [
    "triplet",
    "P",
    "CVPR",
    "2016",
    "cub200",
    "googlenet",
    "64",
    "as_published",
    "recall_at_1",
    "36.1",
    "",
    "",
    "baseline",
    "src",
    "false",
    "",
]


@pytest.mark.parametrize(
    "column, value, message",
    [
        (
            "dataset",
            "cub",
            r"literature.csv:3: dataset: Input should be 'cub200', 'cars196', 'sop' or 'inshop' \(got 'cub'\)",
        ),
        ("value", "136.1", r"literature.csv:3: value: Input should be less than or equal to 100 \(got '136.1'\)"),
        ("uncertain", "maybe", r"literature.csv:3: uncertain: must be true or false \(got 'maybe'\)"),
        ("kind", "guess", r"literature.csv:3: kind: Input should be 'claimed', 'baseline' or 'reproduction'"),
        ("year", "20x6", r"literature.csv:3: year: Input should be a valid integer"),
        ("loss", "tripplet", r"literature.csv:3: loss: 'tripplet' is not in methods.csv; add it there first"),
        ("metric", "nmi", r"literature.csv:3: metric: Input should be"),
        ("half_width", "-0.3", r"literature.csv:3: half_width: Input should be greater than or equal to 0"),
        ("half_width", "0.3", r"literature.csv:3: n_published: half_width and n_published are given together"),
        ("n_published", "10", r"literature.csv:3: n_published: half_width and n_published are given together"),
        ("note", "95% CI half-width 0.3", r"literature.csv:3: note: quotes a 95% CI half-width of 0.3 but half_width"),
    ],
)
def test_bad_rows_fail_in_one_line_naming_line_and_column(tmp_path, column, value, message):
    bad = list(GOOD)
    bad[lit.LITERATURE_COLUMNS.index(column)] = value
    good_two = list(GOOD)
    good_two[lit.LITERATURE_COLUMNS.index("dim")] = "128"
    path = _write(tmp_path, [good_two, bad])
    with pytest.raises(DataError, match=message) as info:
        lit.load_literature(path)
    assert "\n" not in str(info.value)


def test_duplicate_rows_and_bad_headers_are_rejected(tmp_path):
    path = _write(tmp_path, [GOOD, GOOD])
    with pytest.raises(DataError, match=r"literature.csv:3: the same loss/paper/setting/dataset/backbone/dim/metric"):
        lit.load_literature(path)
    path.write_text("loss,value\ntriplet,36.1\n")
    with pytest.raises(DataError, match="header must be loss,paper,venue"):
        lit.load_literature(path)
    with pytest.raises(DataError, match="file not found"):
        lit.load_literature(tmp_path / "missing.csv")
    loaded = lit.load_literature(_write(tmp_path, [GOOD]))
    assert loaded["year"].iloc[0] == 2016 and loaded["dim"].iloc[0] == 64 and not loaded["uncertain"].iloc[0]
    assert pd.isna(loaded["half_width"].iloc[0]) and pd.isna(loaded["n_published"].iloc[0])
    with_interval = list(GOOD)
    for column, value in (("half_width", "0.3"), ("n_published", "10"), ("note", "95% CI half-width 0.3")):
        with_interval[lit.LITERATURE_COLUMNS.index(column)] = value
    loaded = lit.load_literature(_write(tmp_path, [with_interval]))
    assert loaded["half_width"].iloc[0] == 0.3 and loaded["n_published"].iloc[0] == 10
    with_interval[lit.LITERATURE_COLUMNS.index("n_published")] = "1"  # one run has no interval
    with pytest.raises(DataError, match=r"literature.csv:2: n_published: Input should be greater than or equal to 2"):
        lit.load_literature(_write(tmp_path, [with_interval]))


def test_recall_and_precision_at_one_are_one_metric():
    assert lit.canonical_metric("recall_at_1") == "precision_at_1"
    assert lit.canonical_metric("map_at_r") == "map_at_r"


def _registry_mismatches(literature: pd.DataFrame, methods: pd.DataFrame, registry) -> list[str]:
    """What breaks the report's lookup of published numbers by registry name. Methods marked
    ``registered: false`` in methods.csv (the untrained trunk, methods cited only for their
    numbers) are exempt from the first check and must not be registry losses."""
    cited_only = set(methods.loc[~methods["registered"].astype(bool), "loss"])
    published = set(literature["loss"]) - cited_only
    problems = [f"literature.csv loss {name!r} is not a registry loss" for name in sorted(published - set(registry))]
    problems += [
        f"registry loss {name!r} has no methods.csv row" for name in sorted(set(registry) - set(methods["loss"]))
    ]
    problems += [
        f"methods.csv marks registry loss {name!r} unregistered" for name in sorted(cited_only & set(registry))
    ]
    registered = set(methods["loss"]) - cited_only
    problems += [
        f"methods.csv loss {name!r} is marked registered but is not" for name in sorted(registered - set(registry))
    ]
    return problems


def test_every_published_method_is_a_registered_loss_and_every_loss_is_named(literature):
    """The report looks published numbers up by registry name: a loss renamed in one place and
    not the other silently loses its numbers (as ``nt_xent``/``fast_ap``/``psomas_proxy`` once
    did), so both directions are checked against the real registry."""
    from dmlbench.losses import LOSSES

    methods = lit.load_methods()
    assert _registry_mismatches(literature, methods, LOSSES) == []
    # each of the Reality Check's rows (14 methods + the pretrained trunk) meets a registered loss
    rc = literature[(literature["paper"] == lit.REALITY_CHECK) & (literature["setting"] == "rc_concatenated")]
    assert set(rc["loss"]) - {"pretrained"} == RC_METHODS
    for loss in set(literature["loss"]) - {"pretrained"}:
        assert lit.display_name(loss, methods) != loss and lit.loss_year(loss, methods) > 2000, loss
    # the thesis loss meets its claimed numbers (thesis Tables 17-19)
    own = literature[(literature["loss"] == "thesis_proxy") & (literature["kind"] == "claimed")]
    assert sorted(own["value"]) == [65.42, 77.92, 84.12]


def test_a_loss_renamed_on_either_side_fails_the_check(literature):
    from dmlbench.losses import LOSSES

    methods = lit.load_methods()
    renamed_registry = {("nt_xent" if name == "ntxent" else name): spec for name, spec in LOSSES.items()}
    assert _registry_mismatches(literature, methods, renamed_registry) == [
        "literature.csv loss 'ntxent' is not a registry loss",
        "registry loss 'nt_xent' has no methods.csv row",
        "methods.csv loss 'ntxent' is marked registered but is not",
    ]
    renamed_rows = literature.assign(loss=literature["loss"].replace({"fastap": "fast_ap"}))
    assert _registry_mismatches(renamed_rows, methods, LOSSES) == [
        "literature.csv loss 'fast_ap' is not a registry loss"
    ]
