"""Analyse: every number the report shows, computed once from the collected results.

Seed means with t-intervals, the tournament, the Friedman/Nemenyi, sign and Bayesian tests, papers
versus reality (claimed, re-measured and our relative improvements), test-set feedback and cost.
Sections only format these numbers.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dmlbench.analysis import bayesian as bz
from dmlbench.analysis import claims as claims_of
from dmlbench.analysis import literature as lit
from dmlbench.analysis import statistics as st
from dmlbench.analysis.collect import Results
from dmlbench.analysis.friedman import FriedmanResult, friedman
from dmlbench.analysis.reproduction import reproduction_table
from dmlbench.analysis.run_records import feedback_bias, run_costs
from dmlbench.analysis.tournament import experiment_ranks, tournament
from dmlbench.data import DATASETS
from dmlbench.evaluate.intervals import bounded_t_interval
from dmlbench.evaluate.metrics import metric_range
from dmlbench.params.model import Params

BASELINES = ("contrastive", "triplet")
TOP1 = "precision_at_1"  # = Recall@1, what papers report
RUN = ["dataset", "backbone", "loss", "dim", "seed"]


def seed_means(frame: pd.DataFrame, columns: list[str], keys: list[str] = RUN) -> pd.DataFrame:
    """One row per ``keys`` (by default a run) with the mean of ``columns``: the fold models of a
    cross-validated run, which share its seed and classes, become one value per seed, so every
    interval over runs counts seeds (times the cells a table pools, which it then states)."""
    return frame.groupby(keys, as_index=False, sort=False)[columns].mean()


def rows_of(frame: pd.DataFrame, **values: Any) -> pd.DataFrame:
    """The rows of ``frame`` whose columns equal ``values`` (column name -> value)."""
    return frame[(frame[list(values)] == pd.Series(values)).all(axis=1)]


def fold_models_per_seed(frame: pd.DataFrame) -> int:
    """How many fold models one seed of one cell holds in ``frame`` (1 without cross-validation)."""
    return int(frame.groupby(RUN, sort=False).size().max()) if len(frame) else 0


def summarize(runs: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """Mean, t-interval clipped to the metric's range (:func:`~dmlbench.evaluate.metrics.metric_range`), n
    and the sample sd over seeds per (dataset, backbone, loss, dim, metric)."""
    rows = []
    for key, group in runs.groupby(["dataset", "backbone", "loss", "dim", "metric"], sort=False):
        interval = bounded_t_interval(group["value"].to_numpy(), confidence, *metric_range(key[-1]))
        rows.append(
            dict(
                zip(["dataset", "backbone", "loss", "dim", "metric"], key, strict=True),
                mean=interval.mean,
                low=interval.low,
                high=interval.high,
                n=interval.n,
                sd=float(group["value"].std(ddof=1)) if len(group) > 1 else math.nan,
            )
        )
    return pd.DataFrame(rows)


def tournament_input(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One score per (experiment, loss): the seed-mean of ``metric``; experiment = dataset/backbone/dim."""
    selected = runs[runs["metric"] == metric]
    scores = selected.groupby(["dataset", "backbone", "dim", "loss"], as_index=False)["value"].mean()
    scores["experiment"] = scores["dataset"] + "/" + scores["backbone"] + "/" + scores["dim"].astype(str)
    return scores.rename(columns={"value": "score"})[["experiment", "loss", "score"]]


def focus_dim(params: Params) -> int:
    """``report.focus_dim``, else 512 when the grid has it (the papers' size), else the largest dim."""
    if params.report.focus_dim is not None:
        return params.report.focus_dim
    return 512 if 512 in params.dims else max(params.dims)


@dataclass
class Tests:
    """Friedman + Nemenyi (``skipped``: why not run), Holm-adjusted win rates and the Bayesian comparison
    over the dataset blocks; ``nemenyi``/``cd``/``wins`` only after a significant Friedman test, ``wins``
    from :data:`~.statistics.MIN_BLOCKS` datasets."""

    blocks: st.DatasetBlocks | None = None
    friedman: FriedmanResult | None = None
    nemenyi: pd.DataFrame | None = None
    cd: float | None = None
    wins: pd.DataFrame | None = None
    skipped: str | None = None
    grid: str = ""  # e.g. "1 dataset (2 experiments: 1 backbone x 2 embedding sizes)"
    experiments: int = 0  # complete experiments (dataset x backbone x dim), described per experiment
    datasets: int = 0  # independent blocks
    bayes: pd.DataFrame | None = None  # bayesian.compare_neighbours
    rope: float = 0.01  # metric units

    def separated_from(self, best: str, others: Iterable[str], alpha: float) -> dict[str, str]:
        """The losses among ``others`` that a test separates from ``best``, each with the test:
        Nemenyi p < alpha after a Friedman test with p < alpha, or the Bayesian comparison across
        datasets deciding ``best`` practically better (P >= 0.95; it compares tournament
        neighbours only). Per-experiment Bayesian verdicts speak for one data split and do not count."""
        found: dict[str, str] = {}
        if self.nemenyi is not None and self.friedman is not None and self.friedman.pvalue < alpha:
            for other in others:
                if self.nemenyi.loc[best, other] < alpha:
                    found[other] = f"Nemenyi, alpha = {alpha:g}"
        if self.bayes is not None:
            across = self.bayes[(self.bayes["experiment"] == bz.ACROSS) & (self.bayes["a"] == best)]
            for r in across.itertuples():
                if r.b in others and r.better >= bz.DECISION:
                    found.setdefault(r.b, f"Bayesian signed-rank across datasets, P >= {bz.DECISION:g}")
        return found

    def why_not_separated(self, alpha: float) -> str:
        """What keeps the tests from separating losses in this grid (for a claim that stops short)."""
        if self.friedman is None:
            reason = "the Friedman and Nemenyi tests were not run (why: next line)"
        elif self.friedman.pvalue >= alpha:
            reason = f"the Friedman test finds no difference at alpha = {alpha:g}"
        else:
            reason = f"Nemenyi p >= {alpha:g}"
        if self.bayes is None or not (self.bayes["experiment"] == bz.ACROSS).any():
            reason += f"; the Bayesian comparison across datasets needs {bz.MIN_DATASETS} datasets"
        return reason


