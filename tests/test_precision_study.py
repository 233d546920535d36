"""``benchmarks/precision_study.py`` (bf16 vs fp32 training, a GPU script): its statistics against
scipy's own tests, and its smoke grid end to end on the CPU (every code path, the JSON it writes)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]


def _study():
    spec = importlib.util.spec_from_file_location("precision_study", ROOT / "benchmarks" / "precision_study.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["precision_study"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_paired_difference_interval_and_equivalence_test_match_scipy():
    study = _study()
    fp32, bf16 = [0.300, 0.310, 0.295], [0.302, 0.306, 0.298]
    result = study.paired_comparison(fp32, bf16)
    diffs = np.array(bf16) - np.array(fp32)  # +0.002, -0.004, +0.003
    low, high = stats.t.interval(0.95, 2, loc=diffs.mean(), scale=stats.sem(diffs))
    assert result["n_pairs"] == 3 and result["mean"] == pytest.approx(diffs.mean())
    assert (result["low"], result["high"]) == (pytest.approx(low), pytest.approx(high))
    # TOST: the larger of the two one-sided p-values against -1 and +1 point
    tost = max(
        stats.ttest_1samp(diffs, -0.01, alternative="greater").pvalue,
        stats.ttest_1samp(diffs, 0.01, alternative="less").pvalue,
    )
    assert result["p_equivalent"] == pytest.approx(tost) and tost < 0.05  # ~0.024: both one-sided tests reject
    assert result["verdict"] == "equivalent within +-1 point"
    lower = study.paired_comparison([0.30, 0.31, 0.32], [0.25, 0.255, 0.27])  # 5 points lower, consistently
    assert lower["high"] < 0 and lower["verdict"] == "bf16 lower"
    noisy = study.paired_comparison([0.30, 0.31, 0.32], [0.33, 0.28, 0.33])
    assert noisy["low"] < 0 < noisy["high"] and noisy["verdict"].startswith("inconclusive")
    one = study.paired_comparison([0.3], [0.31])
    assert one["verdict"] == "no test (one pair)" and math.isnan(one["low"])
    runs = [
        {"loss": "a", "seed": s, "arm": arm, "map_at_r": v}
        for s, (x, y) in enumerate(zip(fp32, bf16, strict=True))
        for arm, v in (("fp32", x), ("bf16", y))
    ] + [{"loss": "b", "seed": 0, "arm": "fp32", "error": "RuntimeError: x"}, {"loss": "b", "seed": 0, "arm": "bf16"}]
    compared = study.comparisons(runs)
    assert list(compared) == ["a"] and compared["a"]["mean"] == pytest.approx(diffs.mean())  # b has no pair


def test_smoke_grid_runs_every_path_and_writes_the_json(tmp_path, capsys):
    study = _study()
    assert study.main(["--out", str(tmp_path), "--smoke", "--device", "cpu"]) == 0
    report = json.loads((tmp_path / "precision_study.json").read_text())
    runs = report["runs"]
    assert [(r["seed"], r["arm"], r["precision"]) for r in runs] == [
        (0, "fp32", "fp32"), (0, "bf16", "bf16"), (1, "fp32", "fp32"), (1, "bf16", "bf16"),
    ]  # fmt: skip
    assert all(0 <= r["map_at_r"] <= 1 and r["compile"] == "off (protocol)" for r in runs)
    assert report["comparisons"]["multi_similarity"]["n_pairs"] == 2 and report["stopped"] is None
    assert "| multi_similarity | 2 |" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precision_study.json"]
    # a budget already spent: nothing trains, and the JSON says why
    assert study.main(["--out", str(tmp_path / "none"), "--smoke", "--device", "cpu", "--budget-s", "0"]) == 0
    report = json.loads((tmp_path / "none" / "precision_study.json").read_text())
    assert report["runs"] == [] and report["comparisons"] == {}
    assert report["stopped"] == "time budget 0 s: stopped before multi_similarity seed 0"
