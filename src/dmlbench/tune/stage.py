"""The ``tune@<dataset>-<backbone>-<loss>`` stage: search the loss's hyperparameters, write the best.

The Reality Check's protocol (Musgrave et al., ECCV 2020, §4.2): ``tuning.trials`` trials, each
trained on every fold and scored by the mean validation objective; ``train@`` then trains the best
with every seed. ``hyperparameters: published`` searches nothing. The study lives in an Optuna
journal under ``artifacts/tuning/`` (``persist: true``) or ``tuning.storage``; a re-run continues it.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from dmlbench import paths
from dmlbench.data.cache import PreparedDataset
from dmlbench.devices import default_device
from dmlbench.errors import TrainingDiverged
from dmlbench.evaluate.metrics import metric_range
from dmlbench.grid import Combo
from dmlbench.io import atomic_path, write_json
from dmlbench.launch import in_slurm_job, run_array, run_local_workers, threads_per_worker, tunes_as_array
from dmlbench.params.cluster import cluster_settings
from dmlbench.params.load import load_params
from dmlbench.params.model import Params, config_hash
from dmlbench.params.tuned import BEST, STUDY, STUDY_DIR, TRIALS, write_best
from dmlbench.params.tuning import tuning_settings
from dmlbench.stage_inputs import inputs_fingerprint
from dmlbench.tracking.record import ending
from dmlbench.tracking.runs import TrackedRun
from dmlbench.tracking.studies import end_trial, mark_interrupted, study_run, trial_run
from dmlbench.tune.objective import InvalidTrial, Search, make_search
from dmlbench.tune.space import one_at_a_time
from dmlbench.tune.study import (
    HEARTBEAT_SECONDS,
    enqueue_once,
    finished_count,
    heartbeat,
    make_storage,
    open_study,
    recover_interrupted,
)
from dmlbench.tune.summary import best_trial, importances, plain, study_summary, trial_table

STATUS = "status.json"


def study_name(params: Params, search: Search) -> str:
    """``<dataset>-<backbone>-<loss>-<hash>`` of the search settings (not workers or storage), space,
    protocol, data and the stage's code (:func:`dmlbench.stage_inputs.inputs_fingerprint`)."""
    tuning = tuning_settings(params).model_dump(mode="json", exclude={"workers", "storage", "space", "trials"})
    identity = {
        "tuning": tuning,
        "space": {k: d.describe() for k, d in search.space.items()},
        "base": search.base_values,
        "run": search.config(search.published).resolved,
        "folds": list(search.folds),
        "code": inputs_fingerprint(),
    }
    run = search.base.run
    return f"{run.dataset}-{run.backbone}-{run.loss}-{config_hash(identity)[:10]}"


