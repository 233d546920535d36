"""What ``make repro`` ends with: stages run, wall time, the tournament and where to look next."""

from __future__ import annotations

from pathlib import Path

from dmlbench.pipeline.local import LOG_DIR
from dmlbench.pipeline.plan import Plan


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def closing_summary(plan: Plan | None, seconds: float, report: Path) -> str:
    """What ``make repro`` ends with: stages run and up to date, wall time, the report's tournament
    table and where to look next. ``plan``: None for a sequential ``dvc repro`` (its log says what ran)."""
    if plan is None:
        lines = [f"dvc repro finished in {_duration(seconds)}."]
    else:
        ran = len(plan.order) + len(plan.ran_first)
        lines = [
            f"{ran} of {plan.total} stages run, {plan.total - ran} up to date, "
            f"in {_duration(seconds)}" + (f"; logs in {LOG_DIR}/" if ran else "") + "."
        ]
    if report.exists():
        text = report.read_text()
        if "## Tournament of losses\n" in text:
            section = text.split("## Tournament of losses\n", 1)[1].split("\n## ", 1)[0]
            table = [line for line in section.splitlines() if line.startswith("|")]
            lines += ["", "Tournament of losses (from the report):", *table]
        lines += ["", f"Report: {report}", "Runs: make ui (the MLflow UI on this project's tracking store)"]
    return "\n".join(lines)
