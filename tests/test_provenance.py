"""Which runs this workspace trained and which were pulled: the identity columns of results.csv,
the report's marker, the refusal to pair runs of different protocol/data/split, and pulled runs
imported into MLflow once."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from helpers.report_fakes import fake_outputs

from dmlbench import paths
from dmlbench.analysis.identity import run_identities
from dmlbench.analysis.pairing import UnpairableRuns
from dmlbench.analysis.report import report_stage
from dmlbench.io import read_json, write_json
from dmlbench.params.protocol import protocol_values
from dmlbench.tracking.pulled import import_pulled
from dmlbench.tracking.workspace import WORKSPACE_FILE, workspace_id


def _record(params, run, workspace: str | None, protocol: dict | None = None) -> None:
    """Give ``run`` a config hash and ``config.yaml`` (its protocol as recorded); a run log of this
    training naming ``workspace`` (None: no run log, as after a ``dvc pull``)."""
    model = paths.model_dir(run)
    info = read_json(model / "run.json") | {"config_hash": f"hash-{run.key}", "code": "c0de"}
    write_json(model / "run.json", info)
    resolved = {"protocol": protocol or protocol_values(params.protocol_name, params.protocol_for(run)),
                "dataset": {"name": run.dataset, **params.datasets[run.dataset].model_dump(mode="json")}}  # fmt: skip
    (model / "config.yaml").write_text(yaml.safe_dump(resolved))
    if workspace is not None:
        write_json(paths.runlog_file(run), {"config_hash": info["config_hash"], "workspace": workspace})


def test_the_workspace_id_is_made_once_per_workspace(tmp_path):
    first = workspace_id(tmp_path / "a")
    assert workspace_id(tmp_path / "a") == first and len(first) == 16
    assert (tmp_path / "a" / WORKSPACE_FILE).exists()
    assert workspace_id(tmp_path / "b") != first  # a clone gets its own


def test_identities_say_what_pairs_runs_and_where_each_was_trained(in_project, small_params, prepared_glyphs):
    fake_outputs(small_params, prepared_glyphs)
    here = workspace_id()
    runs = small_params.runs()
    _record(small_params, runs[0], here)  # trained here
    _record(small_params, runs[1], "0123456789abcdef")  # another workspace's run log (a copied folder)
    _record(small_params, runs[2], None)  # pulled: no run log
    (in_project / ".dvc").mkdir()
    (in_project / ".dvc" / "config").write_text("[core]\n    remote = lab\n['remote \"lab\"']\n    url = /srv/grid\n")
    frame = run_identities(small_params).set_index(["loss", "dim", "seed"])
    first = frame.loc[(runs[0].loss, runs[0].dim, runs[0].seed)]
    assert (first["provenance"], first["origin"], first["code"]) == ("trained here", "this workspace", "c0de")
    for run in runs[1:3]:
        row = frame.loc[(run.loss, run.dim, run.seed)]
        assert (row["provenance"], row["origin"]) == ("pulled", "DVC remote lab (/srv/grid)")
    # a run's recorded protocol and the params' fallback (no config.yaml) give one digest; split and data too
    assert frame["protocol_digest"].nunique() == 1 and frame["dataset_checksum"].nunique() == 1
    assert frame["split"].iloc[0] == "scheme=fixed_val,seed=0,val_fraction=0.25"
    assert frame["dataset_checksum"].iloc[0] != "unknown" and (frame["precision"] == "fp32").all()


def test_the_report_refuses_to_pair_runs_of_another_protocol_in_one_line(in_project, small_params, prepared_glyphs):
    fake_outputs(small_params, prepared_glyphs)
    run = small_params.runs()[4]
    other = protocol_values(small_params.protocol_name, small_params.protocol_for(run)) | {"lr": 0.5}
    _record(small_params, run, None, other)
    with pytest.raises(UnpairableRuns) as refused:
        report_stage(small_params, log_to_mlflow=False)
    message = str(refused.value)
    assert "\n" not in message and "protocol_digest" in message and f"/{run.loss}/{run.dim} seed {run.seed}" in message
    assert not (in_project / "reports").exists()  # refused before anything was written


def test_report_marks_pulled_rows_and_mlflow_shows_each_pulled_run_once(
    in_project, small_params, prepared_glyphs, mlflow_store
):
    import mlflow

    fake_outputs(small_params, prepared_glyphs)
    here = workspace_id()
    mine = [r for r in small_params.runs() if r.loss == "triplet"]  # trained here; the rest pulled
    for run in small_params.runs():
        _record(small_params, run, here if run in mine else None)
    text = report_stage(small_params).read_text()
    results = text.split("## Results on the test classes")[1].split("![")[0]
    table = [line.split("|") for line in results.split("### `glyphs` / `tiny_cnn`")[1].splitlines() if "| 32 |" in line]
    rows = {cells[1].strip(): cells[3].strip() for cells in table}
    assert rows["Triplet"] == "here" and rows["Contrastive"] == "pulled"
    assert "Column *trained*: `here` = every seed of the cell was trained in this workspace" in results
    csv = pd.read_csv(in_project / "reports" / "results.csv")
    runs = csv[csv["level"] == "run"]
    assert set(runs.loc[runs["loss"] == "triplet", "provenance"]) == {"trained here"}
    assert set(runs.loc[runs["loss"] != "triplet", "provenance"]) == {"pulled"}
    assert runs[["protocol_digest", "dataset_checksum", "split", "inputs_manifest", "device"]].notna().all().all()

    assert import_pulled(small_params) == 0  # a second import (after a second pull) adds nothing
    mlflow.set_tracking_uri(mlflow_store)
    pulled = mlflow.search_runs(search_all_experiments=True, filter_string="tags.source = 'pulled'")
    expected = len(small_params.runs()) - len(mine)
    assert len(pulled) == expected and pulled["tags.original_run"].nunique() == expected
    assert "triplet" not in set(pulled["tags.loss"]) and (pulled["status"] == "FINISHED").all()
    one = pulled.iloc[0]
    assert one["tags.original_run"] == f"{one['tags.grid_key']}@{one['tags.config_hash']}"
    history = mlflow.tracking.MlflowClient(mlflow_store).get_metric_history(one["run_id"], "val/map_at_r")
    assert [m.step for m in history] == [1, 2, 3]
    assert not pd.isna(one["metrics.test/map_at_r"]) and one["params.protocol.name"] == small_params.protocol_name
