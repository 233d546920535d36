"""What a dataset's files hold, checked before anything is trusted: download runs :func:`content_check`
before keeping files, prepare counts again. Fewer images or classes than the release are refused
unless ``source.allow_subset: true`` (docs/datasets.md, "Content checks").
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from dmlbench.data.base import Counts, DatasetParams, check_annotations
from dmlbench.errors import DataError

ReadAnnotations = Callable[[DatasetParams, Path], pd.DataFrame]
SHOWN = 2  # example paths in a line


def allow_subset(params: DatasetParams) -> bool:
    """``datasets.<name>.source.allow_subset`` (archive datasets; False where the source has no such key)."""
    return bool(getattr(params.source, "allow_subset", False))


def check_counts(dataset: str, found: Counts, published: Counts | None, subset_allowed: bool, where: str) -> dict:
    """``found`` against the release: equal, or (with ``subset_allowed``) within it; else one line.
    Returns what info.json records: ``{"published", "listed", "allow_subset", "subset"}``."""
    record: dict[str, Any] = {
        "published": published.as_dict() if published else None,
        "listed": found.as_dict(),
        "allow_subset": subset_allowed,
        "subset": False,
    }
    if published is None or found.figures() == published.figures():
        return record
    if subset_allowed and found.within(published):
        return {**record, "subset": True}
    if found.within(published):
        why = (
            f"an incomplete copy or a subset: set datasets.{dataset}.source.allow_subset: true to use it as a "
            "deliberate subset (the report says so)"
        )
    else:
        why = "more than the published release: another release or another dataset"
    cited = f" ({published.source})" if published.source else ""
    raise DataError(
        f"{dataset}: {where} lists {found.describe()}; the published release has {published.describe()}{cited}: {why}"
    )


def read_checked(dataset: str, read: ReadAnnotations, params: DatasetParams, root: Path, where: str) -> pd.DataFrame:
    """The annotation table under ``root``, checked (:func:`dmlbench.data.base.check_annotations`); a
    reader's error becomes one line naming the dataset and ``where`` the files come from."""
    try:
        return check_annotations(read(params, root), dataset)
    except DataError as exc:
        message = " ".join(str(exc).split())
        prefix = "" if message.startswith(f"{dataset}:") else f"{dataset}: {where}: "
        raise DataError(prefix + message) from None


def missing_images(frame: pd.DataFrame, root: Path) -> list[str]:
    """The listed images (``path`` relative to ``root``) that are not files under ``root``."""
    return [path for path in frame["path"] if not (root / path).is_file()]


def missing_line(dataset: str, missing: list[str], where: str, hint: str = "") -> str:
    shown = ", ".join(missing[:SHOWN]) + (", ..." if len(missing) > SHOWN else "")
    return f"{dataset}: {len(missing):,} listed image(s) not in {where} ({shown}){hint}"


def content_check(
    dataset: str, read: ReadAnnotations, published: Counts | None, params: DatasetParams, missing_hint: str = ""
) -> Callable[[Path, str], dict]:
    """The download stage's check of the files under ``root`` (``where``: their names): annotations
    readable, counts as published (or a subset); listed images absent are said and returned as
    ``missing`` (prepare decides by ``skip_corrupt``)."""

    def check(root: Path, where: str) -> dict:
        frame = read_checked(dataset, read, params, root, where)
        record = check_counts(dataset, Counts.of(frame), published, allow_subset(params), where)
        missing = missing_images(frame, root)
        if missing:
            print(
                missing_line(dataset, missing, where, missing_hint)
                + f"; prepare fails on them unless datasets.{dataset}.skip_corrupt: true leaves them out (counted "
                "in info.json and the report); no sha256 is recorded for an incomplete copy",
                file=sys.stderr,
            )
        return {**record, "missing": missing}

    return check


def prepared_counts(listed: dict, prepared: Counts, missing: int, unreadable: int) -> dict:
    """info.json's counts: listed (checked against the release), prepared and left out (they add up)."""
    if prepared.images + missing + unreadable != listed["listed"]["images"]:
        raise DataError(
            f"prepared {prepared.images:,} images and left out {missing + unreadable:,}, but the annotations list "
            f"{listed['listed']['images']:,}"
        )
    return {**listed, "prepared": prepared.as_dict(), "left_out": {"missing": missing, "unreadable": unreadable}}


def describe_counts(dataset: str, counts: dict | None) -> list[str]:
    """Lines for the report: a deliberate subset, images left out; none for a complete dataset."""
    if not counts:
        return []
    lines = []
    published, listed = counts.get("published"), counts["listed"]
    if counts.get("subset") and published:
        lines.append(
            f"`{dataset}` is a deliberate subset (`source.allow_subset: true`): {listed['images']:,} of the published "
            f"{published['images']:,} images, {listed['classes']:,} of {published['classes']:,} classes."
        )
    left = counts.get("left_out") or {}
    if left.get("missing") or left.get("unreadable"):
        lines.append(
            f"`{dataset}`: {left['missing'] + left['unreadable']:,} listed image(s) left out (`skip_corrupt: true`; "
            f"{left['missing']:,} not in the archive, {left['unreadable']:,} unreadable; listed in info.json)."
        )
    return lines
