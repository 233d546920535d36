"""Numbers and tables as the report writes them: intervals with n, signed relative changes,
p-values, posterior probabilities, markdown tables and GitHub heading anchors."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any


def format_number(value: float, scale: float = 100, digits: int = 1) -> str:
    """``62.1``: how every table cell and every caption rounds a number (percent by default), so a
    caption quoting a table shows the table's digits."""
    return f"{scale * value:.{digits}f}"


def format_interval(
    mean: float, low: float, high: float, n: int, scale: float = 100, digits: int = 1, show_n: bool = True
) -> str:
    """``62.1 [59.8, 64.3] (n=3)`` (percent by default; the interval need not be symmetric: it
    respects the quantity's range); ``62.1 (n=1, no interval)`` for a single value; ``show_n=False``
    where the table states n once (a value without an interval always says its n). Where all n
    values are equal the t-interval has zero width, a certainty no small sample gives:
    ``1.00 (all n=2 equal, no interval)``."""
    if n < 2 or math.isnan(low):
        return f"{format_number(mean, scale, digits)} (n={n}, no interval)"
    if low == high:
        return f"{format_number(mean, scale, digits)} (all n={n} equal, no interval)"
    low_text, high_text = format_number(low, scale, digits), format_number(high, scale, digits)
    text = f"{format_number(mean, scale, digits)} [{low_text}, {high_text}]"
    return text + (f" (n={n})" if show_n else "")


def common_n(ns: Iterable[int]) -> int | None:
    """The n most cells of a table share (the first of equally common ones), stated once above the
    table; a cell whose n differs states its own. None for an empty table."""
    counts = Counter(int(n) for n in ns)
    return counts.most_common(1)[0][0] if counts else None


def signed_percent(fraction: float) -> str:
    """``+12.3%``: a relative change given as a fraction, as tables and captions both print it."""
    return f"{100 * fraction:+.1f}%"


def format_bounds(
    mean: float, low: float, high: float, n: int, scale: float = 100, digits: int = 1, unit: str = "queries"
) -> str:
    """``2.6 [1.9, 3.3] (n=100 classes)``: an interval that need not be symmetric (bootstrap); ``unit``
    says what n counts (:func:`bootstrap_unit`: ``n=100 classes; 1,600 queries``)."""
    if math.isnan(low):
        return f"{scale * mean:.{digits}f} (n=1 run, no interval)"
    return f"{scale * mean:.{digits}f} [{scale * low:.{digits}f}, {scale * high:.{digits}f}] (n={n} {unit})"


def bootstrap_unit(unit: str, queries: int) -> str:
    """What a bootstrap interval's n counts: ``classes; 1,600 queries`` (the class-cluster bootstrap)
    or ``queries`` (a query bootstrap of older outputs)."""
    return f"classes; {int(queries):,} queries" if unit == "classes" else "queries"


def format_signed_interval(estimate: float, low: float, high: float, n: str) -> str:
    """``+12.3% [+4.0, +21.1] (n=3 vs 3)`` for relative improvements given as fractions; ``n=""``
    where the table states n once."""
    if math.isnan(low):
        return f"{signed_percent(estimate)} ({n + ', ' if n else ''}no interval)"
    text = f"{signed_percent(estimate)} [{100 * low:+.1f}, {100 * high:+.1f}]"
    return text + (f" ({n})" if n else "")


def p_value(value: float) -> str:
    return f"{value:.2g}" if value >= 1e-4 else f"{value:.1e}"


def points(value: float) -> str:
    """A difference in metric units as percentage points: ``1 point``, ``0.5 points``."""
    return f"{100 * value:g} point{'' if 100 * value == 1 else 's'}"


def probability(p: float) -> str:
    """Posterior probability to 2 decimals, never rounded to a certainty: ``> 0.99``, ``< 0.01``."""
    return "> 0.99" if p >= 0.995 else "< 0.01" if p < 0.005 else f"{p:.2f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    marks = {"l": ":---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(map(str, header)) + " |", "| " + " | ".join(marks[a] for a in align) + " |"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: ``Test-set feedback`` -> ``test-set-feedback``."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
