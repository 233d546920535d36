"""The published-numbers data files: schema validation, cross-checks with the sources, improvement arithmetic."""

from __future__ import annotations

import pandas as pd
import pytest

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
    # numbers read off a figure or recalled are flagged
    assert literature[literature["setting"] == "rc_figure_mapr"]["uncertain"].all()


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


def test_claimed_improvement_uses_the_papers_own_baseline_else_the_median_up_to_that_year(literature):
    methods = lit.load_methods()
    claims = lit.claimed_improvements(literature, "contrastive").set_index(["loss", "dataset", "backbone"])
    # Lifted Structure (CVPR 2016) reports contrastive 26.4 on CUB next to its own 47.2
    lifted = claims.loc[("lifted_structure", "cub200", "googlenet")]
    assert lifted["baseline_from"] == "same paper"
    assert lifted["improvement"] == pytest.approx(100 * (47.2 / 26.4 - 1))
    # Multi-Similarity (2019) reports no contrastive number here: the median of every contrastive CUB
    # baseline published up to 2019
    baselines = literature[
        (literature["kind"] == "baseline") & (literature["loss"] == "contrastive") & (literature["dataset"] == "cub200")
    ]
    expected = baselines[baselines["year"] <= 2019]["value"].median()
    ms = claims.loc[("multi_similarity", "cub200", "bn_inception")]
    assert (ms["baseline_value"] == expected).all() and expected == pytest.approx(26.8)
    # ... a borrowed baseline, flagged with how many papers it pools; an own baseline is not borrowed
    pooled = baselines[baselines["year"] <= 2019]["paper"].nunique()
    assert ms["borrowed"].all() and (ms["baseline_papers"] == pooled).all()
    assert not lifted["borrowed"] and lifted["baseline_papers"] == 1
    assert set(claims["borrowed"]) == {True, False}
    # the thesis's own loss is compared with the thesis's own contrastive run (63.28 at BN-Inception 512)
    own = claims.loc[("thesis_proxy", "cub200", "bn_inception")]
    assert own["baseline_value"] == 63.28 and own["baseline_from"] == "same paper"
    # re-runs: Proxy-Anchor vs contrastive inside the thesis's BN-Inception 512 CUB table
    reference = lit.reference_improvements(literature, "contrastive", methods)
    thesis = reference[reference["series"].str.startswith("Thesis") & (reference["dataset"] == "cub200")]
    row = thesis[thesis["loss"] == "proxy_anchor"].iloc[0]
    assert row["improvement"] == pytest.approx(100 * (68.11 / 63.28 - 1)) and row["year"] == 2020
    assert "pretrained" not in set(reference["loss"])  # no publication year


def test_a_vit_era_claim_gets_no_improvement_over_cnn_era_baselines(literature):
    """Hyp-ViT (ViT-S/16) and Unicom (ViT-L/14) are not set against the contrastive/triplet numbers of
    CNN papers, nor SEE and PFML, which name no backbone: their improvement is blank, and the claims
    table says why. CNN-era claims keep their borrowed median; a ViT baseline, were one published,
    would be used."""
    from dmlbench.analysis.sections.papers import claims_lines

    methods = lit.load_methods()
    claimed = {}
    for baseline in ("contrastive", "triplet"):
        claims = lit.claimed_improvements(literature, baseline)
        claimed[baseline] = claims.assign(display=claims["loss"].map(lambda x: lit.display_name(x, methods)))
        vit_era = claims[claims["loss"].isin(["hyp_vit", "unicom", "see", "pfml"])]
        assert len(vit_era) == 8 and set(vit_era["dataset"]) == {"cub200", "cars196", "sop"}
        assert vit_era["baseline_value"].isna().all() and vit_era["improvement"].isna().all()
        assert not vit_era["borrowed"].any() and (vit_era["baseline_papers"] == 0).all()
        hyp = vit_era[vit_era["loss"] == "hyp_vit"]["baseline_from"]
        assert (hyp == f"none: no {baseline} number of a ViT backbone published up to 2022").all()
        see = vit_era[vit_era["loss"] == "see"]["baseline_from"]
        assert see.str.startswith("none: the paper names no backbone").all()
        # every claim up to 2020 still has its improvement (the borrowed ones: CNN papers' median)
        assert claims[claims["year"] <= 2020]["improvement"].notna().all()
    text = "\n".join(claims_lines(claimed))
    hyp_row = next(r for r in text.splitlines() if r.startswith("| Hyp-ViT |") and "| CUB200 |" in r)
    assert hyp_row.endswith("| 85.6? (vit_s16) | - | - |")  # was "+219% vs 26.8† (8 papers)"
    assert "Hyp-ViT 2022 (vit_s16: CUB200, Cars196, SOP), Unicom 2023 (vit_l14_336: CUB200): no contrastive or " in text
    assert "PFML 2025 (backbone not given: Cars196)" in text
    # a contrastive CUB200 number published for a ViT before 2022 would be Hyp-ViT's borrowed baseline
    vit_baseline = literature.iloc[[0]].assign(
        loss="contrastive",
        paper="A ViT paper",
        year=2021,
        dataset="cub200",
        backbone="vit_b16",
        kind="baseline",
        value=70.0,
    )
    claims = lit.claimed_improvements(pd.concat([literature, vit_baseline]), "contrastive").set_index(
        ["loss", "dataset"]
    )
    hyp = claims.loc[("hyp_vit", "cub200")]
    assert hyp["baseline_value"] == 70.0 and hyp["borrowed"] and hyp["baseline_papers"] == 1
    assert hyp["improvement"] == pytest.approx(100 * (85.6 / 70 - 1))
    ms = claims.loc[("multi_similarity", "cub200"), "baseline_value"]  # CNN claims: unchanged
    assert list(ms) == pytest.approx([26.8] * len(ms))


def test_the_backbone_families_match_the_data(literature):
    """The family rule's premise: every backbone literature.csv names before 2021 is a CNN, so a row
    of those years naming none is counted a CNN; a ViT is ``vit_...``."""
    early = literature[(literature["year"] < lit.VIT_ERA_FROM) & (literature["backbone"] != "")]
    assert set(early["backbone"]) == {"googlenet", "bn_inception", "resnet50"}
    assert lit.backbone_family("", 2019) == lit.CNN and lit.backbone_family("", 2025) is None
    assert lit.backbone_family("vit_l14_dinov2", 2024) == lit.VIT and lit.backbone_family("resnet50", 2024) == lit.CNN


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