def _write_outputs(out: Path, best: dict, table: Any, summary: dict, status: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_best(out / BEST, best)
    with atomic_path(out / TRIALS) as tmp:
        if table is None:
            tmp.write_text("number,state,objective\n")
        else:
            table.to_csv(tmp, index=False, float_format="%.6g")
    write_json(out / STUDY, summary)
    write_json(out / STUDY_DIR / STATUS, status)


def tune_stage(params: Params, dataset: str, backbone: str, loss: str, workers: int | None = None,
               params_file: str = "params.yaml") -> dict[str, Any]:  # fmt: skip
    """Run (or continue) the cell's study to ``tuning.trials`` finished trials; write its files."""
    params.check_listed(dataset, backbone, loss)
    tuning = tuning_settings(params)
    out = paths.tuning_dir(dataset, backbone, loss)
    protocol = params.protocol_for(Combo(dataset, backbone, loss, tuning.dim))
    if protocol.hyperparameters != "tuned":
        record = {"hyperparameters": "published", "protocol": params.protocol_name, "values": {}}
        _write_outputs(out, record, None, {"searched": False}, {"state": "published"})
        print(f"protocol {params.protocol_name!r} trains the published hyperparameters: nothing to search")
        return record
    data = PreparedDataset.load(paths.prepared_dir(dataset))
    search = make_search(params, dataset, backbone, loss, data.num_folds)
    name = study_name(params, search)
    if not search.space:
        record = {"hyperparameters": "tuned", "study": name, "values": {}, "note": "empty search space"}
        _write_outputs(out, record, None, {"searched": False}, {"state": "complete", "study": name})
        return record
    storage = make_storage(tuning, out / STUDY_DIR)
    study = open_study(name, tuning, storage)
    # a journal file is this machine's alone: its running trials are orphans; an RDB study may have
    # workers elsewhere, whose trials still beat
    interrupted = recover_interrupted(study, storage, stale_after=3 * HEARTBEAT_SECONDS if tuning.storage else None)
    published = search.published_point()
    if tuning.sampler == "one_at_a_time":
        points = one_at_a_time(search.space, published, tuning.points_per_key)
        if len(points) > tuning.trials:
            print(
                f"one_at_a_time: {len(points)} candidates, tuning.trials {tuning.trials}: the first {tuning.trials} run"
            )
    else:
        points = [published] if tuning.start_from_published else []
    enqueue_once(study, points)
    experiment = params.tracking.experiment
    parent = study_run(
        experiment, name, f"tune {loss}", {"dataset": dataset, "backbone": backbone, "loss": loss},
        {"tuning": tuning.model_dump(mode="json", exclude={"space", "storage"}),
         "space": {k: d.describe() for k, d in search.space.items()}, "folds": len(search.folds)},
    )  # fmt: skip
    mark_interrupted(experiment, name, interrupted)
    done = finished_count(study)
    print(
        f"study {name}: {done} of {tuning.trials} trials finished"
        + (f"; re-running {len(interrupted)} interrupted" if interrupted else "")
    )
    count = workers or tuning.workers
    write_json(out / STUDY_DIR / STATUS, {"state": "running", "study": name})
    if count == 1:
        work(params, search, data.training_half(), study, parent, worker=0)
    elif tunes_as_array(count, tuning.storage) and in_slurm_job():  # workers on other nodes: a Slurm array
        command = ["python", "-m", "dmlbench.tune.worker", "--params", params_file, "--dataset", dataset,
                   "--backbone", backbone, "--loss", loss, "--study", name, "--parent-run", parent.run_id,
                   "--worker", "{worker}"]  # fmt: skip
        run_array(
            cluster_settings(params), count, command, paths.ARTIFACTS / "logs" / f"tune@{name}-%a.log", f"tune-{name}"
        )
    else:  # processes on this machine, each with its share of the CPU threads; the first failure stops the stage
        threads = threads_per_worker(count)
        shares = [(params_file, dataset, backbone, loss, name, parent.run_id, index, threads) for index in range(count)]
        run_local_workers(worker_main, shares)
    return summarise(params, search, study, parent, out)


def worker_main(params_file: str, dataset: str, backbone: str, loss: str, name: str, parent_id: str, worker: int,
                threads: int) -> int:  # fmt: skip
    """One worker process: open the study and run trials until the study has enough."""
    torch.set_num_threads(threads)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    params = load_params(params_file)
    data = PreparedDataset.load(paths.prepared_dir(dataset))
    search = make_search(params, dataset, backbone, loss, data.num_folds)
    tuning = tuning_settings(params)
    storage = make_storage(tuning, paths.tuning_dir(dataset, backbone, loss) / STUDY_DIR)
    study = open_study(name, tuning, storage, worker)
    recover_interrupted(study, storage, stale_after=3 * HEARTBEAT_SECONDS)  # a requeued task's trial
    return work(params, search, data.training_half(), study, TrackedRun(parent_id), worker)


def work(params: Params, search: Search, data: PreparedDataset, study: Any, parent: TrackedRun, worker: int,
         device: torch.device | None = None) -> int:  # fmt: skip
    """Ask, train, tell until ``tuning.trials`` trials finished; how many this worker ran. Invalid and
    diverged trials count (:func:`tell`); after 3 x trials attempts the worker gives up."""
    import optuna

    tuning, experiment = tuning_settings(params), params.tracking.experiment
    device = device or default_device()
    ran = 0
    while finished_count(study) < tuning.trials and ran < 3 * tuning.trials:
        trial = study.ask()
        ran += 1
        child = trial_run(experiment, parent, study.study_name, trial.number)
        started = time.perf_counter()
        trial.set_user_attr("worker", worker)

        def on_fold(index: int, value: float, epoch: int, child: TrackedRun = child) -> None:
            child.log_metrics({f"val_fold{index}/{search.objective}": value, f"fold{index}/selected_epoch": epoch})

        state, value, error = "finished", None, None
        # a kill leaves the trial RUNNING in the study: the next start re-runs it
        with ending(child, on_kill={"trial_state": "interrupted"}):
            try:
                with heartbeat(trial.storage, trial):
                    value = search.evaluate(trial, data, device, on_fold=on_fold)
            except optuna.TrialPruned:
                state = "pruned"
            except InvalidTrial as exc:
                state, error = "invalid", exc
                trial.set_user_attr("invalid", True)
            except TrainingDiverged as exc:
                state, error = "diverged", exc
        seconds = time.perf_counter() - started
        trial.set_user_attr("seconds", round(seconds, 3))
        failure = f"{type(error).__name__}: {error}" if error is not None else None
        if failure:
            trial.set_user_attr("failure", failure[:500])
        end_trial(child, trial.params, state, value, seconds, error, search.objective)
        tell(study, trial, state, value, search.objective)
        shown = f"{search.objective} {value:.4f}" if value is not None else failure if state == "diverged" else state
        print(f"trial {trial.number} ({state}): {shown} in {seconds:.1f} s [{finished_count(study)}/{tuning.trials}]")
    return ran


CONSTRAINT = "loss_rules"
TRAINS = "trains"  # the constraint a diverged trial violates


def tell(study: Any, trial: Any, state: str, value: float | None, objective: str) -> None:
    """Tell Optuna how ``trial`` ended (finished, pruned, invalid, diverged or failed).

    Counted trials carry constraints ``loss_rules`` and ``trains`` (1: broken / diverged, else -1;
    Optuna's ``set_constraint``, > 0 infeasible) and are told complete at the objective's floor, so
    GP and TPE avoid the region. Failed is left for what no trial value explains."""
    import optuna

    if state in ("finished", "pruned", "invalid", "diverged"):
        trial.set_constraint(CONSTRAINT, 1.0 if state == "invalid" else -1.0)
        trial.set_constraint(TRAINS, 1.0 if state == "diverged" else -1.0)
    if state == "finished":
        study.tell(trial, value)
    elif state in ("invalid", "diverged"):
        trial.set_user_attr(state, True)
        study.tell(trial, metric_range(objective)[0])
    else:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED if state == "pruned" else optuna.trial.TrialState.FAIL)


