"""Types carry contracts: mypy (settings in pyproject.toml, untyped definitions refused) over
``src/dmlbench``, and ruff's rule set over the repository, both clean.

Modules mypy still finds errors in are listed in ``tests/mypy_baseline.txt``; that list may only
shrink (a module that became clean must be taken off), and the modules the params/pipeline
regrouping moved or created are held to the full check.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = Path(__file__).with_name("mypy_baseline.txt")
# created or moved by the regrouping (params/, pipeline/, the launcher, safe loading, the
# training record, the one CLI helper): never in the baseline
HELD_TO_THE_CHECK = (
    "dmlbench/params/",
    "dmlbench/pipeline/",
    "dmlbench/launch.py",
    "dmlbench/safe_load.py",
    "dmlbench/tracking/record.py",
    "dmlbench/cli.py",
    "dmlbench/data/stage.py",
    "dmlbench/train/stage.py",
)


def baseline() -> set[str]:
    lines = BASELINE.read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def modules_with_errors(output: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^src/(\S+\.py):\d+: error:", output, flags=re.M)}


def test_mypy_finds_errors_only_in_the_baseline_and_the_baseline_only_shrinks():
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 2: mypy itself failed
    found, allowed = modules_with_errors(result.stdout), baseline()
    new = sorted(found - allowed)
    assert not new, "mypy errors outside tests/mypy_baseline.txt:\n" + "\n".join(
        line for line in result.stdout.splitlines() if any(line.startswith(f"src/{m}:") for m in new)
    )
    clean = sorted(allowed - found)
    assert not clean, f"now clean: take these off tests/mypy_baseline.txt: {', '.join(clean)}"
    held = sorted(m for m in allowed if m.startswith(HELD_TO_THE_CHECK))
    assert not held, f"moved or created by the regrouping, so held to the full check: {', '.join(held)}"


def test_modules_with_errors_reads_mypy_output():
    output = "src/dmlbench/a.py:3: error: Missing return  [return]\nsrc/dmlbench/a.py:9: note: x\nok\n"
    assert modules_with_errors(output) == {"dmlbench/a.py"}


def test_ruff_finds_nothing():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
