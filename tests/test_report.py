"""The report stage on a synthetic results table: every section, figure and interval."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dmlbench import paths
from dmlbench.analysis.report import format_interval, report_stage
from dmlbench.io import write_json

METRICS = ["precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8", "r_precision", "map_at_r"]


def _fake_outputs(params, quality: dict[str, float]) -> None:
    rng = np.random.default_rng(0)
    write_json(
        paths.prepared_dir("glyphs") / "info.json",
        {
            "dataset": "glyphs",
            "image_size": 36,
            "num_images": 240,
            "splits": {
                "train": {"images": 90, "classes": 9},
                "val": {"images": 30, "classes": 3},
                "test": {"images": 120, "classes": 12},
            },
        },
    )
    for combo in params.combos():
        runs = {}
        for seed in params.seeds:
            base = quality[combo.loss] + 0.01 * combo.dim / 32 + rng.normal(0, 0.01)
            runs[f"seed{seed}"] = {
                "seed": seed,
                "metrics": {
                    m: float(np.clip(base * (0.6 if "r_prec" in m or "map" in m else 1), 0, 1)) for m in METRICS
                },
            }
            history = [{"epoch": e, "train/loss": 1.0 / e, "val/map_at_r": base * e / 2} for e in (1, 2)]
            write_json(paths.model_dir(combo.with_seed(seed)) / "history.json", history)
            write_json(
                paths.model_dir(combo.with_seed(seed)) / "run.json",
                {"selection": {"split": "val", "metric": "map_at_r", "epoch": 2, "value": base}},
            )
        write_json(paths.evaluation_dir(combo) / "runs.json", {"combo": combo.key, "runs": runs})


def test_report_has_every_section_figure_and_interval(in_project, small_params):
    _fake_outputs(small_params, {"contrastive": 0.5, "triplet": 0.3, "multi_similarity": 0.7, "proxy_anchor": 0.6})
    path = report_stage(small_params)
    text = path.read_text()
    for heading in [
        "## Setup",
        "### Datasets",
        "### Grid and protocol",
        "## Results on the test classes",
        "## Tournament of losses",
        "## Convergence",
        "## Limitations",
    ]:
        assert heading in text
    # Every results cell carries a mean, a 95% half-width and n.
    table = text.split("## Results on the test classes")[1].split("![")[0]
    cells = [c.strip() for line in table.splitlines() if line.startswith("| `") for c in line.split("|")[3:-1]]
    assert len(cells) == len(small_params.combos()) * 6
    assert all(re.fullmatch(r"\d+\.\d ± \d+\.\d \(n=3\)", c) for c in cells), cells[:3]
    # The tournament puts the best loss first.
    tournament = text.split("## Tournament of losses")[1].split("\n\n")[2]
    ranked = [line.split("|")[1].strip(" `") for line in tournament.splitlines()[2:]]
    assert ranked == ["multi_similarity", "proxy_anchor", "contrastive", "triplet"]
    for figure in ("figures/metric_by_loss.png", "figures/validation_curves.png"):
        assert f"({figure})" in text
        assert (in_project / "reports" / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "offline demo dataset" in text


def test_format_interval():
    assert format_interval(0.621, 0.603, 0.639, 3) == "62.1 ± 1.8 (n=3)"
    assert format_interval(0.5, float("nan"), float("nan"), 1) == "50.0 (n=1, no interval)"


def test_report_fails_naming_the_missing_output(in_project, small_params):
    from dmlbench.errors import DataError

    with pytest.raises(DataError, match=r"runs.json: missing \(run evaluate@glyphs-tiny_cnn-contrastive-32 first\)"):
        report_stage(small_params)