def significance_tests(
    runs: pd.DataFrame,
    metric: str,
    ranked: list[str],
    confidence: float,
    alpha: float,
    rope: float,
    synthetic: Collection[str] = (),
) -> Tests:
    """The tests of ``metric`` over the dataset blocks of ``runs`` (``synthetic`` datasets left out
    beside real ones: :func:`~.statistics.block_datasets`); ``ranked``: the tournament order (best
    first), whose neighbours the Bayesian comparison pairs. Nemenyi, the critical difference and
    the sign tests only after a Friedman test with p < ``alpha``."""
    blocks = st.dataset_blocks(runs, metric, synthetic)
    tests = Tests(blocks=blocks, rope=rope, datasets=len(blocks), grid=st.grid_text(runs, metric, synthetic))
    tests.experiments = int(blocks.experiments.sum())
    scores = blocks.scores
    tests.skipped = st.friedman_shortfall(scores, tests.grid)
    if tests.skipped is None:
        tests.friedman = friedman(scores)
        if tests.friedman.pvalue < alpha:
            tests.nemenyi = st.nemenyi(scores)
            tests.cd = st.critical_difference(scores.shape[1], scores.shape[0], alpha)
            if len(blocks) >= st.MIN_BLOCKS:
                tests.wins = st.win_rates(scores, confidence)
    if scores.shape[1] > 1:
        seeds = st.seed_scores(runs, metric)
        tests.bayes = bz.compare_neighbours(seeds, st.dataset_means(runs, metric, synthetic), ranked, rope)
    return tests


def rank_intervals(blocks: st.DatasetBlocks, confidence: float) -> dict[str, Any]:
    """Per loss: the t-interval of its mean rank over the independent blocks (n = datasets; each
    dataset's rank is the mean over its experiments), inside [1, losses ranked]."""
    worst = float(blocks.ranks.shape[1])
    return {loss: bounded_t_interval(blocks.ranks[loss].to_numpy(), confidence, 1.0, worst) for loss in blocks.ranks}


@dataclass
class Papers:
    claimed: dict[str, pd.DataFrame]  # per baseline: claims.claimed_improvements, one row per claim
    reference: dict[str, pd.DataFrame]
    ours: dict[str, pd.DataFrame]  # per baseline: our relative improvements (percent)
    ours_absolute: pd.DataFrame  # display, year, dataset, mean, low, high (percent), n
    literature: pd.DataFrame
    methods: pd.DataFrame


@dataclass
class Analysis:
    params: Params
    results: Results
    summary: pd.DataFrame
    names: dict[str, str]
    order: list[str]  # display names, oldest loss first
    ranking: pd.DataFrame
    ranks: pd.DataFrame  # experiment, loss, rank (tournament.experiment_ranks)
    rank_intervals: dict[str, Any]  # loss -> interval of its mean rank over datasets (rank_intervals)
    tests: Tests
    papers: Papers
    bias: pd.DataFrame
    costs: pd.DataFrame
    dim: int
    reproduction: pd.DataFrame  # reproduction.reproduction_table: published numbers of the protocol's setup

    def display(self, frame: pd.DataFrame) -> pd.DataFrame:
        return frame.assign(loss=frame["loss"].map(self.names))


