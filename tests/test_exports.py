"""The report stage's machine-readable outputs: results.csv, the headline metrics files, code versions."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from dmlbench import __version__, paths
from dmlbench.analysis.exports import (
    HEADLINE_FILES,
    code_versions,
    headline,
    results_frame,
    write_exports,
)
from dmlbench.analysis.numbers import summarize
from dmlbench.analysis.report import code_line
from dmlbench.analysis.tournament import tournament

CELL = {"dataset": "glyphs", "backbone": "tiny_cnn"}


def _runs() -> pd.DataFrame:
    """2 losses x 2 dims x 3 seeds; contrastive better at dim 32, triplet at dim 64."""
    rows = []
    scores = {("contrastive", 32): [0.50, 0.52, 0.54], ("triplet", 32): [0.40, 0.42, 0.44]}
    scores |= {("contrastive", 64): [0.30, 0.31, 0.32], ("triplet", 64): [0.60, 0.62, 0.64]}
    for (loss, dim), values in scores.items():
        for seed, value in enumerate(values):
            for metric, v in (("map_at_r", value), ("precision_at_1", value + 0.2), ("ami", value - 0.6)):
                rows.append({**CELL, "loss": loss, "dim": dim, "seed": seed, "metric": metric, "value": v})
    return pd.DataFrame(rows)


def _analysis() -> SimpleNamespace:
    return _analysis_of(_runs())


def _analysis_of(runs: pd.DataFrame) -> SimpleNamespace:
    scores = runs[runs["metric"] == "map_at_r"].groupby(["dim", "loss"], as_index=False)["value"].mean()
    scores = scores.assign(experiment=scores["dim"].astype(str)).rename(columns={"value": "score"})
    return SimpleNamespace(
        params=SimpleNamespace(losses={"contrastive": {}, "triplet": {}}),
        results=SimpleNamespace(runs=runs),
        summary=summarize(runs, 0.95),
        ranking=tournament(scores[["experiment", "loss", "score"]]),
    )


def _codes(runs: pd.DataFrame, code_of=lambda loss: "aaaa") -> pd.DataFrame:
    keys = runs[["dataset", "backbone", "loss", "dim", "seed"]].drop_duplicates()
    return keys.assign(code=[code_of(loss) for loss in keys["loss"]])


def test_headline_is_the_mean_over_cells_in_percent_and_the_tournament_rank():
    table = headline(_analysis())
    assert set(table) == set(HEADLINE_FILES)
    # contrastive: cell means 0.52 (dim 32) and 0.31 (dim 64) -> 41.5 %
    assert table["map_at_r"] == {"contrastive": 41.5, "triplet": 52.0}
    assert table["precision_at_1"] == {"contrastive": 61.5, "triplet": 72.0}
    assert table["mean_rank"] == {"contrastive": 1.5, "triplet": 1.5}  # one win each


def test_results_frame_has_every_run_and_every_cell_with_bounded_intervals():
    analysis = _analysis()
    frame = results_frame(analysis, _codes(analysis.results.runs), "abc123")
    runs, cells = frame[frame["level"] == "run"], frame[frame["level"] == "cell"]
    assert len(runs) == 4 * 3 * 3 and len(cells) == 4 * 3
    assert (runs["n"] == 1).all() and runs["low"].isna().all()
    assert (cells["n"] == 3).all() and cells["seed"].isna().all()
    bounded = cells[cells["metric"] != "ami"]
    assert ((bounded["low"] > 0) & (bounded["high"] < 1) & (bounded["low"] < bounded["value"])).all()
    assert set(bounded["interval"]) == {"t"} and set(cells.loc[cells["metric"] == "ami", "interval"]) == {"t"}
    mean = cells[(cells["loss"] == "triplet") & (cells["dim"] == 64) & (cells["metric"] == "map_at_r")]["value"]
    assert mean.item() == pytest.approx(0.62)
    assert set(frame["dmlbench_version"]) == {__version__} and set(frame["git_commit"]) == {"abc123"}
    assert set(frame["code"]) == {"aaaa"}


def test_interval_labels_name_the_method_per_cell():
    runs = _runs()
    runs.loc[(runs["loss"] == "triplet") & (runs["dim"] == 32) & (runs["metric"] == "map_at_r"), "value"] = [
        0.0,
        0.1,
        0.2,
    ]
    frame = results_frame(_analysis_of(runs), _codes(runs), "c")
    cells = frame[frame["level"] == "cell"].set_index(["loss", "dim", "metric"])["interval"]
    assert cells[("triplet", 32, "map_at_r")] == "t-clipped"  # 0.1 -/+ 4.303 x 0.1 / sqrt(3): cut at 0
    assert cells[("triplet", 64, "map_at_r")] == "t" and cells[("contrastive", 32, "ami")] == "t"


def test_two_code_versions_are_named_with_their_run_counts():
    runs = _runs()
    codes = _codes(runs, lambda loss: "new1" if loss == "contrastive" else "old2")
    versions = code_versions(codes)
    assert versions == {"new1": 6, "old2": 6}
    sentence = code_line(versions)
    assert "2 code versions" in sentence and "`new1` (6 runs)" in sentence and "`old2` (6 runs)" in sentence
    assert "one code version" in code_line({"new1": 12}) and "`new1`" in code_line({"new1": 12})
    frame = results_frame(_analysis(), codes, "c")
    cell_codes = frame[frame["level"] == "cell"].groupby("loss")["code"].first()
    assert cell_codes.to_dict() == {"contrastive": "new1", "triplet": "old2"}


def test_write_exports_writes_the_files_dvc_yaml_declares(tmp_path):
    analysis = _analysis()
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics/.gitignore").write_text("/map_at_r.json\n")  # DVC's, committed to git
    write_exports(analysis, _codes(analysis.results.runs), "abc", tmp_path)
    assert (tmp_path / "metrics/.gitignore").read_text() == "/map_at_r.json\n"
    report = yaml.safe_load((paths.project_root() / "dvc.yaml").read_text())["stages"]["report"]
    declared = [m if isinstance(m, str) else next(iter(m)) for m in report["metrics"]]
    assert sorted(declared) == sorted(f"reports/metrics/{name}.json" for name in HEADLINE_FILES)
    for path in declared:
        written = json.loads((tmp_path / path.removeprefix("reports/")).read_text())
        assert set(written) == {"contrastive", "triplet"}
        assert all(isinstance(v, float) and math.isfinite(v) for v in written.values())
    assert "reports/results.csv" in [o if isinstance(o, str) else next(iter(o)) for o in report["outs"]]
    frame = pd.read_csv(tmp_path / "results.csv")
    assert len(frame) == 36 + 12 and np.isclose(frame["value"].max(), 0.84)
