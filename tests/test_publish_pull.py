"""Publish a grid, pull it elsewhere, add a loss: only the new loss's stages run.

Lab A (a `git clone` of a temporary repository holding the pipeline) runs a glyphs grid of 2
losses x 2 seeds, publishes it to a local-folder DVC remote (``python -m dmlbench.pipeline.publish``,
what ``make publish`` runs) and commits; lab B clones lab A, pulls (what ``make pull`` runs) and
finds every stage up to date before any edit; then it adds a third loss, already registered, and
runs: the runner's logs and ``dvc.lock`` show that exactly the new loss's tune, train (x 2 seeds)
and evaluate stages, validate and the report ran. A copy of lab B right after its pull adds a new
loss file with its registry line (docs/extending.md): again only that loss's stages, validate and
the report. The sequence is the walk-through of docs/extending.md, "Compare your loss with a
published grid".
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import yaml
from helpers.project import dvc_project, run_checked, small_params_dict

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
LOSSES = ["contrastive", "triplet"]
STAGE_KEY = "glyphs-tiny_cnn"


def _new_loss_stages(loss: str) -> set[str]:
    """What adding ``loss`` to the grid must run, and nothing more."""
    return {
        "validate",
        f"tune@{STAGE_KEY}-{loss}",
        f"train@{STAGE_KEY}-{loss}-32-0",
        f"train@{STAGE_KEY}-{loss}-32-1",
        f"evaluate@{STAGE_KEY}-{loss}-32",
        "report",
    }


def _grid_params(default_raw_params: dict) -> dict:
    """The smallest glyphs grid of the pipeline tests: 2 losses x 2 seeds at dim 32, 1 epoch."""
    raw = small_params_dict(default_raw_params)
    raw["datasets"] = {"glyphs": raw["datasets"]["glyphs"]}
    raw["backbones"] = {"tiny_cnn": raw["backbones"]["tiny_cnn"]}
    raw["losses"] = {name: raw["losses"][name] for name in LOSSES}
    raw["dims"], raw["seeds"] = [32], [0, 1]
    raw["protocols"][raw["protocol"]]["epochs"] = 1
    raw["evaluate"] = {**raw.get("evaluate", {}), "bootstrap": {"resamples": 100}}
    return raw


def _env(base: dict[str, str], lab: Path, store: Path) -> dict[str, str]:
    """``base`` with the lab's own MLflow store, and its own ``src/`` before the installed package
    (a lab's code edit is what its runner and stages run)."""
    return {**base, "MLFLOW_TRACKING_URI": f"sqlite:///{store}", "PYTHONPATH": str(lab / "src")}


def _run_grid(root: Path, env: dict[str, str]) -> tuple[set[str], str]:
    """Run the pipeline as ``make repro`` does; the stages that ran (one runner log each) and its output."""
    shutil.rmtree(root / "artifacts" / "logs", ignore_errors=True)
    result = run_checked([sys.executable, "-m", "dmlbench.pipeline", "--jobs", "2"], root, env)
    ran = {path.stem for path in (root / "artifacts" / "logs").glob("*.log")}
    return ran, result.stdout


def _lock(root: Path) -> dict:
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"]


def _changed_in_lock(before: dict, after: dict) -> set[str]:
    return {name for name, entry in after.items() if before.get(name) != entry}


def _dvc_status(root: Path, env: dict[str, str]) -> dict:
    return json.loads(run_checked([sys.executable, "-m", "dvc", "status", "--json"], root, env).stdout)


def _add_loss_and_run(lab: Path, env: dict[str, str], loss: str, values: dict) -> None:
    """Add ``loss`` with ``values`` to the lab's params.yaml and run the grid: exactly
    :func:`_new_loss_stages` run (the runner's logs, the changed ``dvc.lock`` entries, its summary)."""
    params = yaml.safe_load((lab / "params.yaml").read_text())
    params["losses"][loss] = values
    (lab / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    before = _lock(lab)
    ran, out = _run_grid(lab, env)
    expected = _new_loss_stages(loss)
    assert ran == expected, sorted(ran ^ expected)
    assert _changed_in_lock(before, _lock(lab)) == expected
    assert f"{len(expected)} of {len(_lock(lab))} stages run" in out


@pytest.fixture(scope="module")
def labs(tmp_path_factory, default_raw_params):
    """Lab A's published grid and lab B right after its pull (plus a copy of B for the second scenario)."""
    tmp = tmp_path_factory.mktemp("publish")
    origin, lab_a, lab_b, remote = tmp / "origin", tmp / "lab_a", tmp / "lab_b", tmp / "remote"
    env = dvc_project(origin, _grid_params(default_raw_params), mlflow_db=tmp / "unused.db")
    shutil.copy(ROOT / ".gitignore", origin / ".gitignore")  # artifacts/ is git-ignored, as in the repository
    run_checked(["git", "add", ".gitignore"], origin, env)
    run_checked(["git", "commit", "-q", "-m", "the repository's .gitignore"], origin, env)
    run_checked(["git", "clone", "-q", str(origin), str(lab_a)], tmp, env)
    env_a = _env(env, lab_a, tmp / "store_a" / "mlflow.db")
    (tmp / "store_a").mkdir()
    _run_grid(lab_a, env_a)
    run_checked([sys.executable, "-m", "dmlbench.pipeline.publish", "push", str(remote)], lab_a, env_a)
    run_checked(["git", "add", "-A"], lab_a, env_a)
    run_checked(["git", "commit", "-q", "-m", "a published glyphs grid"], lab_a, env_a)

    run_checked(["git", "clone", "-q", str(lab_a), str(lab_b)], tmp, env)
    env_b = _env(env, lab_b, tmp / "store_b" / "mlflow.db")
    (tmp / "store_b").mkdir()
    run_checked([sys.executable, "-m", "dmlbench.pipeline.publish", "pull"], lab_b, env_b)
    lab_c = tmp / "lab_c"  # lab B as pulled, for the second scenario
    shutil.copytree(lab_b, lab_c, symlinks=True)
    env_c = _env(env, lab_c, tmp / "store_c" / "mlflow.db")
    (tmp / "store_c").mkdir()
    return {"a": (lab_a, env_a), "b": (lab_b, env_b), "c": (lab_c, env_c), "remote": remote}


def test_a_pulled_grid_is_up_to_date_before_any_edit(labs):
    lab_b, env_b = labs["b"]
    assert not (lab_b / "artifacts" / "raw").exists()  # the extraction never travels (dataset terms)
    assert _dvc_status(lab_b, env_b) == {}
    again = run_checked([sys.executable, "-m", "dvc", "status"], lab_b, env_b)
    assert "Data and pipelines are up to date" in again.stdout


def test_adding_a_registered_loss_runs_only_its_stages(labs, default_raw_params):
    lab_b, env_b = labs["b"]
    _add_loss_and_run(lab_b, env_b, "multi_similarity", default_raw_params["losses"]["multi_similarity"])
    assert _dvc_status(lab_b, env_b) == {}

    # the report ranks all three losses; results.csv says which runs were pulled, which trained here
    results = pd.read_csv(lab_b / "reports" / "results.csv")
    runs = results[(results["level"] == "run") & (results["metric"] == "map_at_r")]
    where = {(row.loss, int(row.seed)): row.provenance for row in runs.itertuples()}
    assert where == {
        **{(loss, seed): "pulled" for loss in LOSSES for seed in (0, 1)},
        **{("multi_similarity", seed): "trained here" for seed in (0, 1)},
    }
    cells = results[(results["level"] == "cell") & (results["metric"] == "map_at_r")]
    assert sorted(cells["loss"]) == sorted([*LOSSES, "multi_similarity"])
    assert (
        (cells["n"] == 2).all() and (cells["low"] <= cells["value"]).all() and (cells["value"] <= cells["high"]).all()
    )

    # MLflow in lab B shows lab A's 4 trainings once, after a second pull and import
    run_checked([sys.executable, "-m", "dmlbench.pipeline.publish", "pull"], lab_b, env_b)
    run_checked([sys.executable, "-m", "dmlbench.tracking.pulled"], lab_b, env_b)
    client = mlflow.MlflowClient(env_b["MLFLOW_TRACKING_URI"])
    experiments = [e.experiment_id for e in client.search_experiments()]
    pulled = client.search_runs(experiments, "tags.source = 'pulled'", max_results=1000)
    assert sorted((r.data.tags["loss"], r.data.tags["seed"]) for r in pulled) == sorted(
        (loss, str(seed)) for loss in LOSSES for seed in (0, 1)
    )


def test_adding_a_new_loss_file_and_its_registry_line_runs_only_its_stages(labs):
    lab_c, env_c = labs["c"]
    losses = lab_c / "src" / "dmlbench" / "losses"
    # a new loss: one module named as it, one registry line, one methods.csv row, one params.yaml line
    source = (losses / "triplet.py").read_text()
    assert source.count('name="triplet"') == 1
    (losses / "my_triplet.py").write_text(source.replace('name="triplet"', 'name="my_triplet"'))
    registry = (losses / "__init__.py").read_text()
    registry = registry.replace("    triplet,\n", "    my_triplet,\n    triplet,\n", 1)
    registry = registry.replace("        triplet.SPEC,\n", "        triplet.SPEC,\n        my_triplet.SPEC,\n", 1)
    (losses / "__init__.py").write_text(registry)
    methods = lab_c / "src" / "dmlbench" / "analysis" / "methods.csv"
    row = next(line for line in methods.read_text().splitlines() if line.startswith("triplet,"))
    methods.write_text(methods.read_text() + row.replace("triplet,Triplet,", "my_triplet,My triplet,", 1) + "\n")
    _add_loss_and_run(lab_c, env_c, "my_triplet", {})
