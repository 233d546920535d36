"""A diverging training fails in one line, also where the loss hides it.

Divergence is made certain, not hoped for: AdamW at lr 1e6 multiplies every weight by
1 - lr * weight_decay = -99 per step (on top of steps of ~1e6), so the weights themselves pass
float32's 3.4e38 by step 18 on any machine (activations and BatchNorm statistics, which square
them, far earlier: batch 3 here); a diverging run gets 2 epochs of 15 batches, and each test
accepts whichever of loss, embeddings or weights the check saw go first, whenever.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import runpy
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from helpers.project import ROOT

from dmlbench import paths
from dmlbench.errors import NonFiniteEmbeddings, TrainingDiverged
from dmlbench.grid import RunSpec
from dmlbench.params.load import parse_params
from dmlbench.params.run import run_config
from dmlbench.train import divergence, loop
from dmlbench.train.divergence import FiniteWatch

CAUSES = ("loss", "embeddings", "weights")
EXPLODING_LR = 1e6
ONE_LINE = r"at epoch [12], batch \d+; lower the learning rate \(optimizer.lr, now 1e\+06\), clip gradients"


def _raw(small_raw_params, lr: float = EXPLODING_LR, epochs: int = 2, **protocol) -> dict:
    """Small params with one seed, ``epochs`` and the optimiser's ``lr`` (by default, one that diverges)."""
    raw = copy.deepcopy(small_raw_params)
    settings = raw["protocols"][raw["protocol"]]
    settings.update(epochs=epochs, **protocol)
    settings["optimizer"]["lr"] = lr
    raw["seeds"] = [0]
    return raw


def _project(root, raw: dict, prepared) -> None:
    """``root`` as a project: ``params.yaml`` = ``raw`` and the prepared glyphs linked in."""
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (root / "artifacts" / "prepared").mkdir(parents=True)
    (root / "artifacts" / "prepared" / "glyphs").symlink_to(prepared)


def _stage(script: str, args: list[str], monkeypatch, capsys) -> tuple[int, list[str]]:
    """Run ``stages/<script>`` in this process as DVC would; its exit status and ``error:`` lines
    (stderr also holds MLflow's log and progress bars), after checking it holds no traceback."""
    monkeypatch.setattr(sys, "argv", [script, *args])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(ROOT / "stages" / script), run_name="__main__")
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return exited.value.code, [line for line in err.splitlines() if line.startswith("error")]


def _runs(**tags) -> list:
    from dmlbench.tracking.runs import find_runs
    from dmlbench.tracking.store import client, ensure_experiment

    mlflow_client = client()
    return find_runs(mlflow_client, ensure_experiment("dmlbench", mlflow_client), tags)


def _assert_failed_diverged(run) -> None:
    assert run.info.status == "FAILED"
    tags = run.data.tags
    assert tags["failure_cause"] == "diverged" and tags["diverged"] in CAUSES, tags
    assert tags["failure"].startswith("TrainingDiverged: ")


def _assert_nothing_written(run: RunSpec, folds=(None,)) -> None:
    assert not paths.model_dir(run).exists()
    assert not paths.embedding_dir(run).exists()
    for fold in folds:
        assert not (paths.checkpoint_dir(run, fold) / "final").exists()  # nothing staged either


# --------------------------------------------------------------------------- the stages


@pytest.mark.parametrize("loss", ["contrastive", "triplet", "multi_similarity", "proxy_anchor"])
def test_a_diverging_train_stage_fails_in_one_line(
    loss, small_raw_params, prepared_glyphs, in_project, mlflow_store, monkeypatch, capsys
):
    """Contrastive (AvgNonZero reducer), Triplet and Multi-Similarity (their miners drop NaN
    pairs) and Proxy-Anchor (which does not): the same one line, FAILED run, nothing written."""
    _project(in_project, _raw(small_raw_params), prepared_glyphs[0] / "prepared")
    args = ["--dataset", "glyphs", "--backbone", "tiny_cnn", "--loss", loss, "--dim", "32", "--seed", "0"]
    status, lines = _stage("train.py", args, monkeypatch, capsys)
    assert status == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: glyphs-tiny_cnn-{loss}-32-0: ")
    assert re.search(rf": ({'|'.join(CAUSES)}) .*{ONE_LINE}", lines[0]), lines
    (run,) = _runs(kind="train")
    _assert_failed_diverged(run)
    _assert_nothing_written(RunSpec("glyphs", "tiny_cnn", loss, 32, 0))


