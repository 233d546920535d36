"""End to end: the real DVC pipeline on a reduced grid, run the way `make repro` runs it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers.project import dvc_project, run_checked, small_params_dict

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def project(tmp_path_factory, default_raw_params):
    """A copy of the repository with a reduced grid, after one parallel `make repro`-style run."""
    tmp = tmp_path_factory.mktemp("pipeline")
    root = tmp / "repo"
    raw = small_params_dict(default_raw_params)
    raw["losses"] = {"contrastive": raw["losses"]["contrastive"], "proxy_anchor": raw["losses"]["proxy_anchor"]}
    raw["dims"], raw["seeds"] = [32], [0, 1]
    raw["protocols"][raw["protocol"]]["hyperparameters"] = "tuned"  # tune@ stages first (2 trials per loss)
    raw["tuning"].update(dim=32, baselines=["published"])  # and the published values beside (baseline@)
    env = dvc_project(root, raw, mlflow_db=tmp / "store" / "mlflow.db")
    first = run_checked([sys.executable, "-m", "dmlbench.pipeline", "--jobs", "2"], root, env)
    return root, env, first


def _mlflow_runs(env, kind: str | None = "train"):
    """Active MLflow runs, of one ``kind`` tag (train, summary, report) or all (None)."""
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    return mlflow.search_runs(search_all_experiments=True, filter_string=f"tags.kind = '{kind}'" if kind else "")


def test_pipeline_produces_report_metrics_and_one_mlflow_run_per_training(project):
    root, env, first = project
    assert "Data and pipelines are up to date" in first.stdout  # the closing `dvc repro` found nothing left
    assert "didn't change, skipping" not in first.stdout  # one line per stage, left out
    # the closing summary: every stage ran, the report's tournament table, where to look next
    summary = first.stdout.split("Data and pipelines are up to date.", 1)[1]
    stages = len(yaml.safe_load((root / "dvc.lock").read_text())["stages"])
    assert f"\n{stages} of {stages} stages run, 0 up to date, in " in summary
    assert (
        "| loss | total rank | mean rank | std of rank | experiments | mean rank over datasets [95% CI] (n = 1) |"
        in summary
    )
    assert "Report: reports/report.md" in summary and "make ui" in summary
    # one line per epoch in each training log: loss, the selection metric on validation, throughput
    log = (root / "artifacts" / "logs" / "train@glyphs-tiny_cnn-contrastive-32-0.log").read_text()
    epochs = [
        line for line in log.splitlines() if re.match(r"glyphs-tiny_cnn-contrastive-32-0 epoch \d/2: loss ", line)
    ]
    assert len(epochs) == 2 and all(re.search(r"epoch \d/2: loss \d+\.\d{4}, val map_at_r 0\.\d{4}", e) for e in epochs)
    assert "(best)" in epochs[0] and "test_feedback" not in log
    # `dvc plots show` builds a page: one plot per experiment, one line per loss
    curves = (root / "reports" / "curves" / "glyphs-tiny_cnn-32.csv").read_text().splitlines()
    assert curves[0] == "epoch,loss,validation,train_loss" and len(curves) == 1 + 2 * 2  # 2 losses x 2 epochs
    page = run_checked([sys.executable, "-m", "dvc", "plots", "show", "-o", "plots_page"], root, env)
    assert "failed" not in page.stdout + page.stderr
    html = (root / "plots_page" / "index.html").read_text()
    assert "reports/curves/glyphs-tiny_cnn-32.csv" in html
    assert '"loss": "Contrastive"' in html and '"loss": "Proxy-Anchor"' in html
    report = (root / "reports" / "report.md").read_text()
    assert "## Tournament of losses" in report and "| mean rank over datasets [95% CI] (n = 1) |" in report
    assert (root / "reports" / "figures" / "metric_by_loss.png").stat().st_size > 10_000

    # `dvc metrics show`: the report's headline, a row per metric and a column per loss
    shown = json.loads(run_checked([sys.executable, "-m", "dvc", "metrics", "show", "--json"], root, env).stdout)
    files = {Path(k).stem: v["data"] for k, v in next(iter(shown.values()))["data"].items()}
    assert set(files) == {"map_at_r", "precision_at_1", "mean_rank"}
    assert all(set(row) == {"contrastive", "proxy_anchor"} for row in files.values())
    assert all(0 < v <= 100 for name in ("map_at_r", "precision_at_1") for v in files[name].values())
    assert sorted(files["mean_rank"].values()) in ([1.0, 2.0], [1.5, 1.5])  # 1 experiment, 2 losses
    # every cell's full metrics file, with its interval over seeds; the baseline row's is a bootstrap
    cell = json.loads((root / "artifacts/metrics/glyphs/tiny_cnn/contrastive/32.json").read_text())
    mean = cell["test"]["map_at_r"]["mean"]
    assert cell["n_runs"] == 2 and cell["test"]["map_at_r"]["low"] <= mean <= cell["test"]["map_at_r"]["high"]
    baseline = json.loads((root / "artifacts/metrics/glyphs/tiny_cnn/pretrained.json").read_text())
    assert baseline["n_runs"] == 1 and baseline["test"]["map_at_r"]["interval"] == "class-bootstrap-percentile"
    results = pd.read_csv(root / "reports" / "results.csv")
    assert set(results["level"]) == {"run", "cell"} and len(results[results["level"] == "run"]["seed"].unique()) == 2
    # nothing left to do, nothing to commit: dvc status is clean (the repository ships no data.dvc)
    status = run_checked([sys.executable, "-m", "dvc", "status"], root, env)
    assert "up to date" in status.stdout and "not in cache" not in status.stdout

    all_runs = _mlflow_runs(env, kind=None)
    summaries = all_runs[all_runs["tags.kind"] == "summary"]  # one per grid cell and baseline
    assert set(summaries["tags.combo_key"]) == {
        "glyphs-tiny_cnn-contrastive-32",
        "glyphs-tiny_cnn-proxy_anchor-32",
        "glyphs-tiny_cnn-contrastive-published-32",
        "glyphs-tiny_cnn-proxy_anchor-published-32",
        "glyphs-tiny_cnn-pretrained",
    }
    trained = all_runs[all_runs["tags.kind"] == "train"]
    published = trained[trained["tags.variant"] == "published"]  # the baseline@ stages' runs
    assert set(published["tags.dvc_stage"]) == {
        f"baseline@glyphs-tiny_cnn-{loss}-published" for loss in ("contrastive", "proxy_anchor")
    }
    assert len(published) == 4 and published.get("tags.study", pd.Series([None])).isna().all()  # no study behind them
    runs = trained[trained["tags.variant"] != "published"]
    settled = all_runs[all_runs["tags.kind"] != "trial"]  # a trial may fail (e.g. pos_margin >= neg_margin)
    assert len(runs) == 4 and set(settled["status"]) == {"FINISHED"}
    # the search: one study run per loss, its trials nested under it, the train runs tagged with it
    studies, trials = all_runs[all_runs["tags.kind"] == "study"], all_runs[all_runs["tags.kind"] == "trial"]
    assert len(studies) == 2 and set(trials["tags.mlflow.parentRunId"]) <= set(studies["run_id"])
    assert (trials["tags.trial_state"] != "failed").sum() == 4  # 2 counted trials per loss
    for loss in ("contrastive", "proxy_anchor"):
        best = yaml.safe_load((root / f"artifacts/tuning/glyphs/tiny_cnn/{loss}/best.yaml").read_text())
        tagged = runs[runs["tags.dvc_stage"].str.contains(loss)]
        assert set(tagged["tags.study"]) == {best["study"]} and best["hyperparameters"] == "tuned"
    assert "## Tuning" in report
    # tuned vs published on the test classes: each loss's two means with n=2 intervals, the gain, the ranks
    section = report.split("## Tuning", 1)[1].split("\n## ", 1)[0]
    assert "What tuning bought on the test classes" in section
    table = [line for line in section.splitlines() if line.startswith(("| Contrastive |", "| Proxy-Anchor |"))]
    assert len([line for line in table if " -> " in line]) == 2
    assert "order of the losses by mean test score" in section or "swap places" in section
    assert set(runs["tags.dvc_stage"]) == {
        f"train@glyphs-tiny_cnn-{loss}-32-{seed}" for loss in ("contrastive", "proxy_anchor") for seed in (0, 1)
    }
    assert runs["metrics.test/map_at_r"].notna().all() and runs["metrics.val/recall_at_1"].notna().all()
    assert runs["tags.artifact.model.md5"].str.fullmatch(r"[0-9a-f]{32}").all()
    assert runs["tags.git_commit"].str.fullmatch(r"[0-9a-f]{40}").all()
    reports = _mlflow_runs(env, kind="report")
    assert len(reports) == 1 and reports["status"].iloc[0] == "FINISHED"


def test_second_repro_is_a_no_op(project):
    root, env, _ = project
    again = run_checked([sys.executable, "-m", "dvc", "repro"], root, env)
    assert "Running stage" not in again.stdout
    assert "Data and pipelines are up to date" in again.stdout
    # no new run of any kind: 4 + 4 training runs (grid, published baseline), 5 summaries (2 grid
    # cells, 2 baseline cells, the pretrained trunk), 1 report
    assert len(_mlflow_runs(env)) == 8
    assert len(_mlflow_runs(env, kind="summary")) == 5 and len(_mlflow_runs(env, kind="report")) == 1


def test_one_loss_hyperparameter_reruns_only_that_loss(project):
    root, env, _ = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["losses"]["contrastive"]["neg_margin"] = 0.6
    original = (root / "params.yaml").read_text()
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        status = json.loads(run_checked([sys.executable, "-m", "dvc", "status", "--json"], root, env).stdout)
        assert set(status) == {"validate"}  # DVC sees the edit where it is read: params.yaml, by validate
        run_checked([sys.executable, "-m", "dvc", "repro", "validate"], root, env)  # rewrites the manifests
        status = json.loads(run_checked([sys.executable, "-m", "dvc", "status", "--json"], root, env).stdout)
    finally:
        (root / "params.yaml").write_text(original)
        run_checked([sys.executable, "-m", "dvc", "repro", "validate"], root, env)  # the manifests as they were
    assert "validate" not in status
    stale = {name for name in status if name.startswith(("train@", "embed@", "evaluate@", "baseline@"))}
    assert stale == {
        "train@glyphs-tiny_cnn-contrastive-32-0",
        "train@glyphs-tiny_cnn-contrastive-32-1",
        "baseline@glyphs-tiny_cnn-contrastive-published",
    }
    assert "report" in status  # reads every param


def test_bad_params_fail_the_first_stage_in_one_line(project):
    root, env, _ = project
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["losses"]["tripplet"] = {}
    original = (root / "params.yaml").read_text()
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        runner = run_checked([sys.executable, "-m", "dmlbench.pipeline", "--jobs", "2"], root, env, check=False)
        plain = run_checked([sys.executable, "-m", "dvc", "repro"], root, env, check=False)
    finally:
        (root / "params.yaml").write_text(original)
    assert runner.returncode == 2
    assert (
        runner.stderr.strip().count("\n") == 0 and "losses.tripplet: unknown loss 'tripplet'; valid:" in runner.stderr
    )
    assert plain.returncode != 0
    ours = [line for line in plain.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and "losses.tripplet: unknown loss 'tripplet'; valid: arcface, circle, contrastive" in ours[0]
