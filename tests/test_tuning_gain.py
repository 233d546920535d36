"""Tuned vs published on the test classes: the gain's paired (or Welch) interval, ranks and swapped pairs,
and the baseline cells read back from their evaluation files."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dmlbench import paths
from dmlbench.analysis.tuning import difference_interval, load_baseline_runs, swapped_pairs, tuning_gain
from dmlbench.errors import ConfigError
from dmlbench.grid import Combo
from dmlbench.io import write_json
from dmlbench.params.complete import parse_complete as parse_params


def _welch(a, b, confidence=0.95):
    """Welch's interval from its textbook formula (Welch 1947; Satterthwaite degrees of freedom)."""
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = stats.t.ppf((1 + confidence) / 2, df) * math.sqrt(va + vb)
    diff = np.mean(a) - np.mean(b)
    return diff, diff - half, diff + half


def test_difference_interval_is_welchs_and_stays_in_range():
    a, b = [0.31, 0.35, 0.30], [0.25, 0.27, 0.22, 0.26]
    estimate, low, high, p = difference_interval(np.array(a), np.array(b), 0.95, 1.0)
    assert (estimate, low, high) == pytest.approx(_welch(a, b), abs=1e-12)
    assert 0 < p < 0.05
    # a wide interval is cut at the span of two [0, 1] scores
    _, low, high, _ = difference_interval(np.array([0.05, 0.95]), np.array([0.5, 0.52]), 0.95, 1.0)
    assert low == -1.0 and high == 1.0
    # one value, or no spread on either side: no interval rather than a zero-width one
    assert all(math.isnan(x) for x in difference_interval(np.array([0.3]), np.array([0.2, 0.25]), 0.95, 1.0)[1:])
    assert all(math.isnan(x) for x in difference_interval(np.array([0.3, 0.3]), np.array([0.2, 0.2]), 0.95, 1.0)[1:])


def test_difference_interval_pairs_matched_seeds():
    """Hand-computed: differences per seed 0.06, 0.08, 0.08: mean 0.0733, sd 0.011547, se 0.0066667,
    t_{0.975, 2} = 4.302653: 0.0733 -/+ 0.02868 = [0.0447, 0.1020], far narrower than Welch's
    (the seeds' shared luck cancels)."""
    a, b = np.array([0.31, 0.35, 0.30]), np.array([0.25, 0.27, 0.22])
    estimate, low, high, p = difference_interval(a, b, 0.95, 1.0, paired=True)
    half = 4.302653 * 0.011547005 / math.sqrt(3)
    assert (estimate, low, high) == pytest.approx((0.22 / 3, 0.22 / 3 - half, 0.22 / 3 + half), abs=1e-6)
    assert p == pytest.approx(stats.ttest_rel(a, b).pvalue)
    welch = difference_interval(a, b, 0.95, 1.0)
    assert welch[2] - welch[1] > 2 * (high - low)
    # equal differences: no spread to build an interval on
    assert math.isnan(difference_interval(a, a - 0.1, 0.95, 1.0, paired=True)[1])


def test_the_search_seed_is_left_out_of_what_tuning_bought():
    """A grid seed that is also the search's seed repeats the trial the search picked: left out of both sides."""
    published = _runs({"contrastive": [0.30, 0.31, 0.29]})
    tuned = _runs({"contrastive": [0.40, 0.31, 0.30]})  # seed 0 carries the search's luck
    kept = tuning_gain(tuned, published, "map_at_r", 0.95, exclude_seeds=(0,)).iloc[0]
    assert (kept["tuned_n"], kept["baseline_n"]) == (2, 2) and kept["gain"] == pytest.approx(0.005)
    assert tuning_gain(tuned, published, "map_at_r", 0.95).iloc[0]["gain"] == pytest.approx(0.11 / 3)


def _runs(values: dict[str, list[float]], dim: int = 64) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "dataset": "glyphs",
                "backbone": "tiny_cnn",
                "loss": loss,
                "dim": dim,
                "seed": s,
                "metric": "map_at_r",
                "value": v,
            }
            for loss, seeds in values.items()
            for s, v in enumerate(seeds)
        ]
    )


