"""Tuning: what each loss's search explored, found and cost (the tune@ stages' results), and what
it gained on the test classes over the published values (the baseline@ stages' results)."""

from __future__ import annotations

import math

import pandas as pd

from dmlbench.analysis.labels import metric_header
from dmlbench.analysis.numbers import Analysis, rows_of
from dmlbench.analysis.plots import tuning as plots
from dmlbench.analysis.sections.base import Document, Section
from dmlbench.analysis.text import common_n, format_interval, markdown_table, p_value
from dmlbench.analysis.tuning import (
    StudyResult,
    difference_interval,
    load_baseline_runs,
    load_studies,
    matched,
    swapped_pairs,
    tuning_gain,
)
from dmlbench.evaluate.metrics import metric_range
from dmlbench.params.tuning import tuning_settings


def _value(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _values(values: dict) -> str:
    return ", ".join(f"{k} {_value(v)}" for k, v in values.items()) or "-"


def _where(dataset: str, backbone: str) -> str:
    return f"`{dataset}` / `{backbone}`"


def _table(header: list[str], rows: list[list], experiments: list[str]) -> str:
    """One search or baseline per loss and experiment: with several dataset/backbone pairs, each row
    names its pair first."""
    if len(set(experiments)) < 2:
        return markdown_table(header, rows)
    return markdown_table(
        ["experiment", *header],
        [[where, *row] for where, row in zip(experiments, rows, strict=True)],
        "ll" + "r" * (len(header) - 1),
    )


def write(analysis: Analysis, doc: Document) -> None:
    params = analysis.params
    tuning = tuning_settings(params)
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
    pruning = (
        "a trial stops after a fold whose running mean falls below the median of earlier trials"
        if tuning.pruner == "median"
        else "no pruning"
    )
    doc.add(
        f"Every loss was searched with the same budget and procedure: {tuning.trials} trials of the "
        f"`{tuning.sampler}` sampler ({tuning.startup_trials} random first"
        f"{', trial 0 = the published values' if tuning.start_from_published else ''}), each trained on the "
        f"{folds} fold(s) of the dataset's split at dim {tuning.dim}, seed {tuning.seed}, and scored by the mean "
        f"validation {objective} over the folds (training classes only; no test image is read); {pruning}. "
        f"The Reality Check's search was larger: 50 trials of Ax's Bayesian optimisation per loss and dataset, "
        "each trained on 4 folds, without pruning (powerful-benchmarker, `--bayes_opt_iters 50`)"
        + (
            "; this search is the same in kind and budget."
            if (tuning.trials, folds, tuning.pruner) == (50, 4, "none")
            else f"; this one used {tuning.trials} trials x {folds} fold(s)"
            + (" with pruning" if tuning.pruner != "none" else "")
            + ", so its optimum is less certain."
        )
        + " The best values were then trained with every seed and embedding size of the grid (the results above).",
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
        _table(
            [
                "loss",
                "searched space",
                "best values",
                "published values",
                f"best {objective}",
                "published",
                "gain (points)",
            ],
            rows,
            [_where(s.dataset, s.backbone) for s in studies],
        ),
        "",
    )
    trials = pd.concat([s.trials.assign(loss=analysis.names.get(s.loss, s.loss)) for s in studies], ignore_index=True)
    doc.figure(
        "tuning_history",
        lambda p: plots.objective_by_trial(trials, p, analysis.order, tuning.objective),
        f"Validation {objective} of every trial (dots; crosses: pruned, at their first fold) and the best so far "
        "(steps), per loss. A curve still rising at the last trial says the budget was too small to find the optimum.",
    )
    _sensitivity(analysis, doc, studies, objective)
    _test_gain(analysis, doc)


def _sensitivity(analysis: Analysis, doc: Document, studies: list[StudyResult], objective: str) -> None:
    rows, saved, trainings, seconds = [], 0, 0, []
    for study in studies:
        values = 100 * study.complete["objective"]
        counts = study.summary.get("trials", {})
        importance = study.summary.get("importance") or {}
        top = max(importance, key=importance.get) if importance else None
        rows.append([
            analysis.names.get(study.loss, study.loss),
            f"{counts.get('complete', 0)} / {counts.get('pruned', 0)} / {counts.get('invalid', 0)} / "
            f"{counts.get('fail', 0)}",
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
        _table(
            [
                "loss",
                "trials complete / pruned / invalid / failed",
                f"{objective} of trials",
                "best - median",
                "most important",
                "trainings",
                "device-minutes",
            ],
            rows,
            [_where(s.dataset, s.backbone) for s in studies],
        ),
        "",
    )
    if tuning_settings(analysis.params).pruner != "none":
        doc.add(f"Pruning saved {saved} of {saved + trainings} fold trainings ({trainings} were run).", "")
    if any(s is None for s in seconds):
        doc.add("Device-minutes are missing where a search's run log (`artifacts/runlog/tuning/`) is not here.", "")


def _test_gain(analysis: Analysis, doc: Document) -> None:
    """The tuned grid's cells at tuning.dim against the published baseline, on the test classes."""
    params = analysis.params
    if "published" not in tuning_settings(params).baselines:
        doc.note(
            "Not measured here: the gain of tuning on the test classes and whether it changes the ranking. Set "
            "`tuning.baselines: [published]` to also train the published values at the tuning dim with every seed "
            "(`baseline@` stages) and compare them here."
        )
        return
    metric = params.report.primary_metric
    baseline = load_baseline_runs(params, "published")
    search_seed = tuning_settings(params).seed
    left_out = (search_seed,) if search_seed in params.seeds else ()
    gains = (
        tuning_gain(analysis.results.runs, baseline, metric, params.evaluate.confidence, left_out)
        if len(baseline)
        else baseline
    )
    if not len(gains):
        doc.note("No baseline results here: run the `baseline@` stages (make repro does).")
        return
    same = {(s.dataset, s.backbone, s.loss) for s in load_studies(params) if _kept_published(s.best)}
    header = metric_header(metric)
    n = common_n(list(gains["tuned_n"]) + list(gains["baseline_n"]))
    alpha = params.report.alpha
    rows = []
    for row in gains.to_dict("records"):
        kept = (row["dataset"], row["backbone"], row["loss"]) in same
        show_n = row["tuned_n"] != n or row["baseline_n"] != n
        rows.append([
            analysis.names.get(row["loss"], row["loss"]),
            format_interval(
                row["baseline"], row["baseline_low"], row["baseline_high"], row["baseline_n"], show_n=show_n
            ),
            format_interval(row["tuned"], row["tuned_low"], row["tuned_high"], row["tuned_n"], show_n=show_n),
            "same values" if kept else _gain(row),
            "-" if kept or math.isnan(row["p_value"]) else p_value(row["p_value"]),
            f"{row['rank_baseline']:g} -> {row['rank_tuned']:g}",
        ])  # fmt: skip
    dims = ", ".join(str(d) for d in sorted(gains["dim"].unique()))
    method = (
        "paired over the matched seeds (seed k trains both with the same initial weights and batches; paired t)"
        if gains["paired"].all()
        else "paired over matched seeds where both cells have the same seeds, else Welch's"
    )
    excluded = (
        f" Seed {search_seed} is left out of both: it is also the search's seed, so its tuned run repeats the trial "
        "the search picked for its validation score and would carry that selection luck into the gain."
        if left_out
        else ""
    )
    doc.add(
        f"What tuning bought on the test classes: test {header} (%) of the published values and of the tuned ones, "
        f"both trained with the grid's seeds at dim {dims} under the same protocol (mean [95% t-interval over seeds, "
        f"clipped to the range], n = {n} seeds per cell unless stated), the gain tuned - published in points with "
        f"its 95% interval and p-value, {method}, and each loss's rank by mean (1 = best) before and after "
        f"tuning.{excluded}",
        "",
        _table(
            [
                "loss",
                "published",
                "tuned",
                "gain (points)",
                "p (paired t)" if gains["paired"].all() else "p",
                "rank published -> tuned",
            ],
            rows,
            [_where(d, b) for d, b in zip(gains["dataset"], gains["backbone"], strict=True)],
        ),
        "",
    )
    doc.add(_gain_sentence(analysis, gains, alpha, same), "")
    doc.add(_ranking_sentence(analysis, gains, baseline, metric), "")


def _kept_published(best: dict) -> bool:
    """Whether the search's best values are the published ones (trial 0 won)."""
    published = best.get("published") or {}
    return bool(best.get("values")) and all(published.get(k) == v for k, v in best["values"].items())


def _gain(row: dict) -> str:
    if math.isnan(row["gain_low"]):
        return f"{100 * row['gain']:+.1f} (no interval)"
    return f"{100 * row['gain']:+.1f} [{100 * row['gain_low']:+.1f}, {100 * row['gain_high']:+.1f}]"


def _gain_sentence(analysis: Analysis, gains: pd.DataFrame, alpha: float, same: set[tuple[str, str, str]]) -> str:
    several = len(gains[["dataset", "backbone"]].drop_duplicates()) > 1

    def name(row: dict) -> str:
        loss = analysis.names.get(row["loss"], row["loss"])
        return f"{loss} ({_where(row['dataset'], row['backbone'])})" if several else loss

    every = gains.to_dict("records")
    kept_rows = [r for r in every if (r["dataset"], r["backbone"], r["loss"]) in same]
    records = [r for r in every if r not in kept_rows]
    better = [name(r) for r in records if r["p_value"] < alpha and r["gain"] > 0]
    worse = [name(r) for r in records if r["p_value"] < alpha and r["gain"] < 0]
    parts = []
    if kept_rows:
        kept = ", ".join(name(r) for r in kept_rows)
        parts.append(
            f"the search kept the published values of {kept} (trial 0 won), so their two rows are the same trainings"
        )
    if better:
        parts.append(f"tuning raised the test score of {', '.join(better)} significantly")
    if worse:
        parts.append(
            f"lowered that of {', '.join(worse)} significantly (the validation classes' optimum did not transfer)"
        )
    rest = len(records) - len(better) - len(worse)
    if rest:
        parts.append(
            f"for {'the other ' if better or worse else ''}{rest} loss{'es' if rest > 1 else ''} whose values "
            "changed, the "
            "difference is not significant (with few seeds a difference of a few points goes undetected)"
        )
    test = "paired t-test" if gains["paired"].all() else "paired or Welch test"
    return f"At the {alpha:g} level ({test} per loss, uncorrected): " + "; ".join(parts) + "."


def _ranking_sentence(analysis: Analysis, gains: pd.DataFrame, baseline: pd.DataFrame, metric: str) -> str:
    """Which losses swap places, and whether either order is backed by a significant difference."""
    alpha, confidence = analysis.params.report.alpha, analysis.params.evaluate.confidence
    lower, upper = metric_range(metric)
    swaps = swapped_pairs(gains)
    if not swaps:
        return "The order of the losses by mean test score is the same before and after tuning."
    tuned = analysis.results.runs
    several = len(gains[["dataset", "backbone"]].drop_duplicates()) > 1
    texts = []
    for dataset, backbone, a, b in swaps:
        dim = int(rows_of(gains, dataset=dataset, backbone=backbone)["dim"].iloc[0])
        separated = []
        for label, runs in (("published", baseline), ("tuned", tuned)):
            pick = rows_of(runs, dataset=dataset, backbone=backbone, dim=dim, metric=metric)
            first, second, paired = matched(pick[pick["loss"] == a], pick[pick["loss"] == b])
            _, _, _, p = difference_interval(first, second, confidence, upper - lower, paired)
            if not math.isnan(p) and p < alpha:
                separated.append(label)
        verdict = (
            f"separated at the {alpha:g} level with the {' and the '.join(separated)} values"
            if separated else f"not separated at the {alpha:g} level either way (paired t over seeds), so the swap is "
            "within noise"
        )  # fmt: skip
        where = f" on {_where(dataset, backbone)}" if several else ""
        texts.append(f"{analysis.names.get(a, a)} and {analysis.names.get(b, b)} swap places{where} ({verdict})")
    return "Tuning changes the order by mean test score: " + "; ".join(texts) + "."


SECTION = Section("Tuning", "Tuning", write)
