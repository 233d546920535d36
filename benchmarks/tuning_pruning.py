"""Pruned vs unpruned search on the demo: the same best values? at what cost?

Runs the demo's study (params.yaml `tuning:`, TPE) for each listed loss twice, with
`pruner: median` and `pruner: none`, same sampler seed, in memory (no study file, no DVC), on the
prepared glyphs (run `dvc repro prepare@glyphs` first), and prints per loss and variant: the
best trial, its values and validation objective, complete / pruned trials, fold trainings and
seconds. MLflow runs go to a throw-away store.

    python benchmarks/tuning_pruning.py                          # the demo's 4 losses, 5 trials
    python benchmarks/tuning_pruning.py --losses contrastive --trials 8 --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--losses", nargs="*", default=None, help="default: every loss of params.yaml")
    parser.add_argument("--trials", type=int, default=None, help="default: tuning.trials")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    store = tempfile.mkdtemp(prefix="tuning_pruning_")
    os.environ.update(MLFLOW_TRACKING_URI=f"sqlite:///{store}/mlflow.db", MLFLOW_DISABLE_TELEMETRY="true")
    import optuna
    import torch

    from dmlbench import paths
    from dmlbench.data.cache import PreparedDataset
    from dmlbench.params.load import load_params
    from dmlbench.tracking.studies import study_run
    from dmlbench.tune.objective import make_search
    from dmlbench.tune.stage import work
    from dmlbench.tune.study import enqueue_once, open_study
    from dmlbench.tune.summary import best_trial, study_summary, trial_table

    torch.set_num_threads(args.threads)
    params = load_params(args.params)
    dataset, backbone = next(iter(params.datasets)), next(iter(params.backbones))
    data = PreparedDataset.load(paths.prepared_dir(dataset))
    half = data.training_half()
    print(f"{dataset} / {backbone}: {max(1, data.num_folds)} fold(s), sampler {params.tuning.sampler}, "
          f"{args.trials or params.tuning.trials} trials, {args.threads} thread(s)")  # fmt: skip
    print("loss | pruner | best trial | objective | values | complete / pruned | trainings | seconds")
    for loss in args.losses or list(params.losses):
        for pruner in ("median", "none"):
            tuning = params.tuning.model_copy(update={"pruner": pruner, "trials": args.trials or params.tuning.trials})
            variant = type(params)(**{**params.__dict__, "tuning": tuning})
            search = make_search(variant, dataset, backbone, loss, data.num_folds)
            study = open_study(f"{loss}-{pruner}", tuning, optuna.storages.InMemoryStorage())
            enqueue_once(study, [search.published_point()] if tuning.start_from_published else [])
            parent = study_run(variant.tracking.experiment, f"{loss}-{pruner}", f"benchmark {loss} {pruner}", {}, {})
            started = time.perf_counter()
            work(variant, search, half, study, parent, worker=0)
            seconds = time.perf_counter() - started
            table = trial_table(study.get_trials(), search.space, len(search.folds))
            best, summary = best_trial(table), study_summary(table, len(search.folds))
            values = ", ".join(f"{k} {best[f'param.{k}']:.3g}" for k in search.space)
            print(f"{loss} | {pruner} | {int(best['number'])} | {best['objective']:.4f} | {values} | "
                  f"{summary['trials']['complete']} / {summary['trials']['pruned']} | {summary['trainings']} "
                  f"| {seconds:.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