def test_gain_ranks_and_swaps():
    published = _runs(
        {"contrastive": [0.30, 0.31, 0.29], "triplet": [0.25, 0.26, 0.24], "proxy_anchor": [0.20, 0.22, 0.21]}
    )
    tuned = pd.concat([
        _runs({"contrastive": [0.30, 0.30, 0.31], "triplet": [0.25, 0.27, 0.25], "proxy_anchor": [0.33, 0.36, 0.34]}),
        _runs({"contrastive": [0.9, 0.9, 0.9]}, dim=32),  # another dim of the grid: not compared
    ])  # fmt: skip
    gains = tuning_gain(tuned, published, "map_at_r", 0.95).set_index("loss")
    assert gains.loc["proxy_anchor", "gain"] == pytest.approx(0.40 / 3)
    assert gains["paired"].all()  # the same seeds on both sides: paired over them
    assert gains.loc["proxy_anchor", "p_value"] < 0.01 and gains.loc["contrastive", "p_value"] > 0.05
    assert gains.loc["proxy_anchor", "tuned_low"] < 0.34 < gains.loc["proxy_anchor", "tuned_high"]
    assert 0 <= gains.loc["proxy_anchor", "baseline_low"] and gains.loc["proxy_anchor", "tuned_n"] == 3
    assert gains["rank_baseline"].to_dict() == {"contrastive": 1, "triplet": 2, "proxy_anchor": 3}
    assert gains["rank_tuned"].to_dict() == {"contrastive": 2, "triplet": 3, "proxy_anchor": 1}
    swaps = {(a, b) for _, _, a, b in swapped_pairs(gains.reset_index())}
    assert swaps == {("contrastive", "proxy_anchor"), ("triplet", "proxy_anchor")}


def test_baseline_runs_are_read_from_their_cells_only(small_raw_params, tmp_path, monkeypatch):
    raw = {**small_raw_params, "dims": [32, 64]}
    raw["protocols"] = {k: dict(v) for k, v in raw["protocols"].items()}
    raw["protocols"][raw["protocol"]]["hyperparameters"] = "tuned"
    raw["tuning"] = {**raw["tuning"], "dim": 64, "baselines": ["published"]}
    params = parse_params(raw)
    monkeypatch.chdir(tmp_path)
    loss = next(iter(params.losses))
    cell = Combo("glyphs", "tiny_cnn", loss, 64, "published")
    assert paths.evaluation_dir(cell).as_posix().endswith(f"glyphs/tiny_cnn/{loss}-published")  # one dim: no level
    runs = {f"seed{s}": {"seed": s, "metrics": {"map_at_r": 0.2 + s / 100}} for s in params.seeds}
    write_json(paths.evaluation_dir(cell) / "runs.json", {"combo": cell.key, "runs": runs})
    write_json(
        paths.evaluation_dir(Combo("glyphs", "tiny_cnn", loss, 64)) / "runs.json", {"runs": {}}
    )  # the tuned cell
    found = load_baseline_runs(params, "published")
    assert list(found["loss"].unique()) == [loss] and sorted(found["value"]) == [0.2 + s / 100 for s in params.seeds]


def test_baselines_need_a_tuned_protocol_and_the_tuning_dim_in_the_grid(small_raw_params):
    raw = {**small_raw_params, "tuning": {**small_raw_params["tuning"], "baselines": ["published"]}}
    with pytest.raises(ConfigError, match=r"tuning.baselines: \['published'\] compares tuned with published values"):
        parse_params(raw)  # the small params train the published values
    raw["protocols"] = {k: dict(v) for k, v in raw["protocols"].items()}
    raw["protocols"][raw["protocol"]]["hyperparameters"] = "tuned"
    raw["tuning"]["dim"] = 48
    with pytest.raises(ConfigError, match=r"tuning.dim 48, which dims \[32, 64\] does not list"):
        parse_params(raw)
    raw["tuning"]["baselines"] = ["published", "published"]
    with pytest.raises(ConfigError, match="repeated"):
        parse_params(raw)
    raw["tuning"]["baselines"] = ["defaults"]
    with pytest.raises(ConfigError, match="published"):
        parse_params(raw)


