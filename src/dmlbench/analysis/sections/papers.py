"""Papers versus reality: published R@1, each claimed gain with the baseline it is set against
(marked † where that baseline is borrowed from other papers), our relative improvements over the
baselines, and the claimed-vs-re-measured figures."""

from __future__ import annotations

import pandas as pd

from dmlbench.analysis import literature as lit
from dmlbench.analysis.numbers import BASELINES, Analysis, dated
from dmlbench.analysis.plots import papers as plots
from dmlbench.analysis.sections.base import Document, Section, demo_note
from dmlbench.analysis.text import format_signed_interval, markdown_table, signed_percent


def write(analysis: Analysis, doc: Document) -> None:
    papers = analysis.papers
    literature = lit.top1(papers.literature)
    lines = [
        "Deep metric learning papers claim large gains over the contrastive and triplet losses; re-run under one "
        "protocol, the gains mostly vanish (Musgrave et al., *A Metric Learning Reality Check*, ECCV 2020; "
        "Psomas, *Metric Learning: A Deep Dive*, 2020). The published numbers come from "
        "`src/dmlbench/analysis/literature.csv`: every row cites its source, and numbers recalled rather than "
        "read from the paper are marked uncertain (hollow markers). A claim is compared with the baseline "
        "number its own paper reports when it has one, else with the median of what other papers reported up to "
        f"that year, a borrowed baseline marked {BORROWED} in the claims table and in the figure; either only with "
        "numbers of the claim's backbone family (CNN or ViT), so a ViT-era claim gets no improvement over "
        "CNN-era baselines.",
        "",
    ]
    rows = []
    for loss in analysis.params.losses:
        for dataset in lit.DATASETS:
            cells = _published_cells(literature, loss, dataset)
            if cells is not None:
                rows.append([analysis.names[loss], lit.DATASET_LABELS.get(dataset, dataset), *cells])
    if rows:
        lines += [
            "Published R@1 (= P@1, %) of the losses in this grid. Claimed: the loss's own paper (backbone-dim; "
            "`?` = not verified; papers give no n and no interval), or for an old loss the range other papers "
            "reported for it as their baseline. Reality Check: BN-Inception, 4-fold "
            "cross-validation models concatenated to 512-d, mean ± 95% CI half-width over its runs (n=10), as "
            "published. Thesis: BN-Inception 512-d, one run each.",
            "",
            markdown_table(["loss", "dataset", "claimed", "Reality Check", "thesis"], rows, "llrrr"),
            "",
        ]
    lines += claims_lines(papers.claimed)
    ours_rows = []
    frames = [papers.ours[b] for b in BASELINES if len(papers.ours[b])]
    pairs = [f"n={r.interval.n_a} vs {r.interval.n_b}" for frame in frames for r in frame.itertuples()]
    shared = max(set(pairs), key=pairs.count) if pairs else ""
    for baseline in BASELINES:
        frame = papers.ours[baseline]
        for r in frame.itertuples():
            interval = r.interval
            n = f"n={interval.n_a} vs {interval.n_b}"
            ours_rows.append(
                [
                    r.display,
                    f"{r.dataset}/{r.backbone}/{analysis.dim}",
                    baseline,
                    format_signed_interval(interval.estimate, interval.low, interval.high, "" if n == shared else n),
                ]
            )
    if ours_rows:
        lines += [
            f"Our runs: relative P@1 improvement over the baselines at dim {analysis.dim} (delta-method "
            f"{int(analysis.params.evaluate.confidence * 100)}% t-interval; {shared.replace('n=', 'n = ')} seeds "
            "unless a cell states its own n):",
            "",
            markdown_table(["loss", "cell", "over", "relative improvement"], ours_rows, "lllr"),
            "",
        ]
        note = demo_note(analysis.params)
        if note:
            lines += [f"> {note}", ""]
    else:
        lines += [
            f"> Our relative improvements need contrastive or triplet in the grid; this grid has neither at dim "
            f"{analysis.dim}.",
            "",
        ]
    doc.add(*lines)
    _figures(analysis, doc)


def _figures(analysis: Analysis, doc: Document) -> None:
    papers = analysis.papers
    label = ours_label(analysis)
    doc.figure(
        "papers_vs_reality",
        lambda p: plots.papers_vs_reality(
            compared(papers.claimed), papers.reference, {b: dated(f) for b, f in papers.ours.items()}, p, label
        ),
        "Relative R@1 improvement over contrastive (left) and triplet (right) by the year the loss was published: "
        "(a) as claimed by papers, against the baseline number the claiming paper reports, (b) as re-measured "
        "under one protocol by the Reality Check, the thesis and our runs - "
        + _papers_sentence(analysis)
        + borrowed_caption(papers.claimed),
    )
    reference_rows = lit.reference_rows(lit.top1(papers.literature)).assign(
        year=lambda d: d["loss"].map(lambda x: lit.loss_year(x, papers.methods))
    )
    reference_rows = reference_rows[reference_rows["year"].notna()]  # "pretrained" has no year
    claims = lit.top1(papers.literature)
    claims = claims[claims["kind"].isin(["claimed", "baseline"])].assign(
        display=lambda d: d["loss"].map(lambda x: lit.display_name(x, papers.methods))
    )
    doc.figure(
        "papers_claims",
        lambda p: plots.papers_absolute(claims, reference_rows, dated(papers.ours_absolute), p, label),
        "Absolute R@1 by year: the numbers papers claimed for their losses (red), the contrastive and triplet "
        "numbers they compared against (grey), the same losses re-run under one protocol (blue, green), and our "
        "runs (black) - the baselines papers reported are far below what the old losses reach when trained well.",
    )


