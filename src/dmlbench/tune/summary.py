"""A (partly) finished study as files: ``trials.csv`` (one row per trial; state complete, pruned, invalid
or fail = diverged), ``best.yaml`` (what ``train@`` reads, :mod:`dmlbench.params.tuned`) and
``study.json`` (counts, pruning savings, importances). No timings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from dmlbench.losses.search import Dimension


def _state(trial: Any) -> str:
    """A trial's state in the table: Optuna's, except for the trials told at the objective's floor."""
    if trial.user_attrs.get("invalid"):
        return "invalid"
    return "fail" if trial.user_attrs.get("diverged") else trial.state.name.lower()


def trial_table(trials: list[Any], space: Mapping[str, Dimension], folds: int) -> pd.DataFrame:
    rows = []
    for trial in sorted(trials, key=lambda t: t.number):
        attrs = trial.user_attrs
        state = _state(trial)
        row: dict[str, Any] = {
            "number": trial.number,
            "state": state,
            "objective": trial.value if state == "complete" else None,
            "folds_trained": sum(f"fold{i}" in attrs for i in range(folds)),
        }
        for index in range(folds):
            row[f"fold{index}"] = attrs.get(f"fold{index}")
            row[f"fold{index}_epoch"] = attrs.get(f"fold{index}_epoch")
        for key in space:
            row[f"param.{key}"] = trial.params.get(key)
        row["retry_of"] = attrs.get("retry_of")
        row["failure"] = attrs.get("failure")
        rows.append(row)
    columns = ["number", "state", "objective", "folds_trained"]
    columns += [c for i in range(folds) for c in (f"fold{i}", f"fold{i}_epoch")]
    columns += [f"param.{k}" for k in space] + ["retry_of", "failure"]
    return pd.DataFrame(rows, columns=columns)


def best_trial(table: pd.DataFrame) -> pd.Series | None:
    """The complete trial with the highest objective (the lowest number among ties)."""
    complete = table[table["state"] == "complete"]
    if complete.empty:
        return None
    return complete.sort_values(["objective", "number"], ascending=[False, True]).iloc[0]


def plain(value: Any) -> Any:
    """numpy scalars and NaN as YAML/JSON-friendly values."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def study_summary(table: pd.DataFrame, folds: int) -> dict[str, Any]:
    """Counts by state; trainings = fold models trained; saved = folds pruned trials skipped."""
    counts = table["state"].value_counts().to_dict()
    pruned = table[table["state"] == "pruned"]
    return {
        "trials": {state: int(counts.get(state, 0)) for state in ("complete", "pruned", "invalid", "fail")},
        "trainings": int(table["folds_trained"].sum()),
        "trainings_saved_by_pruning": int((folds - pruned["folds_trained"]).sum()),
        "folds": folds,
    }


def importances(study: Any, seed: int) -> dict[str, float]:
    """fANOVA importance of each searched value for the objective (Optuna's evaluator, seeded);
    empty with fewer than two complete trials or one distinct value."""
    import optuna

    complete = [
        t for t in study.get_trials(deepcopy=False)
        if t.state == optuna.trial.TrialState.COMPLETE and _state(t) == "complete"
    ]  # fmt: skip
    if len(complete) < 2:
        return {}
    # the invalid and diverged trials' floor values left out: a copy in memory (storage-level, so that a
    # published trial 0 outside a user-narrowed space is copied as it was run, not re-validated)
    storage = optuna.storages.InMemoryStorage()
    study_id = storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "feasible")
    for trial in complete:
        storage.create_new_trial(study_id, template_trial=trial)
    feasible = optuna.load_study(study_name="feasible", storage=storage)
    try:
        found = optuna.importance.get_param_importances(
            feasible, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=seed)
        )
    except (RuntimeError, ValueError):  # e.g. every trial drew the same value
        return {}
    return {key: round(float(value), 6) for key, value in found.items()}