def _fake_searches(params, kept: set[tuple[str, str]]) -> None:
    """best.yaml, trials.csv and study.json of every search; the (dataset, loss) pairs in ``kept``
    kept the published values (trial 0 won); baseline runs a little below the tuned cells."""
    import yaml

    from dmlbench.params.tuning import baseline_combos

    for dataset in params.datasets:
        for backbone in params.backbones:
            for i, loss in enumerate(params.losses):
                folder = paths.tuning_dir(dataset, backbone, loss)
                folder.mkdir(parents=True)
                same = (dataset, loss) in kept
                best = {
                    "hyperparameters": "tuned", "study": f"s-{dataset}-{loss}", "trial": 0 if same else 3,
                    "value": 0.4 + 0.05 * i, "published_value": 0.38, "folds": 2,
                    "values": {"margin": 0.1} if same else {"margin": 0.3}, "published": {"margin": 0.1},
                    "space": {"margin": "[0.0, 1.0]"},
                }  # fmt: skip
                (folder / "best.yaml").write_text(yaml.safe_dump(best))
                trials = {"number": [0, 1], "state": ["complete"] * 2, "objective": [0.38, best["value"]]}
                pd.DataFrame(trials).to_csv(folder / "trials.csv", index=False)
                write_json(folder / "study.json", {"trials": {"complete": 2}, "trainings": 4})
    for combo in baseline_combos(params):
        runs = {
            f"seed{seed}": {"seed": seed, "metrics": {"map_at_r": 0.2 + 0.01 * seed, "precision_at_1": 0.3}}
            for seed in params.seeds
        }
        write_json(paths.evaluation_dir(combo) / "runs.json", {"combo": combo.key, "runs": runs})


def test_the_tuning_tables_name_each_rows_dataset_and_backbone_when_there_are_several(
    in_project, small_raw_params, prepared_glyphs, mlflow_store, tmp_path
):
    """Two datasets searched: every row of the three tables names its experiment, and "same values"
    (the search kept the published ones) is said of the one experiment where it happened only."""
    import copy
    import shutil

    from helpers.report_fakes import fake_outputs

    from dmlbench.analysis.report import report_stage

    raw = copy.deepcopy(small_raw_params)
    raw["protocols"][raw["protocol"]]["hyperparameters"] = "tuned"
    raw["tuning"].update(dim=32, baselines=["published"])
    raw["datasets"]["cub200"] = {"source": {}, "split": {"scheme": "fixed_val", "val_fraction": 0.25, "seed": 0}}
    params = parse_params(raw)
    shutil.copytree(prepared_glyphs[0] / "prepared", paths.prepared_dir("cub200"))
    fake_outputs(params, prepared_glyphs)
    first = next(iter(params.losses))
    _fake_searches(params, kept={("glyphs", first)})
    report_stage(params, report_dir=tmp_path / "report", log_to_mlflow=False)

    text = (tmp_path / "report" / "report.md").read_text()
    section = text[text.index("## Tuning") :]
    section = section[: section.index("\n## ", 3)]
    tables = [block for block in section.split("\n\n") if block.startswith("| experiment | loss |")]
    assert len(tables) == 3  # best values, sensitivity, what tuning bought on the test classes
    for table in tables:
        rows = table.splitlines()[2:]
        assert len(rows) == 2 * len(params.losses)
        assert {row.split(" | ")[0] for row in rows} == {"| `glyphs` / `tiny_cnn`", "| `cub200` / `tiny_cnn`"}
    bought = [row for row in tables[2].splitlines()[2:] if "same values" in row]
    assert len(bought) == 1 and bought[0].startswith("| `glyphs` / `tiny_cnn` |")
    assert "kept the published values of" in section and "(`glyphs` / `tiny_cnn`)" in section