def test_a_diverging_baseline_stage_fails_in_one_line(
    small_raw_params, prepared_glyphs, in_project, mlflow_store, monkeypatch, capsys
):
    raw = _raw(small_raw_params, hyperparameters="tuned")
    raw["tuning"].update(dim=32, baselines=["published"])
    _project(in_project, raw, prepared_glyphs[0] / "prepared")
    args = ["--dataset", "glyphs", "--backbone", "tiny_cnn", "--loss", "contrastive", "--variant", "published"]
    status, lines = _stage("baseline.py", args, monkeypatch, capsys)
    run = RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0, "published")
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {run.key}: ") and re.search(ONE_LINE, lines[0]), lines
    (tracked,) = _runs(kind="train")
    assert tracked.data.tags["variant"] == "published"
    _assert_failed_diverged(tracked)
    _assert_nothing_written(run)


@pytest.fixture(scope="module")
def prepared_folds(tmp_path_factory, small_raw_params):
    """The small glyphs on the Reality Check's split: 2 folds of the training classes."""
    from dmlbench.data import DATASETS
    from dmlbench.data.prepare import prepare_dataset

    raw = copy.deepcopy(small_raw_params)
    raw["datasets"]["glyphs"]["split"] = {"scheme": "rc_cv", "num_folds": 2}
    params, root = parse_params(raw), tmp_path_factory.mktemp("glyph_folds")
    DATASETS["glyphs"].fetch(params.datasets["glyphs"], root / "raw", root / "dropbox")
    prepare_dataset(DATASETS["glyphs"], params.datasets["glyphs"], root / "raw", root / "prepared")
    return raw, root / "prepared"


def test_a_diverging_fold_fails_its_run_and_the_seed_run(prepared_folds, in_project, mlflow_store):
    from dmlbench.train.stage import train_stage

    folded, prepared = prepared_folds
    raw = _raw(folded)
    _project(in_project, raw, prepared)
    run = RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0)
    message = rf"^glyphs-tiny_cnn-contrastive-32-0 fold 0: \w+ .*{ONE_LINE}"
    with pytest.raises(TrainingDiverged, match=message) as raised:
        train_stage(parse_params(raw), run, device=torch.device("cpu"))
    assert "\n" not in str(raised.value) and raised.value.cause in CAUSES and raised.value.epoch in (1, 2)
    (fold_run,) = _runs(kind="train", fold="0")
    seed_run = next(r for r in _runs(kind="train") if "fold" not in r.data.tags)
    for tracked in (fold_run, seed_run):
        _assert_failed_diverged(tracked)
    assert seed_run.data.tags["failure"] == fold_run.data.tags["failure"]
    _assert_nothing_written(run, folds=(0, 1))


# --------------------------------------------------------------------------- what the check looks at


def _contrastive(small_raw_params, prepared_glyphs, batches: int):
    """A run that does not diverge by itself: 1 epoch of ``batches`` batches at the protocol's lr."""
    params = parse_params(_raw(small_raw_params, lr=0.002, epochs=1, iterations_per_epoch=batches))
    return run_config(params, RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0)), prepared_glyphs[1]


def test_embeddings_are_checked_where_the_loss_hides_nan(small_raw_params, prepared_glyphs, monkeypatch):
    """Batch 3's images are NaN, and the loss drops NaN terms as a reducer would: the run stops
    at batch 3, naming the embeddings and the finite loss."""
    from pytorch_metric_learning.losses import ContrastiveLoss

    config, data = _contrastive(small_raw_params, prepared_glyphs, batches=4)
    batches = {"seen": 0}
    real_transform = loop.train_transform

    def poisoned(*args, **kwargs):
        batches["seen"] += 1
        images = real_transform(*args, **kwargs)
        return images * float("nan") if batches["seen"] == 3 else images

    monkeypatch.setattr(loop, "train_transform", poisoned)
    monkeypatch.setattr(ContrastiveLoss, "forward", lambda self, emb, labels, *a: (emb.nan_to_num() ** 2).mean())
    message = (
        r"^glyphs-tiny_cnn-contrastive-32-0: embeddings are not finite while the loss is [0-9.e+-]+ \(its reducer or "
        r"miner hid it\) at epoch 1, batch 3; lower the learning rate \(optimizer.lr, now 0.002\), clip gradients"
    )
    with pytest.raises(TrainingDiverged, match=message) as raised:
        loop.train(config, data, device=torch.device("cpu"))
    assert raised.value.cause == "embeddings" and raised.value.batch == 3


def test_nonfinite_validation_embeddings_stop_the_run_in_one_line(small_raw_params, prepared_glyphs, monkeypatch):
    config, data = _contrastive(small_raw_params, prepared_glyphs, batches=2)
    monkeypatch.setattr(loop, "compute_embeddings", lambda model, images, *a, **k: np.full((len(images), 32), np.inf))
    with pytest.raises(TrainingDiverged, match=r"^glyphs-tiny_cnn-contrastive-32-0: (\d+) of \1 validation embeddings "
                       r"are not finite at epoch 1; lower the learning rate") as raised:  # fmt: skip
        loop.train(config, data, device=torch.device("cpu"))
    assert raised.value.cause == "validation embeddings"