def _published_cells(literature: pd.DataFrame, loss: str, dataset: str) -> list[str] | None:
    """[claimed, Reality Check, thesis] cells of the papers table; None when nothing is published."""
    rows = literature[(literature["loss"] == loss) & (literature["dataset"] == dataset)]
    claims = rows[rows["kind"] == "claimed"]
    baselines = rows[rows["kind"] == "baseline"]
    rc = rows[(rows["paper"] == lit.REALITY_CHECK) & (rows["setting"] == "rc_concatenated")]
    thesis = rows[
        (rows["paper"] == lit.THESIS)
        & (rows["setting"] == "test_selection")
        & (rows["backbone"] == "bn_inception")
        & (rows["dim"] == 512)
    ]
    if claims.empty and baselines.empty and rc.empty and thesis.empty:
        return None
    claimed = "; ".join(
        f"{c.value:g}{'?' if c.uncertain else ''} ({c.backbone or 'n/s'}-{'' if pd.isna(c.dim) else c.dim})"
        for c in claims.itertuples()
    )
    if not claimed and len(baselines):
        claimed = (
            f"as a baseline: {baselines['value'].min():g}-{baselines['value'].max():g} "
            f"({baselines['paper'].nunique()} papers)"
        )
    half_width = float(rc["half_width"].iloc[0]) if len(rc) else float("nan")
    return [
        claimed or "-",
        "-" if rc.empty else f"{rc['value'].iloc[0]:.2f}" + ("" if pd.isna(half_width) else f" ± {half_width:.2f}"),
        "-" if thesis.empty else f"{thesis['value'].iloc[0]:.2f}",
    ]


BORROWED = plots.BORROWED
CLAIM_KEY = ["loss", "paper", "dataset", "backbone", "dim", "value"]


