"""The tune stage: search spaces and their validation, samplers, resume, workers, isolation from
the test classes, and the best values reaching train@."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers.project import ROOT, small_params_dict

from dmlbench.data.cache import PreparedDataset
from dmlbench.errors import ConfigError
from dmlbench.grid import RunSpec
from dmlbench.losses import LOSSES
from dmlbench.losses.search import Choice, FloatRange, IntRange, check_space, grid_points
from dmlbench.params.complete import parse_complete as parse_params
from dmlbench.params.tuning import TuningConfig, tuning_settings


def _tuned(raw: dict, **tuning) -> dict:
    raw = copy.deepcopy(raw)
    raw["protocols"][raw["protocol"]]["hyperparameters"] = "tuned"
    raw["tuning"].update(tuning)
    return raw


# --------------------------------------------------------------------------- search spaces


def test_every_declared_search_space_fits_its_loss():
    for name, spec in LOSSES.items():
        check_space(name, spec.params, spec.search_space, f"losses/{name}.py")  # raises on a bad one
    searched = {name for name, spec in LOSSES.items() if spec.search_space}
    assert {"contrastive", "triplet", "multi_similarity", "proxy_anchor"} <= searched
    # the loss's own parameters' learning rate is searched wherever the loss has parameters (RC)
    assert all("param_lr" in spec.search_space for spec in LOSSES.values() if spec.has_parameters)


@pytest.mark.parametrize("formulation", ["pml", "thesis_code"])
def test_lifted_structure_searches_the_keys_of_its_formulation(formulation):
    """Searched from the thesis's formulation, every trial point is a valid thesis_code config (the
    pml margins there would make every trial invalid), and the other way round."""
    spec = LOSSES["lifted_structure"]
    published = spec.params.model_validate({"formulation": formulation})
    space = spec.space(published)
    check_space("lifted_structure", spec.params, space, "losses/lifted_structure.py")
    assert set(space) == (
        {"alpha", "beta", "miner_epsilon"}
        if formulation == "thesis_code"
        else {"neg_margin", "pos_margin", "miner_epsilon"}
    )
    for count in (2, 5):
        points = [
            dict(zip(space, values, strict=True))
            for values in zip(*(grid_points(d, count) for d in space.values()), strict=True)
        ]
        for point in points:
            spec.params.model_validate(
                {"formulation": formulation, **point}
            )  # raises on a key of the other formulation


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            {"contrastive": {"margin": {"low": 0, "high": 1}}},
            "tuning.space.contrastive.margin: contrastive has no hyperparameter 'margin'; tunable: "
            "pos_margin, neg_margin",
        ),
        (
            {"contrastive": {"neg_margin": {"low": 1.0, "high": 0.5}}},
            "tuning.space.contrastive.neg_margin: empty or inverted range [1.0, 0.5]",
        ),
        (
            {"triplet": {"margin": {"low": 0.2, "high": 0.2}}},
            "tuning.space.triplet.margin: empty or inverted range [0.2, 0.2]",
        ),
        (
            {"multi_similarity": {"alpha": {"low": 0, "high": 10, "log": True}}},
            "tuning.space.multi_similarity.alpha: a log range needs low > 0",
        ),
        (
            {"multi_similarity": {"alpha": [2.0, "big"]}},
            "tuning.space.multi_similarity.alpha: value 'big' is not allowed",
        ),
        ({"triplet": {"miner": [True, "maybe"]}}, "tuning.space.triplet.miner: value 'maybe' is not allowed"),
        (
            {"contrastive": {"neg_margin": {"low": -1.0, "high": 1.0}}},
            "tuning.space.contrastive.neg_margin: value -1.0 is not allowed",
        ),
        (
            {"contrastive": {"neg_margin": {"lo": 0, "high": 1}}},
            "tuning.space.contrastive.neg_margin: expected {low, high[, log][, int]} or a list of values",
        ),
        ({"tripplet": {"margin": [0.1]}}, "tuning.space.tripplet: unknown loss; registered: arcface"),
    ],
)
def test_bad_search_space_fails_in_one_line_naming_loss_and_key(default_raw_params, space, message):
    raw = _tuned(small_params_dict(default_raw_params), space=space)
    with pytest.raises(ConfigError) as error:
        parse_params(raw)
    text = str(error.value)
    assert "\n" not in text and message in text, text


def test_integer_hyperparameter_rejects_a_real_range(default_raw_params):
    raw = _tuned(small_params_dict(default_raw_params), space={"fastap": {"num_bins": {"low": 5, "high": 50}}})
    raw["losses"]["fastap"] = {}
    with pytest.raises(ConfigError, match=r"tuning.space.fastap.num_bins: integer hyperparameter: give an int range"):
        parse_params(raw)
    raw["tuning"]["space"] = {"fastap": {"num_bins": {"low": 5, "high": 50, "int": True}}}
    assert tuning_settings(parse_params(raw)).dimensions("fastap", {}, set()) == {"num_bins": IntRange(5, 50)}


def test_space_merges_the_declared_one_the_override_and_fixed_keys():
    tuning = TuningConfig(space={"contrastive": {"neg_margin": [0.5, 1.0]}})
    declared = LOSSES["contrastive"].search_space
    merged = tuning.dimensions("contrastive", declared, fixed=set())
    assert merged["neg_margin"] == Choice((0.5, 1.0)) and merged["pos_margin"] == declared["pos_margin"]
    assert "pos_margin" not in tuning.dimensions("contrastive", declared, fixed={"pos_margin"})


def test_settings_refuse_what_cannot_work(default_raw_params):
    with pytest.raises(ValueError, match="gp fits complete trials only"):
        TuningConfig(sampler="gp", pruner="median")
    with pytest.raises(ValueError, match="no password in the URL"):
        TuningConfig(storage="postgresql://dml:secret@db.example/optuna")
    assert TuningConfig(storage="postgresql://dml@db.example/optuna").storage.endswith("/optuna")
    raw = _tuned(small_params_dict(default_raw_params))
    raw["datasets"]["glyphs"]["split"] = {"scheme": "standard"}
    with pytest.raises(ConfigError, match="datasets.glyphs.split.scheme: .* scheme 'standard' has none"):
        parse_params(raw)


def test_grid_points_cover_the_range():
    assert grid_points(FloatRange(0.0, 1.0), 5) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert grid_points(FloatRange(1e-4, 1.0, log=True), 5) == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1, 1.0])
    assert grid_points(IntRange(2, 10), 3) == [2, 6, 10]


# --------------------------------------------------------------------------- samplers


def _toy_objective(values: dict) -> float:
    """A cheap pure-Python objective with its optimum at x = 0.3, lr = 1e-3 (value 0)."""
    return -((values["x"] - 0.3) ** 2) - 0.05 * (math.log10(values["lr"]) + 3) ** 2


@pytest.mark.parametrize("sampler", ["gp", "tpe"])
def test_sampler_finds_the_optimum_of_a_cheap_objective(tmp_path, sampler):
    from dmlbench.tune.space import suggest
    from dmlbench.tune.study import make_storage, open_study

    tuning = TuningConfig(sampler=sampler, trials=40, startup_trials=8, seed=3)
    space = {"x": FloatRange(0.0, 1.0), "lr": FloatRange(1e-6, 1e-1, log=True)}
    study = open_study("toy", tuning, make_storage(tuning, tmp_path))
    study.optimize(lambda trial: _toy_objective(suggest(trial, space)), n_trials=tuning.trials)
    best = study.best_params
    # within 0.1 of x* and half a decade of lr* (random search with 40 draws rarely gets both)
    assert abs(best["x"] - 0.3) < 0.1 and abs(math.log10(best["lr"]) + 3) < 0.5, best


@pytest.mark.parametrize("sampler", ["gp", "tpe"])
def test_samplers_learn_to_avoid_invalid_points(tmp_path, sampler):
    """Contrastive's rule pos_margin < neg_margin, on a pure-Python objective whose optimum
    (0.5, 1.5) is feasible: invalid trials are told as the tune stage tells them (complete at the
    objective's floor, constraint violated), and the sampler stops proposing the invalid half."""
    import optuna

    from dmlbench.tune.space import suggest
    from dmlbench.tune.stage import tell
    from dmlbench.tune.study import make_storage, open_study

    tuning = TuningConfig(sampler=sampler, trials=30, startup_trials=6, seed=1)
    space = {"pos": FloatRange(0.0, 2.0), "neg": FloatRange(0.0, 2.0)}
    study = open_study("constrained", tuning, make_storage(tuning, tmp_path))
    for _ in range(tuning.trials):
        trial = study.ask()
        point = suggest(trial, space)
        if point["pos"] >= point["neg"]:
            tell(study, trial, "invalid", None, "map_at_r")
        else:
            tell(
                study, trial, "finished", 1.0 - ((point["pos"] - 0.5) ** 2 + (point["neg"] - 1.5) ** 2) / 8, "map_at_r"
            )
    trials = study.get_trials()
    invalid = [t.number for t in trials if t.user_attrs.get("invalid")]
    late = [n for n in invalid if n >= tuning.trials // 2]
    # random draws put half the points in the invalid triangle: ~7 of the last 15; the model, few
    assert len(late) <= 3, (sampler, invalid)
    assert all(t.state == optuna.trial.TrialState.COMPLETE and t.value == 0.0 for t in trials if t.number in invalid)
    feasible = [t for t in trials if not t.user_attrs.get("invalid")]
    best = max(feasible, key=lambda t: t.value)
    assert abs(best.params["pos"] - 0.5) < 0.5 and abs(best.params["neg"] - 1.5) < 0.5, best.params


def test_one_at_a_time_varies_one_key_around_the_published_point():
    from dmlbench.tune.space import one_at_a_time

    space = {"x": FloatRange(0.0, 1.0), "lr": FloatRange(1e-5, 1e-1, log=True)}
    candidates = one_at_a_time(space, {"x": 0.5, "lr": 1e-3}, points=5)
    assert candidates[0] == {"x": 0.5, "lr": 1e-3} and len(candidates) == 1 + 4 + 4
    assert all(sum(c[k] != candidates[0][k] for k in space) == 1 for c in candidates[1:])
    best = max(candidates, key=_toy_objective)
    assert best == {"x": 0.25, "lr": 1e-3}  # the grid point nearest x* = 0.3 on the published lr


# --------------------------------------------------------------------------- isolation from test classes


@pytest.mark.parametrize("split", [
    {"scheme": "fixed_val", "val_fraction": 0.25, "seed": 0},
    {"scheme": "rc_cv", "num_folds": 2},
    {"scheme": "kfold", "num_folds": 3, "seed": 1},
])  # fmt: skip
def test_no_fold_and_no_objective_reads_a_test_class_image(tmp_path, default_raw_params, monkeypatch, split):
    import optuna
    import torch

    from dmlbench.data import DATASETS
    from dmlbench.data.prepare import prepare_dataset
    from dmlbench.tune import objective as objective_module
    from dmlbench.tune.objective import make_search

    raw = _tuned(small_params_dict(default_raw_params), trials=1)
    raw["datasets"]["glyphs"]["split"] = split
    raw["protocols"][raw["protocol"]]["epochs"] = 1
    params = parse_params(raw)
    spec, dataset_params = DATASETS["glyphs"], params.datasets["glyphs"]
    spec.fetch(dataset_params, tmp_path / "raw", tmp_path / "dropbox")
    prepare_dataset(spec, dataset_params, tmp_path / "raw", tmp_path / "prepared")
    full = PreparedDataset.load(tmp_path / "prepared")
    test_classes = set(full.manifest.loc[full.manifest["split"] == "test", "label"])
    assert test_classes

    half = full.training_half()
    assert not set(half.manifest["label"]) & test_classes
    assert len(half.images) == int(full.manifest["split"].isin(["train", "val"]).sum())
    # every image the training half holds is a training-class image of the full cache
    rows = np.flatnonzero(full.manifest["split"].isin(["train", "val"]).to_numpy())
    assert np.array_equal(half.images, full.images[rows])

    seen: list[tuple[str, set]] = []
    real_train = objective_module.train

    def spy(config, data, **kwargs):
        for name in ("train", "val", "test", "query", "gallery"):
            seen.append(
                (name, set(data.split(name, fold=kwargs.get("fold") if name in ("train", "val") else None).labels))
            )
        assert kwargs.get("device") is not None and not config.protocol.test_feedback
        return real_train(config, data, **kwargs)

    monkeypatch.setattr(objective_module, "train", spy)
    search = make_search(params, "glyphs", "tiny_cnn", "contrastive", half.num_folds)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial(search.published_point())  # a valid point (a random one may break pos < neg)
    value = search.evaluate(study.ask(), half, torch.device("cpu"))
    assert 0.0 <= value <= 1.0
    assert len(seen) == 5 * max(1, half.num_folds)  # every fold trained
    for name, labels in seen:
        assert not labels & test_classes, name
        if name in ("test", "query", "gallery"):
            assert not labels, name  # nothing to score on: no test-set feedback inside tuning


# --------------------------------------------------------------------------- the stage


@pytest.fixture
def tune_project(tmp_path, default_raw_params):
    """A project directory with the small glyphs prepared and a tuned params.yaml (2 folds)."""
    from dmlbench.data import DATASETS
    from dmlbench.data.prepare import prepare_dataset

    # a space where every draw is valid (pos_margin < neg_margin): no failed trial to count
    space = {"contrastive": {"pos_margin": {"low": 0.0, "high": 0.5}, "neg_margin": {"low": 0.6, "high": 2.0}}}
    raw = _tuned(small_params_dict(default_raw_params), sampler="random", trials=3, pruner="none", space=space)
    raw["datasets"]["glyphs"]["split"] = {"scheme": "rc_cv", "num_folds": 2}
    raw["protocols"][raw["protocol"]]["epochs"] = 1
    raw["losses"] = {"contrastive": {}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    params = parse_params(raw)
    spec, dataset_params = DATASETS["glyphs"], params.datasets["glyphs"]
    spec.fetch(dataset_params, tmp_path / "raw", tmp_path / "dropbox")
    prepare_dataset(spec, dataset_params, tmp_path / "raw", tmp_path / "artifacts" / "prepared" / "glyphs")
    return tmp_path, raw


def _stage(root: Path, *args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    code = (
        "import sys; sys.argv = ['tune'] + sys.argv[1:]; "
        f"exec(compile(open({str(ROOT / 'stages' / 'tune.py')!r}).read(), 'stages/tune.py', 'exec'))"
    )
    command = [
        sys.executable,
        "-c",
        code,
        "--dataset",
        "glyphs",
        "--backbone",
        "tiny_cnn",
        "--loss",
        "contrastive",
        *args,
    ]
    return subprocess.Popen(command, cwd=root, env=env, text=True, **popen)


def _env(root: Path) -> dict:
    import os

    return dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", MLFLOW_DISABLE_TELEMETRY="true",
                PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")  # fmt: skip


def _journal_trials(root: Path, name: str):
    import optuna
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(
        JournalFileBackend(str(root / "artifacts/tuning/glyphs/tiny_cnn/contrastive/study/journal.log"))
    )
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def test_a_journal_lock_left_by_a_killed_process_is_released_after_its_grace_period(tmp_path, monkeypatch):
    """The study lives under a relative directory (as in a project); a process killed while it held the
    journal's lock left the lock behind: the next process to write takes it over after the grace period."""
    import threading

    import optuna

    from dmlbench.tune import study as study_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(study_module, "JOURNAL_LOCK_GRACE_SECONDS", 1)
    tuning, directory = TuningConfig(dim=32), Path("artifacts/tuning/glyphs/tiny_cnn/contrastive/study")
    killed = study_module.make_storage(tuning, directory)
    optuna.create_study(study_name="s", storage=killed)
    assert killed._backend._lock.acquire()  # held, never released: what a SIGKILL mid-write leaves
    storage = study_module.make_storage(tuning, directory)
    asked = []
    thread = threading.Thread(target=lambda: asked.append(optuna.load_study(study_name="s", storage=storage).ask()))
    thread.daemon = True
    thread.start()
    thread.join(timeout=60)
    assert asked, "the stale journal lock was never released"


@pytest.mark.slow
def test_killed_study_resumes_keeping_its_finished_trials(tune_project):
    import mlflow

    root, raw = tune_project
    raw["protocols"][raw["protocol"]]["epochs"] = 4  # a few seconds per trial: time to kill one mid-way
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = _env(root)
    first = _stage(root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    for line in first.stdout:  # after trial 0 is told ...
        lines.append(line)
        if line.startswith("trial 0 ("):
            break
    name = next(line.split()[1].rstrip(":") for line in lines if line.startswith("study "))
    deadline = time.time() + 60
    while not any(
        t.state.name == "RUNNING" and t.params for t in _journal_trials(root, name)
    ):  # ... and trial 1 trains
        assert time.time() < deadline and first.poll() is None, "".join(lines)
        time.sleep(0.02)
    first.kill()  # SIGKILL: nothing is told, the trial stays RUNNING in the journal
    first.wait()
    before = _journal_trials(root, name)
    assert [t.state.name for t in before][:2] == ["COMPLETE", "RUNNING"]
    kept = before[0]

    second = _stage(root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = second.communicate(timeout=600)[0]
    assert second.returncode == 0, output
    assert f"study {name}: 1 of 3 trials finished; re-running 1 interrupted" in output
    after = _journal_trials(root, name)
    states = [t.state.name for t in after]
    assert states.count("COMPLETE") == 3 and states.count("FAIL") == 1  # 3 counted, the killed one not
    assert after[0].params == kept.params and after[0].value == kept.value  # kept, not re-run
    retried = [t for t in after if t.user_attrs.get("retry_of") == 1]
    assert len(retried) == 1 and retried[0].params == after[1].params and retried[0].state.name == "COMPLETE"
    table = pd.read_csv(root / "artifacts/tuning/glyphs/tiny_cnn/contrastive/trials.csv")
    assert list(table["state"]) == ["complete", "fail", "complete", "complete"]
    best = yaml.safe_load((root / "artifacts/tuning/glyphs/tiny_cnn/contrastive/best.yaml").read_text())
    assert best["value"] == pytest.approx(table["objective"].max(), abs=1e-6) and best["study"] == name
    # MLflow: one study run, a child per trial; the killed trial's child is KILLED
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(search_all_experiments=True)
    studies, trials = runs[runs["tags.kind"] == "study"], runs[runs["tags.kind"] == "trial"]
    assert len(studies) == 1 and studies["status"].iloc[0] == "FINISHED"
    assert set(trials["tags.mlflow.parentRunId"]) == {studies["run_id"].iloc[0]}
    assert sorted(trials["tags.trial_state"]) == ["finished", "finished", "finished", "interrupted"]
    assert trials["metrics.val_fold1/map_at_r"].notna().sum() == 3


@pytest.mark.slow
def test_two_workers_share_one_study_with_distinct_trials(tune_project):
    root, _ = tune_project
    env = _env(root)
    stage = _stage(root, "--workers", "2", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = stage.communicate(timeout=600)[0]
    assert stage.returncode == 0, output
    name = next(line.split()[1].rstrip(":") for line in output.splitlines() if line.startswith("study "))
    trials = _journal_trials(root, name)
    finished = [t for t in trials if t.state.name == "COMPLETE"]
    assert 3 <= len(finished) <= 4  # each worker checks the count before asking: at most one extra
    assert len({t.number for t in trials}) == len(trials)
    assert {t.user_attrs["worker"] for t in finished} == {0, 1}
    assert len({tuple(sorted(t.params.items())) for t in finished}) == len(finished)


def test_train_reads_the_tuned_values(in_project, default_raw_params):
    from dmlbench.params.run import run_config
    from dmlbench.params.tuned import best_file, write_best

    raw = _tuned(small_params_dict(default_raw_params))
    params = parse_params(raw)
    run = RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0)
    with pytest.raises(ConfigError, match=r"run `dvc repro tune@glyphs-tiny_cnn-contrastive` first"):
        run_config(params, run)
    path = best_file("glyphs", "tiny_cnn", "contrastive")
    write_best(path, {"hyperparameters": "tuned", "study": "s1", "trial": 4, "objective": "map_at_r", "value": 0.5,
                      "values": {"pos_margin": 0.1, "neg_margin": 0.9}})  # fmt: skip
    config = run_config(params, run)
    assert (config.loss_params.pos_margin, config.loss_params.neg_margin) == (0.1, 0.9)
    assert config.loss_source == "tuned" and config.resolved["tuning"]["study"] == "s1"
    # a tuned absolute lr of the loss's parameters replaces the protocol's published multiplier
    proxy = RunSpec("glyphs", "tiny_cnn", "proxy_anchor", 32, 0)
    write_best(best_file("glyphs", "tiny_cnn", "proxy_anchor"), {"hyperparameters": "tuned", "study": "s2", "trial": 1,
               "values": {"param_lr": 0.005, "margin": 0.2}})  # fmt: skip
    tuned_proxy = run_config(params, proxy).loss_params
    assert (tuned_proxy.param_lr, tuned_proxy.margin) == (0.005, 0.2)
    assert tuned_proxy.optimizer_lr(0.002, None) == 0.005
    published = parse_params(small_params_dict(default_raw_params))
    assert run_config(published, run).loss_params.neg_margin == 0.5  # published: best.yaml not read
    assert run_config(published, run).config_hash != config.config_hash


def test_shared_study_recovers_only_trials_whose_heartbeat_went_stale(tmp_path):
    """Workers on other machines share an RDB study: a running trial is left behind only when its
    worker stopped beating (a killed or preempted task), never while another worker trains it."""
    import optuna

    from dmlbench.tune.study import HEARTBEAT, heartbeat, make_storage, open_study, recover_interrupted

    tuning = TuningConfig(sampler="random", trials=4)
    storage = make_storage(tuning, tmp_path)
    study = open_study("shared", tuning, storage)
    alive, dead = (
        study.ask({"x": optuna.distributions.FloatDistribution(0, 1)}),
        study.ask({"x": optuna.distributions.FloatDistribution(0, 1)}),
    )
    with heartbeat(storage, alive, every=0.05):
        time.sleep(0.2)
        beats = study.get_trials(deepcopy=False)[alive.number].user_attrs[HEARTBEAT]
        assert time.time() - beats < 1.0
        storage.set_trial_user_attr(dead._trial_id, HEARTBEAT, time.time() - 500)  # its worker died 500 s ago
        assert recover_interrupted(study, storage, stale_after=90) == [dead.number]
    states = {t.number: t.state.name for t in study.get_trials(deepcopy=False)}
    assert states[alive.number] == "RUNNING" and states[dead.number] == "FAIL"
    retry = study.get_trials(deepcopy=False)[-1]
    assert retry.state.name == "WAITING" and retry.user_attrs["retry_of"] == dead.number
    # with no other worker (a local stage before its workers start): every running trial is an orphan
    assert recover_interrupted(study, storage) == [alive.number]
