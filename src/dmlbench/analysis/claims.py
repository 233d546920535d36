"""What papers claimed over an old loss, counted once per claim (docs/report.md, "Claims"): rows
sharing :data:`CLAIM_KEY` are one claim, valued by the paper's table (:data:`PAPER_TABLE`) when
present, else the first row. Its improvement ``100 * (claimed / baseline_value - 1)`` (percent) is set
against, in this order: ``own`` (its paper's baseline number on that dataset, at the claim's backbone
and size when there, else the median of its numbers there), ``borrowed`` (the median of other papers'
numbers up to the claim's year at the same named backbone and size), or ``none``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from dmlbench.analysis.literature import top1

CLAIM_KEY = ["paper", "loss", "dataset", "metric", "backbone", "dim"]
OWN, BORROWED, NONE = "own", "borrowed", "none"
PAPER_TABLE = "as_published"  # the setting that stands for a claim its paper and a README both print


CLAIM_COLUMNS = [
    "loss",
    "paper",
    "year",
    "dataset",
    "metric",
    "backbone",
    "dim",
    "value",
    "setting",
    "uncertain",
    "rows",
]


def claims(literature: pd.DataFrame) -> pd.DataFrame:
    """One row per claim (:data:`CLAIM_KEY`) among the ``claimed`` R@1 rows of ``literature``.

    Returns :data:`CLAIM_COLUMNS`: loss, paper, year, dataset, metric (canonical), backbone, dim,
    value (percent; the paper's own table when the file has it), setting (of that value),
    uncertain, rows (how many literature rows the claim stands for), in file order.
    """
    rows = top1(literature)
    rows = rows[rows["kind"] == "claimed"]
    if rows.empty:
        return pd.DataFrame(columns=CLAIM_COLUMNS)
    rows = rows.assign(
        order=range(len(rows)),
        later=(rows["setting"] != PAPER_TABLE).astype(int),
        rows=rows.groupby(CLAIM_KEY, dropna=False)["value"].transform("size"),
    )
    picked = rows.sort_values(["later", "order"], kind="stable").drop_duplicates(CLAIM_KEY, keep="first")
    return picked.sort_values("order")[CLAIM_COLUMNS].reset_index(drop=True)


def _same_cell(rows: pd.DataFrame, backbone: str, dim: object) -> pd.Series:
    """Rows at ``backbone`` and ``dim``, both named (a row naming neither matches nothing)."""
    if not backbone or pd.isna(dim):
        return pd.Series(False, index=rows.index)
    return (rows["backbone"] == backbone) & (rows["dim"] == dim).fillna(False)


def claimed_improvements(literature: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Each claim's relative improvement over ``baseline`` (e.g. ``contrastive``), in percent.

    Returns :func:`claims`'s columns plus baseline_kind (:data:`OWN`, :data:`BORROWED` or
    :data:`NONE`), borrowed (baseline_kind == borrowed), baseline_value (NaN for none),
    baseline_papers (how many papers it comes from; 0 for none), baseline_from (a phrase saying
    where it comes from, or why there is none) and improvement (NaN for none).
    """
    rows = top1(literature)
    reported = rows[(rows["kind"] != "claimed") & (rows["loss"] == baseline)]
    published = reported[reported["kind"] == "baseline"]
    out = []
    for claim in claims(literature).itertuples(index=False):
        own = reported[(reported["paper"] == claim.paper) & (reported["dataset"] == claim.dataset)]
        others = published[
            (published["paper"] != claim.paper)
            & (published["dataset"] == claim.dataset)
            & (published["year"] <= claim.year)
        ]
        others = others[_same_cell(others, claim.backbone, claim.dim)]
        if len(own):
            cell = own[_same_cell(own, claim.backbone, claim.dim)]
            kind, value, papers = OWN, float((cell if len(cell) else own)["value"].median()), 1
            origin = "its own paper" + ("" if len(cell) or len(own) == 1 else " (median of its cells)")
        elif len(others):
            kind, value, papers = BORROWED, float(others["value"].median()), int(others["paper"].nunique())
            origin = f"median of {papers} other paper{'' if papers == 1 else 's'} at {claim.backbone}-{claim.dim}"
        else:
            kind, value, papers = NONE, float("nan"), 0
            size = f"{claim.backbone or 'backbone not given'}-{'size not given' if pd.isna(claim.dim) else claim.dim}"
            origin = f"none: its paper reports no {baseline} number and no other paper one at {size}"
        out.append(
            {
                **claim._asdict(),
                "baseline_kind": kind,
                "borrowed": kind == BORROWED,
                "baseline_value": value,
                "baseline_papers": papers,
                "baseline_from": origin,
                "improvement": 100 * (claim.value / value - 1),
            }
        )
    extra = ["baseline_kind", "borrowed", "baseline_value", "baseline_papers", "baseline_from", "improvement"]
    return pd.DataFrame(out) if out else pd.DataFrame(columns=[*CLAIM_COLUMNS, *extra])


@dataclass(frozen=True)
class ClaimCounts:
    """How the claims over one baseline split: ``claims`` = own + borrowed + none; ``rows``: the
    literature rows they stand for; ``papers_own``/``papers_borrowed``: distinct claiming papers."""

    claims: int
    rows: int
    own: int
    borrowed: int
    none: int
    papers_own: int
    papers_borrowed: int


def count_claims(improvements: pd.DataFrame) -> ClaimCounts:
    """:class:`ClaimCounts` of one :func:`claimed_improvements` frame."""
    if improvements.empty:
        return ClaimCounts(0, 0, 0, 0, 0, 0, 0)
    kind = improvements["baseline_kind"]
    return ClaimCounts(
        claims=len(improvements),
        rows=int(improvements["rows"].sum()),
        own=int((kind == OWN).sum()),
        borrowed=int((kind == BORROWED).sum()),
        none=int((kind == NONE).sum()),
        papers_own=int(improvements.loc[kind == OWN, "paper"].nunique()),
        papers_borrowed=int(improvements.loc[kind == BORROWED, "paper"].nunique()),
    )


def median_improvement(improvements: pd.DataFrame, kind: str) -> float:
    """Median improvement (percent) over the claims whose baseline is of ``kind``; NaN for none."""
    if improvements.empty:
        return float("nan")
    return float(improvements.loc[improvements["baseline_kind"] == kind, "improvement"].median())