def test_the_watch_names_the_first_thing_that_went_nonfinite():
    weight = torch.nn.Parameter(torch.ones(3))
    watch = FiniteWatch(lambda: [("model.w", weight.detach()), ("model.steps", torch.tensor(7))])
    watch.record(torch.tensor(0.5), torch.ones(4, 2))
    assert watch.check() is None
    watch.record(torch.tensor(0.0), torch.full((4, 2), float("nan")))  # batch 2: hidden by the loss
    watch.record(torch.tensor(float("nan")), torch.ones(4, 2))
    found = watch.check()
    assert (found.cause, found.batch) == ("embeddings", 2) and "while the loss is 0" in found.detail
    watch.record(torch.tensor(float("inf")), torch.ones(4, 2))
    assert watch.check() == divergence.Divergence("loss", 4, "loss is inf")
    with torch.no_grad():
        weight[:] = 3e38  # finite, though its sum is not: no divergence
    watch.record(torch.tensor(0.5), torch.ones(4, 2))
    assert watch.check() is None
    with torch.no_grad():
        weight[1] = float("nan")
    watch.record(torch.tensor(0.5), torch.ones(4, 2))
    assert watch.check() == divergence.Divergence("weights", 6, "weights are not finite (model.w)")


def test_failure_tags_name_the_cause():
    from dmlbench.tracking.runs import failure_tags

    assert failure_tags(TrainingDiverged("r: loss is nan", cause="loss", epoch=1, batch=2)) == {
        "failure": "TrainingDiverged: r: loss is nan", "failure_cause": "diverged", "diverged": "loss"
    }  # fmt: skip
    assert failure_tags(OSError("disk full")) == {"failure": "OSError: disk full", "failure_cause": "OSError"}


# --------------------------------------------------------------------------- the device sync


def test_recording_a_batch_never_waits_for_the_device(monkeypatch):
    """On the meta device every host read raises: 25 batches record without one; the check
    reads everything back in exactly one call."""
    device = torch.device("meta")
    assert divergence.finite_check_interval(device) == divergence.GPU_FINITE_CHECK_EVERY == 25
    state = [("model.w", torch.ones(5, device=device)), ("model.b", torch.ones(2, device=device))]
    watch = FiniteWatch(lambda: state)
    for _ in range(25):
        watch.record(torch.ones((), device=device), torch.ones(8, 4, device=device))
    reads: list[int] = []

    def to_host(flags):
        reads.append(flags.numel())
        return [True] * flags.numel()

    monkeypatch.setattr(divergence, "to_host", to_host)
    assert watch.check() is None
    assert reads == [2 * 25 + len(state)]  # one sync: 2 flags per batch + 1 per tensor


def test_training_syncs_once_per_check_interval(small_raw_params, prepared_glyphs, monkeypatch):
    """The check interval off the CPU (here forced to 4 batches on the CPU): one host read every
    4 batches and one after the last, none in between."""
    config, data = _contrastive(small_raw_params, prepared_glyphs, batches=10)
    monkeypatch.setattr(loop, "finite_check_interval", lambda device: 4)
    reads, recorded = [], []
    real_to_host, real_record = divergence.to_host, FiniteWatch.record

    def counting_record(self, loss, embeddings):
        recorded.append(len(reads))
        real_record(self, loss, embeddings)

    monkeypatch.setattr(divergence, "to_host", lambda flags: reads.append(flags.numel()) or real_to_host(flags))
    monkeypatch.setattr(FiniteWatch, "record", counting_record)
    loop.train(config, data, device=torch.device("cpu"))
    batches = len(recorded)
    assert batches == 10 and len(reads) == 3  # after batches 4, 8 and the last
    assert recorded[:9] == [0, 0, 0, 0, 1, 1, 1, 1, 2]  # batch 5 is recorded after the first read


# --------------------------------------------------------------------------- evaluation


def test_evaluation_of_nonfinite_embeddings_fails_in_one_line_naming_the_run(tmp_path, small_params):
    from dmlbench.evaluate.embed import EMBEDDINGS, META
    from dmlbench.evaluate.stage import evaluate_run
    from dmlbench.io import write_json

    embeddings = np.eye(6, 4, dtype=np.float32)
    embeddings[2, 1] = np.nan
    np.savez(tmp_path / EMBEDDINGS, test_embeddings=embeddings, test_labels=np.array([0, 0, 1, 1, 2, 2]))
    write_json(tmp_path / META, {"run": "glyphs-tiny_cnn-contrastive-32-0", "fold": 1})
    message = r"^glyphs-tiny_cnn-contrastive-32-0 fold 1: 1 of 6 test embeddings are not finite; the model diverged"
    with pytest.raises(NonFiniteEmbeddings, match=message):
        evaluate_run(tmp_path, "glyphs", small_params.evaluate, None)


