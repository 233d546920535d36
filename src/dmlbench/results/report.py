"""The report a merged results index supports (:mod:`.merge`): what needs only each run's score.

Per dataset and backbone, each cell's mean over seeds with its t-interval (clipped to the metric's
range), n, provenance and source; the tournament and the tests across datasets
(:func:`dmlbench.analysis.numbers.significance_tests`). What needs the runs' outputs (per-query gains,
curves, costs, figures) comes from the report stage: docs/report.md ("Several labs").
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
