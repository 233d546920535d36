"""Published numbers: what papers claimed, the baselines they beat, and fair re-runs, from
``literature.csv`` (one number per row; ``value`` and ``half_width`` in points) and ``methods.csv``
(one loss per row) beside this module, columns :data:`LITERATURE_COLUMNS` and :data:`METHOD_COLUMNS`,
both described in docs/report.md ("Published numbers"). Numbers compare only within one :data:`GROUP`;
Recall@1 and Precision@1 are one metric for a query (:func:`canonical_metric`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, ValidationInfo, field_validator

from dmlbench.errors import DataError

LITERATURE = Path(__file__).with_name("literature.csv")
METHODS = Path(__file__).with_name("methods.csv")

KINDS = ("claimed", "baseline", "reproduction")
DATASETS = ("cub200", "cars196", "sop", "inshop")
DATASET_LABELS = {"cub200": "CUB200", "cars196": "Cars196", "sop": "SOP", "inshop": "In-Shop"}
METRICS = ("recall_at_1", "precision_at_1", "r_precision", "map_at_r")
SAME_METRIC = {"recall_at_1": "precision_at_1"}
GROUP = ["paper", "setting", "dataset", "backbone", "dim", "metric"]

THESIS = "Psomas, Metric Learning: A Deep Dive"
REALITY_CHECK = "Musgrave et al., A Metric Learning Reality Check"
PROXY_ANCHOR = "Kim et al., Proxy Anchor Loss for Deep Metric Learning"
# The two 2020 studies that re-ran the losses of their time under one protocol (methods.csv
# ``studies_2020`` names them by these keys): Musgrave, Belongie & Lim, ECCV 2020, and Psomas 2020.
STUDIES_2020 = {"reality_check": REALITY_CHECK, "thesis": THESIS}


@dataclass(frozen=True)
class PublishedSetup:
    """Where a protocol's published numbers are: one (paper, setting) of ``literature.csv``.

    ``folds``: the published embedding concatenates this many fold models of the grid's size
    (the Reality Check's 4 x 128 = 512-d), so a published dim matches grid dim x folds."""

    paper: str
    setting: str
    label: str  # how the report names the source
    folds: int = 1


# The protocols of params.yaml that follow a published setup, and where their numbers are.
PROTOCOL_SOURCES: dict[str, tuple[PublishedSetup, ...]] = {
    "reality_check": (PublishedSetup(REALITY_CHECK, "rc_concatenated", "Reality Check, 4 x 128-d concatenated", 4),),
    "thesis": (PublishedSetup(THESIS, "test_selection", "thesis (epoch picked on the test set)"),),
    "proxy_anchor": (
        PublishedSetup(PROXY_ANCHOR, "as_published", "Proxy-Anchor paper"),
        PublishedSetup(PROXY_ANCHOR, "official_readme", "Proxy-Anchor official README"),
    ),
}


def published_for(literature: pd.DataFrame, protocol: str) -> pd.DataFrame:
    """The numbers published under ``protocol``'s setup (:data:`PROTOCOL_SOURCES`), keyed like the
    grid: loss, dataset, backbone, dim (the grid's), metric (canonical), value (percent), half_width
    (points, NaN without a published interval), n_published, source, uncertain. Empty for a
    protocol with no published setup (the demo)."""
    columns = [
        "loss",
        "dataset",
        "backbone",
        "dim",
        "metric",
        "value",
        "half_width",
        "n_published",
        "source",
        "uncertain",
    ]
    parts = []
    for setup in PROTOCOL_SOURCES.get(protocol, ()):
        rows = literature[(literature["paper"] == setup.paper) & (literature["setting"] == setup.setting)]
        rows = rows[rows["dim"].notna() & (rows["dim"] % setup.folds == 0)]
        parts.append(
            rows.assign(
                metric=rows["metric"].map(canonical_metric),
                dim=(rows["dim"] // setup.folds).astype(int),
                source=setup.label,
            )[columns]
        )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


# The "reference reality" series: one headline protocol of each independent re-run.
REFERENCE_SERIES = {
    "Reality Check (BN-Inception, 4 x 128-d concatenated)": {"paper": REALITY_CHECK, "setting": "rc_concatenated"},
    "Thesis (BN-Inception, 512-d)": {
        "paper": THESIS,
        "setting": "test_selection",
        "backbone": "bn_inception",
        "dim": 512,
    },
}

Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]+$")]


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    @field_validator("uncertain", "registered", mode="before", check_fields=False)
    @classmethod
    def _bool(cls, value: str) -> bool:
        if value not in ("true", "false"):
            raise ValueError("must be true or false")
        return value == "true"

    @field_validator("year", "dim", "half_width", "n_published", mode="before", check_fields=False)
    @classmethod
    def _optional(cls, value: str) -> str | None:
        return None if value == "" else value


class MethodRow(_Row):
    loss: Slug
    name: str = Field(min_length=1)
    paper: str
    venue: str
    year: int | None = Field(None, ge=1990, le=2100)
    family: Literal["pair", "proxy", "none", "unknown"]
    uncertain: bool
    registered: bool  # a loss of dmlbench.losses.LOSSES (false: the untrained trunk, or cited for its numbers only)
    studies_2020: str = Field(pattern=r"^((reality_check|thesis)( (reality_check|thesis))*)?$")


class LiteratureRow(_Row):
    loss: Slug
    paper: str = Field(min_length=1)
    venue: str = Field(min_length=1)
    year: int = Field(ge=1990, le=2100)
    dataset: Literal[DATASETS]  # type: ignore[valid-type]
    backbone: str = Field(pattern=r"^[a-z0-9_]*$")
    dim: int | None = Field(None, gt=0)
    setting: Slug
    metric: Literal[METRICS]  # type: ignore[valid-type]
    value: float = Field(ge=0, le=100)
    half_width: float | None = Field(None, ge=0, le=100)
    n_published: int | None = Field(None, ge=2)
    kind: Literal[KINDS]  # type: ignore[valid-type]
    source: str = Field(min_length=1)
    uncertain: bool
    note: str

    @field_validator("n_published")
    @classmethod
    def _runs_with_interval(cls, value: int | None, info: ValidationInfo) -> int | None:
        if (value is None) != (info.data.get("half_width") is None):
            raise ValueError("half_width and n_published are given together or not at all")
        return value

    @field_validator("note")
    @classmethod
    def _note_agrees(cls, value: str, info: ValidationInfo) -> str:
        quoted, column = note_half_width(value), info.data.get("half_width")
        if quoted is not None and quoted != column:
            raise ValueError(f"quotes a 95% CI half-width of {quoted:g} but half_width is {column}")
        return value


# the files' headers, in the order of the rows' fields
LITERATURE_COLUMNS = tuple(LiteratureRow.model_fields)
METHOD_COLUMNS = tuple(MethodRow.model_fields)

_NOTE_HALF_WIDTH = re.compile(r"95% CI half-width (\d+(?:\.\d+)?)")


def note_half_width(note: str) -> float | None:
    """The half-width a note quotes as ``95% CI half-width x`` (points), else None."""
    match = _NOTE_HALF_WIDTH.search(note)
    return float(match.group(1)) if match else None


def canonical_metric(metric: str) -> str:
    """``recall_at_1`` and ``precision_at_1`` are the same number; use the latter's name."""
    return SAME_METRIC.get(metric, metric)


def _read(path: Path, columns: tuple[str, ...], model: type[_Row]) -> pd.DataFrame:
    """Read a CSV whose header is exactly ``columns``; validate every row with ``model``."""
    if not path.exists():
        raise DataError(f"{path}: file not found")
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    if tuple(frame.columns) != columns:
        raise DataError(f"{path}: header must be {','.join(columns)}; got {','.join(frame.columns)}")
    rows = []
    for index, record in enumerate(frame.to_dict("records")):
        try:
            rows.append(model.model_validate(record).model_dump())
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            column = ".".join(str(part) for part in err["loc"])
            got = record.get(column, "")
            raise DataError(
                f"{path}:{index + 2}: {column}: {err['msg'].replace('Value error, ', '')} (got {got!r})"
            ) from None
    return pd.DataFrame(rows, columns=list(columns))


def load_methods(path: str | Path = METHODS) -> pd.DataFrame:
    """``methods.csv`` validated; one row per loss key."""
    path = Path(path)
    methods = _read(path, METHOD_COLUMNS, MethodRow)
    repeated = methods["loss"][methods["loss"].duplicated()].tolist()
    if repeated:
        raise DataError(f"{path}: loss {repeated[0]!r} is listed twice")
    methods["year"] = methods["year"].astype("Int64")
    methods["studies_2020"] = methods["studies_2020"].map(lambda keys: tuple(sorted(set(keys.split()))))
    return methods.set_index("loss", drop=False)


def load_literature(path: str | Path = LITERATURE, methods: pd.DataFrame | None = None) -> pd.DataFrame:
    """``literature.csv`` validated against its schema and ``methods.csv``.

    Fails with a one-line :class:`DataError` naming the file, line and column of the first bad
    value, an unknown loss, or a number given twice for the same paper/setting/cell.
    """
    path = Path(path)
    methods = load_methods() if methods is None else methods
    literature = _read(path, LITERATURE_COLUMNS, LiteratureRow)
    unknown = sorted(set(literature["loss"]) - set(methods["loss"]))
    if unknown:
        line = int(literature.index[literature["loss"] == unknown[0]][0]) + 2
        raise DataError(f"{path}:{line}: loss: {unknown[0]!r} is not in {METHODS.name}; add it there first")
    literature["dim"] = literature["dim"].astype("Int64")
    literature["n_published"] = literature["n_published"].astype("Int64")
    literature["half_width"] = literature["half_width"].astype(float)
    key = ["loss", "kind", *GROUP]
    twice = literature.duplicated(key, keep="first")
    if twice.any():
        line = int(literature.index[twice][0]) + 2
        raise DataError(f"{path}:{line}: the same loss/paper/setting/dataset/backbone/dim/metric appears twice")
    return literature


def top1(literature: pd.DataFrame) -> pd.DataFrame:
    """Rows reporting the nearest-neighbour accuracy (R@1 = P@1), ``metric`` canonicalised."""
    rows = literature.assign(metric=literature["metric"].map(canonical_metric))
    return rows[rows["metric"] == "precision_at_1"]


def reference_improvements(literature: pd.DataFrame, baseline: str, methods: pd.DataFrame) -> pd.DataFrame:
    """Relative improvement over ``baseline`` inside each re-run (same paper, setting, cell), percent.

    The year is the loss's year from ``methods.csv``. Rows: series, loss, year, dataset, value,
    baseline_value, improvement, uncertain.
    """
    rows = reference_rows(top1(literature))
    if rows.empty:
        return pd.DataFrame()
    rows = rows.assign(group=rows[GROUP].astype(str).agg("|".join, axis=1))
    base = rows[rows["loss"] == baseline].set_index("group")["value"]
    rows = rows[(rows["loss"] != baseline) & rows["group"].isin(base.index)]
    rows = rows.assign(baseline_value=rows["group"].map(base), year=rows["loss"].map(methods["year"]))
    rows = rows[rows["year"].notna()]
    rows["improvement"] = 100 * (rows["value"] / rows["baseline_value"] - 1)
    return rows[
        ["series", "loss", "year", "dataset", "backbone", "dim", "value", "baseline_value", "improvement", "uncertain"]
    ].reset_index(drop=True)


def reference_rows(literature: pd.DataFrame) -> pd.DataFrame:
    """The rows of every :data:`REFERENCE_SERIES`, with a ``series`` column naming it."""
    parts = []
    for series, selector in REFERENCE_SERIES.items():
        mask = literature["kind"] == "reproduction"
        for column, value in selector.items():
            mask &= literature[column] == value
        parts.append(literature[mask].assign(series=series))
    return pd.concat(parts, ignore_index=True) if parts else literature.iloc[0:0].assign(series="")


def display_name(loss: str, methods: pd.DataFrame) -> str:
    return str(methods.loc[loss, "name"]) if loss in methods.index else loss


def studies_2020(loss: str, methods: pd.DataFrame) -> tuple[str, ...]:
    """The keys of :data:`STUDIES_2020` whose re-run trained ``loss`` (methods.csv ``studies_2020``);
    empty for a loss neither ran or one ``methods.csv`` does not list."""
    return tuple(methods.loc[loss, "studies_2020"]) if loss in methods.index else ()


def loss_year(loss: str, methods: pd.DataFrame) -> float:
    """Year the loss was introduced (NaN when unknown)."""
    if loss not in methods.index or pd.isna(methods.loc[loss, "year"]):
        return math.nan
    return float(methods.loc[loss, "year"])
