"""Papers versus reality: published R@1, each claim's gain with the baseline it is set against (its
own paper's, or marked † other papers' at the same backbone and size), our relative improvements
over the baselines, and the claimed-vs-re-measured figures."""

from __future__ import annotations

import pandas as pd

from dmlbench.analysis import claims as cl
from dmlbench.analysis import literature as lit
from dmlbench.analysis.numbers import BASELINES, Analysis, dated
from dmlbench.analysis.plots import papers as plots
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.text import format_signed_interval, markdown_table, signed_percent


def write(analysis: Analysis, doc: Document) -> None:
    papers = analysis.papers
    literature = lit.top1(papers.literature)
    lines = [
        "Deep metric learning papers claim large gains over the contrastive and triplet losses; re-run under one "
        "protocol, the gains mostly vanish (Musgrave et al., *A Metric Learning Reality Check*, ECCV 2020; "
        "Psomas, *Metric Learning: A Deep Dive*, 2020). The published numbers come from "
        "`src/dmlbench/analysis/literature.csv`: every row was read in a paper (a table, figure or section) or in "
        "an official repository's file, which its `source` column names; a number read off a figure, or read in "
        "another paper's table rather than in the paper it belongs to, is marked uncertain (`?`, hollow "
        "markers). Each claim is compared with the baseline number its own paper reports; where the paper reports "
        "none, with the median of other papers' numbers for the same backbone and embedding size (a borrowed "
        f"baseline, marked {BORROWED} in the claims table and in the figure); a claim with neither gets no gain "
        "and counts in no median.",
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
            "`?` = read in another paper's table, not in its own; papers give no n and no interval), or for an old "
            "loss the range other papers reported for it as their baseline. Reality Check: BN-Inception, 4-fold "
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
    kinds = {r.interval.paired for frame in frames for r in frame.itertuples()}
    methods = {
        frozenset({True}): "paired over matched seeds",
        frozenset({False}): "Welch (unpaired)",
        frozenset({True, False}): "paired over matched seeds, Welch where seeds do not match",
    }.get(frozenset(kinds), "")
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
    doc.add(*lines)
    if ours_rows:
        doc.add(
            f"Our runs: relative P@1 improvement over the baselines at dim {analysis.dim} (delta-method "
            f"{int(analysis.params.evaluate.confidence * 100)}% t-interval on the log ratio, {methods}; "
            f"{shared.replace('n=', 'n = ')} seeds unless a cell states its own n):",
            "",
            markdown_table(["loss", "cell", "over", "relative improvement"], ours_rows, "lllr"),
            "",
        )
        doc.demo_note(analysis.params)
    else:
        doc.note(
            "Our relative improvements need contrastive or triplet in the grid; this grid has neither at dim "
            f"{analysis.dim}."
        )
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
        + figure_caption_claims(papers.claimed)
        + ", (b) as re-measured under one protocol by the Reality Check, the thesis and our runs - "
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
        "numbers papers reported as their baselines (grey), the same losses re-run under one protocol (blue, "
        "green), and our runs (black) - the baselines papers reported are far below what the old losses reach "
        "when trained well.",
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
TABLE_KEY = ["loss", "paper", "dataset", "backbone", "dim", "value"]
BASELINE_COLUMNS = ["baseline_value", "baseline_kind", "baseline_papers", "improvement"]


def _claim_rows(claimed: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per claim: its keys, year, display, uncertain, and per baseline b the columns
    ``{b}_value``, ``{b}_kind``, ``{b}_papers``, ``{b}_improvement`` (NaN where b has none)."""
    merged, shared = None, [*TABLE_KEY, "year", "display", "uncertain"]
    for baseline, frame in claimed.items():
        if frame.empty:
            continue
        renamed = {c: f"{baseline}_{c.removeprefix('baseline_')}" for c in BASELINE_COLUMNS}
        part = frame.assign(dim=frame["dim"].astype("string"))[[*shared, *BASELINE_COLUMNS]].rename(columns=renamed)
        merged = part if merged is None else merged.merge(part, on=shared, how="outer")
    if merged is None:
        return pd.DataFrame()
    order = {d: i for i, d in enumerate(lit.DATASETS)}
    merged = merged.assign(order=merged["dataset"].map(order))
    return merged.sort_values(["year", "display", "order"], kind="stable").drop(columns="order").reset_index(drop=True)


def _gain(row: pd.Series, baseline: str) -> str:
    if row.get(f"{baseline}_kind") not in (cl.OWN, cl.BORROWED):
        return "-"
    papers = int(row[f"{baseline}_papers"])
    mark = f"{BORROWED} ({papers} paper{'' if papers == 1 else 's'})" if row[f"{baseline}_kind"] == cl.BORROWED else ""
    return f"{row[f'{baseline}_improvement']:+.0f}% vs {row[f'{baseline}_value']:g}{mark}"


def _cell(backbone: str, dim: object) -> str:
    """``bn_inception-512``; ``n/s`` for what the source does not state."""
    return f"{backbone or 'n/s'}-{'n/s' if pd.isna(dim) else dim}"


def _claimed_cell(row: pd.Series) -> str:
    return f"{row['value']:g}{'?' if row['uncertain'] else ''} ({_cell(row['backbone'], row['dim'])})"


def compared(claimed: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The claims with an improvement (their own paper's baseline or a borrowed one), as the figure plots them."""
    return {b: f[f["improvement"].notna()] if len(f) else f for b, f in claimed.items()}


def count_sentence(claimed: dict[str, pd.DataFrame]) -> str:
    """``35 claims from 39 `literature.csv` rows; over contrastive 9 against their own paper's number,
    0 borrowed, 26 with neither; over triplet ...``."""
    counts = {b: cl.count_claims(f) for b, f in claimed.items()}
    first = next(iter(counts.values()), cl.count_claims(pd.DataFrame()))
    parts = [
        f"over {b} {n.own} against their own paper's number, {n.borrowed} borrowed, {n.none} with neither"
        for b, n in counts.items()
    ]
    return f"{first.claims} claims from {first.rows} `literature.csv` rows; " + "; ".join(parts)


def _uncompared_note(rows: pd.DataFrame, baselines: list[str]) -> list[str]:
    """A sentence naming the claims with no baseline at all, by paper and cell."""
    kinds = rows[[f"{b}_kind" for b in baselines]]
    missing = rows[(kinds == cl.NONE).all(axis=1)]
    if missing.empty:
        return []
    who = []
    for (display, year, backbone, dim), part in missing.groupby(
        ["display", "year", "backbone", "dim"], sort=False, dropna=False
    ):
        datasets = ", ".join(lit.DATASET_LABELS.get(d, d) for d in part["dataset"])
        who.append(f"{display} {year} ({_cell(backbone, dim)}: {datasets})")
    return [
        f"No gain (`-`) where the claim's own paper reports no {' or '.join(baselines)} number on that dataset and "
        "no other paper reported one at its backbone and embedding size; with neither baseline: "
        + "; ".join(who)
        + ".",
        "",
    ]


def claims_lines(claimed: dict[str, pd.DataFrame]) -> list[str]:
    """The claims table: one row per claim (:mod:`dmlbench.analysis.claims`), its gain over each
    baseline and the baseline number it is set against - its own paper's, or marked † the median of
    other papers' numbers at the same backbone and embedding size - and ``-`` where neither exists
    (named in a note below the table)."""
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
    return [
        "Claimed gains (relative R@1 improvement, as plotted in panel (a) of the figure below) and the baseline "
        "R@1 each is computed against. A claim is one paper's R@1 for its loss on one dataset, backbone and "
        "embedding size, counted once however many places print it (a paper's table and its README: one claim, "
        "valued by the paper's table). Its baseline is the number its own paper reports for that baseline on "
        f"that dataset; {BORROWED} = borrowed: its paper reports none, so the gain is computed against the median "
        "of the numbers other papers (how many: in brackets) reported up to its year at the same backbone and "
        f"embedding size - a comparison the claiming paper never made ({count_sentence(claimed)}).",
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
    """The caption's account of panel (a)'s borrowed baselines, e.g. `` Points marked † set a claim
    against ...: over contrastive Margin (CUB200) (1 of 9 claims); ...``; empty when no claim has one."""
    parts = []
    for baseline, frame in compared(claimed).items():
        if frame.empty or not frame["borrowed"].any():
            continue
        names = []
        for display, claims in frame.groupby("display", sort=False):
            borrowed = claims[claims["borrowed"]]
            if borrowed.empty:
                continue
            datasets = ", ".join(dict.fromkeys(lit.DATASET_LABELS.get(d, d) for d in borrowed["dataset"]))
            names.append(f"{display} ({datasets})")
        parts.append(f"over {baseline} {', '.join(names)} ({int(frame['borrowed'].sum())} of {len(frame)} claims)")
    if not parts:
        return ""
    return (
        f" Points marked {BORROWED} in (a) set a claim against the median of other papers' numbers at its backbone "
        f"and embedding size because its own paper reports none (claims table above): {'; '.join(parts)}."
    )


def figure_caption_claims(claimed: dict[str, pd.DataFrame]) -> str:
    """Panel (a)'s part of the caption: what each point is set against, with the counts."""
    counts = {b: cl.count_claims(f) for b, f in claimed.items()}
    own = ", ".join(f"over {b} {n.own} of {n.claims} claims" for b, n in counts.items())
    text = (
        f"(a) as claimed by papers, each point one claim set against the baseline number its own paper reports ({own})"
    )
    if any(n.borrowed for n in counts.values()):
        text += f" or, marked {BORROWED}, against other papers' numbers at the same backbone and size"
    left_out = ", ".join(f"over {b} {n.none}" for b, n in counts.items() if n.none)
    return text + (f"; claims with neither are not plotted ({left_out})" if left_out else "")


def ours_label(analysis: Analysis) -> str:
    cells = analysis.papers.ours_absolute
    if cells.empty:
        return "our runs"
    datasets = ", ".join(dict.fromkeys(cells["dataset"]))
    return f"our runs ({datasets}, dim {analysis.dim})"


def ours_range(ours: pd.DataFrame) -> str:
    """``-3.1% to +12.0%``: the range of our relative improvements, as the table of our runs prints them."""
    estimates = [i.estimate for i in ours["interval"]]
    return f"{signed_percent(min(estimates))} to {signed_percent(max(estimates))}"


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
    if len(ours):
        text += f", our runs {ours_range(ours)} (table above)"
    return (text or "no claims to compare") + "."


SECTION = Section("Papers versus reality", "Papers vs reality", write)