def test_embed_pretrained_refuses_nonfinite_features(small_raw_params, prepared_glyphs, in_project, monkeypatch):
    from dmlbench.evaluate import embed

    _project(in_project, small_raw_params, prepared_glyphs[0] / "prepared")
    monkeypatch.setattr(embed, "compute_embeddings", lambda model, images, *a, **k: np.full((len(images), 8), np.nan))
    with pytest.raises(NonFiniteEmbeddings, match=r"^glyphs-tiny_cnn-pretrained: \d+ of \d+ test embeddings are not "
                       r"finite; the untrained trunk's features overflow"):  # fmt: skip
        embed.embed_pretrained_stage(parse_params(small_raw_params), "glyphs", "tiny_cnn", device="cpu")
    assert not paths.pretrained_embedding_dir("glyphs", "tiny_cnn").exists()


# --------------------------------------------------------------------------- tuning


def test_a_study_with_a_diverging_trial_records_it_failed_and_goes_on(
    small_raw_params, prepared_glyphs, in_project, mlflow_store, monkeypatch
):
    """Trial 1 trains with lr 1e6 for 2 epochs (the others 1 epoch of 4 batches at the protocol's
    lr): it is failed for divergence in trials.csv and MLflow, told to Optuna as infeasible, and
    trials 0 and 2 are intact."""
    import optuna

    from dmlbench.tune import objective
    from dmlbench.tune.stage import TRAINS, tune_stage
    from dmlbench.tune.study import JOURNAL

    raw = _raw(small_raw_params, lr=0.002, epochs=1, iterations_per_epoch=4, hyperparameters="tuned")
    space = {"contrastive": {"pos_margin": {"low": 0.0, "high": 0.5}, "neg_margin": {"low": 0.6, "high": 2.0}}}
    raw["tuning"].update(sampler="random", trials=3, pruner="none", space=space, dim=32, start_from_published=False)
    raw["losses"] = {"contrastive": {}}
    _project(in_project, raw, prepared_glyphs[0] / "prepared")
    trainings, real_train = [], objective.train

    def train_second_exploding(config, data, **kwargs):
        trainings.append(config)
        if len(trainings) == 2:
            optimizer = config.protocol.optimizer.model_copy(update={"lr": EXPLODING_LR})
            update = {"optimizer": optimizer, "epochs": 2, "iterations_per_epoch": None}
            config = dataclasses.replace(config, protocol=config.protocol.model_copy(update=update))
        return real_train(config, data, **kwargs)

    monkeypatch.setattr(objective, "train", train_second_exploding)
    record = tune_stage(parse_params(raw), "glyphs", "tiny_cnn", "contrastive")
    assert len(trainings) == 3 and record["trial"] in (0, 2)

    out = paths.tuning_dir("glyphs", "tiny_cnn", "contrastive")
    table = pd.read_csv(out / "trials.csv")
    assert table["state"].tolist() == ["complete", "fail", "complete"]
    from dmlbench.params.tuning import tuning_settings

    seed = tuning_settings(parse_params(raw)).seed  # trials train at the tuning seed, outside the grid's seeds
    assert table["failure"][1].startswith(f"TrainingDiverged: glyphs-tiny_cnn-contrastive-32-{seed}: ")
    assert table["objective"].isna().tolist() == [False, True, False]
    assert yaml.safe_load((out / "study.json").read_text())["trials"] == {"complete": 2, "pruned": 0, "invalid": 0,
                                                                          "fail": 1}  # fmt: skip

    trial_runs = {r.data.tags["trial"]: r for r in _runs(kind="trial")}
    assert trial_runs["1"].info.status == "FAILED" and trial_runs["1"].data.tags["trial_state"] == "diverged"
    assert trial_runs["1"].data.tags["failure_cause"] == "diverged"
    assert [trial_runs[n].info.status for n in ("0", "2")] == ["FINISHED", "FINISHED"]
    (study_run,) = _runs(kind="study")
    assert study_run.info.status == "FINISHED"

    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(out / "study" / JOURNAL)))
    (study,) = optuna.get_all_study_summaries(storage)
    trials = optuna.load_study(study_name=study.study_name, storage=storage).get_trials()
    assert [t.constraints.get(TRAINS) for t in trials] == [-1.0, 1.0, -1.0]  # the sampler sees it as infeasible
    assert trials[1].state == optuna.trial.TrialState.COMPLETE and trials[1].value == 0.0