def summarise(params: Params, search: Search, study: Any, parent: TrackedRun, out: Path) -> dict[str, Any]:
    """Write trials.csv, best.yaml and study.json; log them and the figures to MLflow, timings to the run log."""
    from dmlbench.tune.figures import draw_history, draw_importances

    tuning = tuning_settings(params)
    trials = study.get_trials(deepcopy=False)
    table = trial_table(trials, search.space, len(search.folds))
    best = best_trial(table)
    if best is None:
        error = TrainingDiverged(
            f"study {study.study_name}: no trial completed ({len(table)} failed or pruned)", cause="no complete trial"
        )
        parent.fail(error)
        raise error
    summary = {"searched": True, "study": study.study_name, **study_summary(table, len(search.folds))}
    summary["importance"] = importances(study, tuning.seed)
    published = table[table["number"] == 0] if tuning.start_from_published else table.iloc[0:0]
    record = {
        "hyperparameters": "tuned",
        "study": study.study_name,
        "sampler": tuning.sampler,
        "objective": search.objective,
        "trial": int(best["number"]),
        "value": round(float(best["objective"]), 6),
        "folds": len(search.folds),
        "dim": tuning.dim,
        "values": {key: plain(best[f"param.{key}"]) for key in search.space},
        "published": search.published_point(),
        "published_value": (
            round(float(published["objective"].iloc[0]), 6)
            if len(published) and published["state"].iloc[0] == "complete" else None
        ),
        "space": {k: d.describe() for k, d in search.space.items()},
    }  # fmt: skip
    _write_outputs(out, record, table, summary, {"state": "complete", "study": study.study_name})
    seconds = {int(t.number): t.user_attrs.get("seconds") for t in trials}
    run = search.base.run
    write_json(paths.tuning_runlog(run.dataset, run.backbone, run.loss),
               {"study": study.study_name, "device": str(default_device()), "seconds": seconds})  # fmt: skip
    parent.log_metrics(
        {f"best/{search.objective}": record["value"], "trials/complete": summary["trials"]["complete"],
         "trials/pruned": summary["trials"]["pruned"], "trials/failed": summary["trials"]["fail"],
         "trainings": summary["trainings"], "trainings_saved_by_pruning": summary["trainings_saved_by_pruning"],
         "device_seconds": float(sum(s for s in seconds.values() if s))}
    )  # fmt: skip
    parent.set_tags({"best_trial": record["trial"], **{f"best.{k}": v for k, v in record["values"].items()}})
    for name in (BEST, TRIALS, STUDY):
        parent.log_artifact(out / name)
    with tempfile.TemporaryDirectory() as figures:  # MLflow keeps them; no DVC output
        draw_history(table, search.objective, Path(figures) / "optimization_history.png")
        if summary["importance"]:
            draw_importances(summary["importance"], Path(figures) / "param_importances.png")
        for figure in sorted(Path(figures).glob("*.png")):
            parent.log_artifact(figure, "figures")
    parent.finish("FINISHED")
    print(
        f"best: trial {record['trial']}, {search.objective} {record['value']:.4f}: "
        f"{yaml.safe_dump(record['values'], default_flow_style=True).strip()}"
    )
    return record
