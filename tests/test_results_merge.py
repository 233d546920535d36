"""Results indexes of several labs merged into one (python -m dmlbench.results): datasets of
different labs become blocks of one ranking; protocols, data or values that differ are refused in
one line."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from dmlbench.analysis.exports import results_frame
from dmlbench.analysis.friedman import friedman
from dmlbench.analysis.numbers import summarize
from dmlbench.results.__main__ import main
from dmlbench.results.merge import MergeRefused, merge_indexes, read_index
from dmlbench.results.report import merged_report

LOSSES = {"multi_similarity": 0.70, "contrastive": 0.55, "triplet": 0.40}  # the same order on every dataset


def _lab(dataset: str, losses=LOSSES, digest: str = "p" * 12, protocol: str = "reality_check",
         provenance: str = "trained here") -> pd.DataFrame:  # fmt: skip
    """A lab's results.csv rows, written by the report stage's own writer (3 seeds, one backbone and dim)."""
    rows, identities = [], []
    for loss, quality in losses.items():
        for seed in range(3):
            run = {"dataset": dataset, "backbone": "resnet50", "loss": loss, "dim": 128, "seed": seed}
            for metric, offset in (("map_at_r", 0.0), ("precision_at_1", 0.2)):
                rows.append({**run, "metric": metric, "value": quality + offset + 0.01 * seed})
            identities.append(
                {**run, "code": "c0de", "protocol": protocol, "protocol_digest": digest,
                 "split": "num_folds=4,scheme=rc_cv", "dataset_checksum": f"{dataset[:4]}sum", "inputs_manifest": "m",
                 "device": "NVIDIA H100", "precision": "bf16", "provenance": provenance, "origin": "this workspace"}
            )  # fmt: skip
    runs = pd.DataFrame(rows)
    analysis = SimpleNamespace(results=SimpleNamespace(runs=runs), summary=summarize(runs, 0.95))
    return results_frame(analysis, pd.DataFrame(identities), "abc")


def _write(tmp_path, name: str, frame: pd.DataFrame):
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def test_two_labs_with_different_datasets_give_one_ranking_with_both_datasets_as_blocks(tmp_path):
    a = _write(tmp_path, "a.csv", _lab("cub200"))
    b = _write(tmp_path, "b.csv", _lab("cars196"))
    out = tmp_path / "merged.csv"
    assert main(["merge", str(a), str(b), "-o", str(out)]) == 0
    merged = read_index(out)
    runs = merged[merged["level"] == "run"]
    assert sorted(runs["dataset"].unique()) == ["cars196", "cub200"]
    assert len(runs) == 2 * 3 * 3 * 2  # datasets x losses x seeds x metrics, each once
    assert set(runs.groupby("dataset")["source"].first()) == {str(a), str(b)}  # provenance per row kept
    assert (runs["provenance"] == "trained here").all()
    text = merged_report(merged, "map_at_r", 0.95, 0.05, 0.01)
    # both datasets are blocks: every loss has the same rank on each, so R = (2, 4, 6) over n = 2 blocks:
    # chi2 = 12 / (2 * 3 * 4) * (4 + 16 + 36) - 3 * 2 * 4 = 4, exact p = 1/6 (one order of the 6 in the second block)
    expected = friedman(pd.DataFrame([[3, 2, 1], [3, 2, 1]], columns=["multi_similarity", "contrastive", "triplet"]))
    assert (expected.statistic, round(expected.pvalue, 3)) == (4.0, 0.167)
    assert "Friedman test over n = 2 dataset blocks and 3 losses: chi2 = 4.00, p = 0.17 (exact p" in text
    assert "2 datasets (2 experiments" in text
    assert "## `cub200` / `resnet50`" in text and "## `cars196` / `resnet50`" in text
    ranking = [line.split("|")[1].strip() for line in text.split("Tournament over")[1].splitlines()[2:7]]
    assert ranking[2:5] == ["multi_similarity", "contrastive", "triplet"]


def test_a_lab_that_pulled_another_lists_its_runs_once_with_the_trainers_copy(tmp_path):
    a = _lab("cub200")
    new = _lab("cub200", {"supcon": 0.6})
    b = pd.concat([_lab("cub200", provenance="pulled"), new])  # lab B pulled A's grid and trained supcon
    # the puller's index first: the trainer's copy is kept all the same
    merged = merge_indexes([read_index(_write(tmp_path, "b.csv", b)), read_index(_write(tmp_path, "a.csv", a))])
    runs = merged[merged["level"] == "run"]
    assert len(runs) == 4 * 3 * 2
    kept = runs.set_index("loss")["source"]
    assert set(kept.loc["triplet"]) == {str(tmp_path / "a.csv")}  # the trainer's copy, not the puller's
    assert set(kept.loc["supcon"]) == {str(tmp_path / "b.csv")}


@pytest.mark.parametrize(
    ("other", "named"),
    [
        (lambda: _lab("cub200", digest="q" * 12), "protocol_digest pppppppppppp"),
        (lambda: _lab("cars196", protocol="thesis"), "different protocols: reality_check"),
    ],
)
def test_a_protocol_mismatch_is_refused_in_one_line(tmp_path, capsys, other, named):
    a = _write(tmp_path, "a.csv", _lab("cub200"))
    b = _write(tmp_path, "b.csv", other().assign(loss=lambda f: f["loss"].replace({"triplet": "supcon"})))
    with pytest.raises(MergeRefused, match=named) as refused:
        merge_indexes([read_index(a), read_index(b)])
    assert "\n" not in str(refused.value)
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "m.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err
    assert not (tmp_path / "m.csv").exists()


def test_one_run_with_two_results_is_refused(tmp_path):
    a = _lab("cub200")
    b = a.assign(value=a["value"] + 0.01)
    with pytest.raises(MergeRefused, match=r"cub200/resnet50/\w+/128 seed 0 map_at_r differs"):
        merge_indexes([read_index(_write(tmp_path, "a.csv", a)), read_index(_write(tmp_path, "b.csv", b))])


def test_an_index_without_identity_columns_is_refused_naming_them(tmp_path):
    old = _lab("cub200").drop(columns=["protocol_digest", "dataset_checksum"])
    with pytest.raises(MergeRefused, match="lacks column.s. protocol_digest, dataset_checksum"):
        read_index(_write(tmp_path, "old.csv", old))
