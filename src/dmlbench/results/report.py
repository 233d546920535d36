"""The report a merged results index supports (:mod:`.merge`): what needs only each run's score.

From the run rows (one score per run and metric) it gives, as the report stage does:

* per dataset and backbone, a table of every cell's mean over seeds with its t-interval (clipped to
  the metric's range) and n, the cell's provenance (``trained here`` / ``pulled``, per its lab's
  index) and the lab(s) (``source``) it came from;
* the tournament over experiments (dataset x backbone x embedding size) and the tests across
  datasets: mean ranks over the dataset blocks, the Friedman test with its exact or permutation p,
  after a significant one Nemenyi's critical difference (:func:`dmlbench.analysis.numbers.significance_tests`).

It does not give what needs more than the scores: per-query paired gains over the frozen trunk
(``per_query.npz``), the Bayesian comparisons' per-seed analysis beyond the tests' table, training
curves, costs, test-set feedback, papers versus reality and the figures. Those come from the report
stage of a workspace that holds the runs' outputs (``dvc pull`` of each lab's grid).
"""

from __future__ import annotations

import pandas as pd

from dmlbench.analysis.numbers import significance_tests, summarize, tournament_input
from dmlbench.analysis.text import format_interval, markdown_table, p_value
from dmlbench.analysis.tournament import tournament
from dmlbench.data import DATASETS


def merged_report(index: pd.DataFrame, metric: str, confidence: float, alpha: float, rope: float) -> str:
    """Markdown of the parts of the report a merged index supports (module docstring)."""
    runs = index[index["level"] == "run"].copy()
    runs["dim"], runs["seed"] = runs["dim"].astype(int), runs["seed"].astype(int)
    runs["value"] = runs["value"].astype(float)
    scored = runs[["dataset", "backbone", "loss", "dim", "seed", "metric", "value"]]
    summary = summarize(scored[scored["metric"] == metric], confidence)
    sources = runs.groupby(["dataset", "backbone", "loss", "dim"])["source"].agg(lambda s: ", ".join(sorted(set(s))))
    provenance = runs.groupby(["dataset", "backbone", "loss", "dim"])["provenance"].agg(
        lambda s: "+".join(sorted(set(s)))
    )
    level = int(round(100 * confidence))
    named = dict.fromkeys(runs["source"])
    lines = [
        "# Merged results",
        "",
        f"From {runs['source'].nunique()} results index(es): {', '.join(f'`{s}`' for s in named)}"
        f"; {len(runs.drop_duplicates(['dataset', 'backbone', 'loss', 'dim', 'seed']))} runs, protocol "
        f"`{runs['protocol'].iloc[0]}`. Scores are `{metric}` in percent: the mean over seeds with its {level}% "
        "t-interval over seeds (clipped to [0, 100]), n = seeds. *Provenance* is as each lab's index recorded "
        "it (`trained here` = trained by that lab, `pulled` = taken from another lab's grid); *source* names the "
        "index each run came from.",
        "",
    ]
    for (dataset, backbone), block in summary.groupby(["dataset", "backbone"], sort=False):
        rows = [
            [
                r.loss,
                r.dim,
                format_interval(r.mean, r.low, r.high, int(r.n)),
                provenance[(dataset, backbone, r.loss, r.dim)],
                sources[(dataset, backbone, r.loss, r.dim)],
            ]
            for r in block.itertuples()
        ]
        header = ["loss", "dim", metric, "provenance", "source"]
        lines += [f"## `{dataset}` / `{backbone}`", "", markdown_table(header, rows), ""]
    ranking = tournament(tournament_input(scored, metric))
    synthetic = [name for name in runs["dataset"].unique() if name in DATASETS and DATASETS[name].synthetic]
    tests = significance_tests(scored, metric, list(ranking["loss"]), confidence, alpha, rope, synthetic)
    lines += [
        "## Tournament and tests across datasets",
        "",
        f"Tournament over {ranking['experiments'].max()} experiment(s) (rank 1 = best seed-mean `{metric}`):",
        "",
        markdown_table(
            ["loss", "mean rank", "experiments"],
            [[r.loss, f"{r.mean_rank:.2f}", int(r.experiments)] for r in ranking.itertuples()],
        ),
        "",
        f"Blocks of the tests: {tests.grid}.",
        "",
    ]
    if tests.blocks is not None and len(tests.blocks):
        ranks = tests.blocks.ranks
        lines += [
            markdown_table(
                ["dataset", *ranks.columns], [[d, *(f"{v:.2f}" for v in row)] for d, row in ranks.iterrows()]
            ),
            "",
        ]
    if tests.friedman is not None:
        f = tests.friedman
        lines.append(
            f"Friedman test over n = {f.n_blocks} dataset blocks and {f.n_losses} losses: chi2 = {f.statistic:.2f}, "
            f"p = {p_value(f.pvalue)} ({f.method_text})"
            + (f"; Nemenyi critical difference {tests.cd:.2f} ranks at alpha = {alpha:g}." if tests.cd else ".")
        )
    else:
        lines.append(f"No Friedman test: {tests.skipped}.")
    return "\n".join(lines) + "\n"