def analyse(params: Params, results: Results) -> Analysis:
    confidence = params.evaluate.confidence
    primary = params.report.primary_metric
    methods = lit.load_methods()
    literature = lit.load_literature(methods=methods)
    losses = list(params.losses)
    names = {loss: lit.display_name(loss, methods) for loss in losses}
    chronological = sorted(losses, key=lambda loss: (_year(loss, methods), losses.index(loss)))
    order = [names[loss] for loss in chronological]

    ranking = tournament(tournament_input(results.runs, primary))
    ranks = experiment_ranks(tournament_input(results.runs, primary))
    report = params.report
    synthetic = [name for name in params.datasets if DATASETS[name].synthetic]
    tests = significance_tests(
        results.runs, primary, list(ranking["loss"]), confidence, report.alpha, report.rope, synthetic
    )

    summary = summarize(results.runs, confidence)
    bias = feedback_bias(results)
    best = bias.assign(metric=bias["metric"].map(lit.canonical_metric)) if len(bias) else bias
    return Analysis(
        params=params,
        results=results,
        summary=summary,
        names=names,
        order=order,
        ranking=ranking,
        ranks=ranks,
        rank_intervals=rank_intervals(tests.blocks, confidence),
        tests=tests,
        papers=papers_vs_reality(params, results, literature, methods, names, confidence),
        bias=bias,
        costs=run_costs(results),
        dim=focus_dim(params),
        reproduction=reproduction_table(
            summary, lit.published_for(literature, params.protocol_name), params.report.rope, confidence, best
        ),
    )


def _year(loss: str, methods: pd.DataFrame) -> float:
    year = lit.loss_year(loss, methods)
    return math.inf if math.isnan(year) else year


def papers_vs_reality(
    params: Params,
    results: Results,
    literature: pd.DataFrame,
    methods: pd.DataFrame,
    names: dict[str, str],
    confidence: float,
) -> Papers:
    """Claimed and re-measured relative improvements over the baselines, and ours at the focus dim."""
    dim = focus_dim(params)
    claimed, reference, ours = {}, {}, {}
    for baseline in BASELINES:
        claims = claims_of.claimed_improvements(literature, baseline)
        claimed[baseline] = claims.assign(display=claims["loss"].map(lambda x: lit.display_name(x, methods)))
        refs = lit.reference_improvements(literature, baseline, methods)
        reference[baseline] = refs
        ours[baseline] = _our_improvements(results.runs, baseline, dim, names, methods, confidence)
    top1 = results.runs[(results.runs["metric"] == TOP1) & (results.runs["dim"] == dim)]
    rows = []
    for (dataset, backbone, loss), group in top1.groupby(["dataset", "backbone", "loss"], sort=False):
        interval = bounded_t_interval(group["value"].to_numpy(), confidence, 0.0, 1.0)
        low, high = interval.bounds_or_mean()
        values = {"mean": 100 * interval.mean, "low": 100 * low, "high": 100 * high, "n": interval.n}
        rows.append(_loss_row(dataset, backbone, loss, names, methods, values))
    return Papers(claimed, reference, ours, pd.DataFrame(rows), literature, methods)


def _our_improvements(
    runs: pd.DataFrame, baseline: str, dim: int, names: dict[str, str], methods: pd.DataFrame, confidence: float
) -> pd.DataFrame:
    """Our relative P@1 improvement of each loss over ``baseline`` per dataset/backbone at ``dim`` (percent):
    paired over the seeds when both cells have the same seeds, else Welch."""
    top1 = runs[(runs["metric"] == TOP1) & (runs["dim"] == dim)]
    rows = []
    for (dataset, backbone), block in top1.groupby(["dataset", "backbone"], sort=False):
        base = block[block["loss"] == baseline].groupby("seed")["value"].mean()
        if base.size == 0:
            continue
        for loss, group in block.groupby("loss", sort=False):
            if loss == baseline:
                continue
            mine = group.groupby("seed")["value"].mean()  # fold rows of one seed are one run
            paired = set(mine.index) == set(base.index)
            try:
                ratio = st.relative_improvement(
                    mine.to_numpy(), base.reindex(mine.index if paired else base.index).to_numpy(), confidence, paired
                )
            except ValueError:  # a mean of 0 (collapsed embeddings): no ratio
                continue
            low, high = ratio.bounds_or_estimate()
            values = {"estimate": 100 * ratio.estimate, "low": 100 * low, "high": 100 * high, "interval": ratio}
            rows.append(_loss_row(dataset, backbone, loss, names, methods, values))
    return pd.DataFrame(rows)


def _loss_row(
    dataset: str, backbone: str, loss: str, names: dict[str, str], methods: pd.DataFrame, values: dict[str, Any]
) -> dict[str, Any]:
    """A row of the papers-vs-reality tables: the cell, the loss's display name and year, then ``values``."""
    cell = {"dataset": dataset, "backbone": backbone, "loss": loss}
    return {**cell, "display": names[loss], "year": lit.loss_year(loss, methods), **values}


def dated(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows whose loss has a publication year (what the by-year figures can place)."""
    return frame[frame["year"].notna()] if len(frame) else frame


def t_bounds(values: pd.Series, confidence: float, lower: float = 0.0, upper: float = math.inf) -> tuple[float, float]:
    """(low, high) of the t-interval of ``values`` kept inside ``[lower, upper]`` (NaN for one
    value), for :func:`~.text.format_interval`."""
    interval = bounded_t_interval(values.to_numpy(dtype=float), confidence, lower, upper)
    return interval.low, interval.high