def _claim_rows(claimed: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per claim: its keys, year, display, uncertain, and per baseline b the columns
    ``{b}_value``, ``{b}_borrowed``, ``{b}_papers``, ``{b}_improvement`` (NaN where b has none)."""
    merged, shared = None, [*CLAIM_KEY, "year", "display", "uncertain"]
    for baseline, frame in claimed.items():
        if frame.empty:
            continue
        part = frame.assign(dim=frame["dim"].astype("string"))[
            [*shared, "baseline_value", "borrowed", "baseline_papers", "improvement"]
        ].rename(
            columns={
                "baseline_value": f"{baseline}_value",
                "borrowed": f"{baseline}_borrowed",
                "baseline_papers": f"{baseline}_papers",
                "improvement": f"{baseline}_improvement",
            }
        )
        merged = part if merged is None else merged.merge(part, on=shared, how="outer")
    if merged is None:
        return pd.DataFrame()
    order = {d: i for i, d in enumerate(lit.DATASETS)}
    merged = merged.assign(order=merged["dataset"].map(order))
    return merged.sort_values(["year", "display", "order"], kind="stable").drop(columns="order").reset_index(drop=True)


def _gain(row: pd.Series, baseline: str) -> str:
    if pd.isna(row.get(f"{baseline}_value")):
        return "-"
    papers = int(row[f"{baseline}_papers"]) if row[f"{baseline}_borrowed"] else 0
    mark = f"{BORROWED} ({papers} paper{'' if papers == 1 else 's'})" if papers else ""
    return f"{row[f'{baseline}_improvement']:+.0f}% vs {row[f'{baseline}_value']:g}{mark}"


def _claimed_cell(row: pd.Series) -> str:
    cell = "-".join(part for part in (row["backbone"], "" if pd.isna(row["dim"]) else row["dim"]) if part)
    return f"{row['value']:g}{'?' if row['uncertain'] else ''} ({cell or 'n/s'})"


def compared(claimed: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The claims with an improvement (a baseline of their backbone family), as the figure plots them."""
    return {b: f[f["improvement"].notna()] if len(f) else f for b, f in claimed.items()}


def _uncompared_note(rows: pd.DataFrame, baselines: list[str]) -> list[str]:
    """A sentence naming the claims with no baseline of their own backbone family, and why."""
    missing = rows[rows[[f"{b}_value" for b in baselines]].isna().all(axis=1)]
    if missing.empty:
        return []
    reasons: dict[str, list[str]] = {}
    for (display, year, backbone), part in missing.groupby(["display", "year", "backbone"], sort=False):
        datasets = ", ".join(lit.DATASET_LABELS.get(d, d) for d in part["dataset"])
        family = lit.backbone_family(backbone, int(year))
        reason = (
            f"no {' or '.join(baselines)} number of a {lit.FAMILY_LABELS[family]} backbone was published up to "
            "their year"
            if family
            else "the paper names no backbone"
        )
        who = f"{display} {year} ({backbone or 'backbone not given'}: {datasets})"
        reasons.setdefault(reason, []).append(who)
    parts = [f"{', '.join(who)}: {reason}" for reason, who in reasons.items()]
    return [
        "No improvement (`-`) for claims with no baseline of their own backbone family - " + "; ".join(parts) + ".",
        "",
    ]


def claims_lines(claimed: dict[str, pd.DataFrame]) -> list[str]:
    """The claims table: per claim, the gain over each baseline and the baseline number it is set
    against, marked † where the claiming paper reports none (borrowed from other papers), ``-`` where
    no baseline of the claim's backbone family exists (named in a note below the table)."""
    rows = _claim_rows(claimed)
    if rows.empty:
        return []
    baselines = [b for b in claimed if f"{b}_value" in rows.columns]
    table = [
        [
            r["display"],
            f"{r['paper'].split(',', 1)[0]} {r['year']}",
            lit.DATASET_LABELS.get(r["dataset"], r["dataset"]),
            _claimed_cell(r),
            *[_gain(r, b) for b in baselines],
        ]
        for _, r in rows.iterrows()
    ]
    counts = "; ".join(
        f"over {b}: {int(rows[f'{b}_borrowed'].fillna(False).astype(bool).sum())} of "
        f"{int(rows[f'{b}_value'].notna().sum())}"
        for b in baselines
    )
    return [
        "Claimed gains (relative R@1 improvement, as plotted in panel (a) of the figure below) and the baseline "
        f"R@1 each is computed against. {BORROWED} = borrowed baseline: the claiming paper reports no number for "
        "that baseline on that dataset, so the gain is computed against the median of the numbers other papers "
        "(how many: in brackets) reported for it up to the claim's year, all backbones of the claim's family "
        f"(CNN or ViT) and sizes pooled - a comparison the claiming paper never made ({counts} claims).",
        "",
        markdown_table(
            ["loss", "paper", "dataset", "claimed R@1", *[f"over {b}" for b in baselines]],
            table,
            "llll" + "r" * len(baselines),
        ),
        "",
        *_uncompared_note(rows, baselines),
    ]


def borrowed_caption(claimed: dict[str, pd.DataFrame]) -> str:
    """The caption's per-claim account of panel (a)'s borrowed baselines, e.g. `` Points marked † in
    (a) set a claim against ...: over contrastive N-pair, Margin (CUB200, Cars196) (k of n claims);
    over triplet ...``; empty when every claim has its own paper's baseline."""
    parts = []
    for baseline, frame in compared(claimed).items():
        if frame.empty or not frame["borrowed"].any():
            continue
        names = []
        for display, claims in frame.groupby("display", sort=False):
            borrowed = claims[claims["borrowed"]]
            if borrowed.empty:
                continue
            if len(borrowed) == len(claims):
                names.append(display)
            else:
                datasets = ", ".join(dict.fromkeys(lit.DATASET_LABELS.get(d, d) for d in borrowed["dataset"]))
                names.append(f"{display} ({datasets})")
        parts.append(f"over {baseline} {', '.join(names)} ({int(frame['borrowed'].sum())} of {len(frame)} claims)")
    if not parts:
        return ""
    return (
        f" Points marked {BORROWED} in (a) set a claim against the median of other papers' numbers up to its "
        f"year because its own paper reports none (claims table above): {'; '.join(parts)}."
    )


def ours_label(analysis: Analysis) -> str:
    cells = analysis.papers.ours_absolute
    if cells.empty:
        return "our runs"
    datasets = ", ".join(dict.fromkeys(cells["dataset"]))
    return f"our runs ({datasets}, dim {analysis.dim})"


def _papers_sentence(analysis: Analysis) -> str:
    papers = analysis.papers
    claims = compared(papers.claimed)["contrastive"]
    reference = papers.reference["contrastive"]
    text = ""
    if len(claims):
        text += (
            f"papers claim {claims['improvement'].min():+.0f}% to {claims['improvement'].max():+.0f}% over contrastive"
        )
    if len(reference):
        text += f", re-runs measure {reference['improvement'].min():+.0f}% to {reference['improvement'].max():+.0f}%"
    ours = papers.ours["contrastive"]
    if len(ours):  # as the table of our runs prints them
        text += (
            f", our runs {signed_percent(min(i.estimate for i in ours['interval']))} to "
            f"{signed_percent(max(i.estimate for i in ours['interval']))} (table above)"
        )
    return (text or "no claims to compare") + "."


SECTION = Section("Papers versus reality", "Papers vs reality", write)
