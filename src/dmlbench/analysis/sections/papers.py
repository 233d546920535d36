"""Papers versus reality: published R@1, our relative improvements over the baselines, and the
claimed-vs-re-measured figures."""

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
        "number its own paper reports when it has one, else with the median of what papers reported up to that "
        "year.",
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
            "cross-validation models concatenated to 512-d, mean ± 95% CI as published. Thesis: BN-Inception "
            "512-d, one run each.",
            "",
            markdown_table(["loss", "dataset", "claimed", "Reality Check", "thesis"], rows, "llrrr"),
            "",
        ]
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
            papers.claimed, papers.reference, {b: dated(f) for b, f in papers.ours.items()}, p, label
        ),
        "Relative R@1 improvement over contrastive (left) and triplet (right) by the year the loss was published: "
        "(a) as claimed by papers against the baselines they reported, (b) as re-measured under one protocol by "
        "the Reality Check, the thesis and our runs - " + _papers_sentence(analysis),
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
    return [
        claimed or "-",
        "-" if rc.empty else f"{rc['value'].iloc[0]:.2f} ± {_rc_ci(rc['note'].iloc[0])}",
        "-" if thesis.empty else f"{thesis['value'].iloc[0]:.2f}",
    ]


def _rc_ci(note: str) -> str:
    marker = "95% CI half-width "
    return f"{float(note.split(marker, 1)[1]):.2f}" if marker in note else "?"


def ours_label(analysis: Analysis) -> str:
    cells = analysis.papers.ours_absolute
    if cells.empty:
        return "our runs"
    datasets = ", ".join(dict.fromkeys(cells["dataset"]))
    return f"our runs ({datasets}, dim {analysis.dim})"


def _papers_sentence(analysis: Analysis) -> str:
    papers = analysis.papers
    claims = papers.claimed["contrastive"]
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
