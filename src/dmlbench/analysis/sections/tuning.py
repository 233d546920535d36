"""Tuning: what each loss's search explored, found and cost (the tune@ stages' results)."""

from __future__ import annotations

import pandas as pd

from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import Analysis
from dmlbench.analysis.plots import tuning as plots
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.text import markdown_table
from dmlbench.analysis.tuning import StudyResult, load_studies


def _value(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _values(values: dict) -> str:
    return ", ".join(f"{k} {_value(v)}" for k, v in values.items()) or "-"


def write(analysis: Analysis, doc: Document) -> None:
    params = analysis.params
    tuning = params.tuning
    if params.protocol.hyperparameters != "tuned":
        doc.note(
            f"No search: protocol `{params.protocol_name}` trains the published hyperparameters "
            "(`hyperparameters: published`); set it to `tuned` to search every loss the same way (`tune@` stages)."
        )
        return
    studies = load_studies(params)
    if not studies:
        doc.note("No tuning results here (`artifacts/tuning/`): run the `tune@` stages (make repro does).")
        return
    objective = metric_header(tuning.objective)
    folds = studies[0].best.get("folds", 1)
    pruning = "a trial stops after a fold whose running mean falls below the median of earlier trials" if tuning.pruner == "median" else "no pruning"
    doc.add(
        f"Every loss was searched the same way, as the Reality Check did (its Ax search: 50 trials): "
        f"{tuning.trials} trials of the `{tuning.sampler}` sampler ({tuning.startup_trials} random first"
        f"{', trial 0 = the published values' if tuning.start_from_published else ''}), each trained on the "
        f"{folds} fold(s) of the dataset's split at dim {tuning.dim}, seed {tuning.seed}, and scored by the mean "
        f"validation {objective} over the folds (training classes only; no test image is read); {pruning}. "
        "The best values were then trained with every seed and embedding size of the grid (the results above).",
        "",
    )
    rows = []
    for study in studies:
        best = study.best
        gain = (
            f"{100 * (best['value'] - best['published_value']):+.1f}"
            if best.get("published_value") is not None else "-"
        )  # fmt: skip
        rows.append([
            analysis.names.get(study.loss, study.loss),
            "; ".join(f"{k} {v}" for k, v in best.get("space", {}).items()),
            _values(best["values"]),
            _values(best.get("published", {})),
            f"{100 * best['value']:.1f} (trial {best['trial']})",
            "-" if best.get("published_value") is None else f"{100 * best['published_value']:.1f}",
            gain,
        ])  # fmt: skip
    doc.add(
        f"Validation {objective} (%, mean over folds) of the best trial and of the published values (trial 0), "
        "from one search per loss: no interval, and optimistic by construction (the search maximised it).",
        "",
        markdown_table(
            ["loss", "searched space", "best values", "published values", f"best {objective}", "published", "gain (points)"],
            rows,
        ),
        "",
    )
    trials = pd.concat(
        [s.trials.assign(loss=analysis.names.get(s.loss, s.loss)) for s in studies], ignore_index=True
    )
    doc.figure(
        "tuning_history",
        lambda p: plots.objective_by_trial(trials, p, analysis.order, tuning.objective),
        f"Validation {objective} of every trial (dots; crosses: pruned, at their first fold) and the best so far "
        "(steps), per loss. A curve still rising at the last trial says the budget was too small to find the optimum.",
    )
    _sensitivity(analysis, doc, studies, objective)
    doc.note(
        "Not measured here: the gain of tuning on the test classes and whether it changes the tournament. This grid "
        "trains the tuned values only; train the published ones too (e.g. `dvc exp run -S "
        f"protocols.{params.protocol_name}.hyperparameters=published`) and compare the two reports' results tables."
    )


def _sensitivity(analysis: Analysis, doc: Document, studies: list[StudyResult], objective: str) -> None:
    rows, saved, trainings, seconds = [], 0, 0, []
    for study in studies:
        values = 100 * study.complete["objective"]
        counts = study.summary.get("trials", {})
        importance = study.summary.get("importance") or {}
        top = max(importance, key=importance.get) if importance else None
        rows.append([
            analysis.names.get(study.loss, study.loss),
            f"{counts.get('complete', 0)} / {counts.get('pruned', 0)} / {counts.get('invalid', 0)} / {counts.get('fail', 0)}",
            f"{values.median():.1f} [{values.quantile(0.25):.1f}, {values.quantile(0.75):.1f}]" if len(values) else "-",
            f"{values.max() - values.median():.1f}" if len(values) else "-",
            f"{top} ({importance[top]:.2f})" if top else "-",
            study.summary.get("trainings", "-"),
            "-" if study.seconds is None else f"{study.seconds / 60:.1f}",
        ])  # fmt: skip
        saved += int(study.summary.get("trainings_saved_by_pruning", 0))
        trainings += int(study.summary.get("trainings", 0))
        seconds.append(study.seconds)
    doc.add(
        f"How sensitive each loss is around its best: the {objective} of all complete trials (median [quartiles]), "
        "the best's lead over the median, and the value that explains most of the objective's variance (fANOVA "
        "importance, Optuna); a flat loss gains little from tuning, a steep one loses much from a wrong default. "
        "Cost: fold models trained and device-minutes of the search.",
        "",
        markdown_table(
            ["loss", "trials complete / pruned / invalid / failed", f"{objective} of trials", "best - median",
             "most important", "trainings", "device-minutes"],
            rows,
        ),  # fmt: skip
        "",
    )
    if analysis.params.tuning.pruner != "none":
        doc.add(f"Pruning saved {saved} of {saved + trainings} fold trainings ({trainings} were run).", "")
    if any(s is None for s in seconds):
        doc.add("Device-minutes are missing where a search's run log (`artifacts/runlog/tuning/`) is not here.", "")


SECTION = Section("Tuning", "Tuning", write)
