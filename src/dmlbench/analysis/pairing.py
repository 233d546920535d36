"""Which runs may be paired: the report's paired statistics compare losses run by run (seed k of
one loss against seed k of another on the same test queries: the paired gains, the per-experiment
ranks that the tests across losses combine), which is fair only when both runs were trained under
the same protocol on the same prepared data with the same split. Runs of one experiment (dataset x
backbone x embedding size) are paired, so each experiment's runs must agree on every field of
:data:`~dmlbench.analysis.identity.PAIRING`; :func:`check_pairable` refuses, in one line naming
two runs and the field, before any statistic is computed. Pure: the identities come in as a frame.
"""

from __future__ import annotations

import pandas as pd

from dmlbench.analysis.identity import PAIRING
from dmlbench.errors import DmlbenchError

EXPERIMENT = ["dataset", "backbone", "dim"]


class UnpairableRuns(DmlbenchError):
    """Two runs of one experiment differ in protocol, dataset checksum or split."""


def run_name(row: pd.Series) -> str:
    """``glyphs/tiny_cnn/triplet/32 seed 0`` (with ``from <source>`` where the row has a ``source``)."""
    name = f"{row['dataset']}/{row['backbone']}/{row['loss']}/{row['dim']} seed {row['seed']}"
    source = row.get("source")
    return f"{name} from {source}" if isinstance(source, str) and source else name


def check_pairable(identities: pd.DataFrame, fields: tuple[str, ...] = PAIRING) -> None:
    """Raise :class:`UnpairableRuns` when two runs of one experiment (:data:`EXPERIMENT`) differ in
    one of ``fields`` (``identities``: one row per run, with ``loss`` and ``seed``)."""
    for _, runs in identities.groupby(EXPERIMENT, sort=False):
        for field in fields:
            values = runs[field].astype(str)
            if values.nunique() > 1:
                first = runs.iloc[0]
                other = runs[values != values.iloc[0]].iloc[0]
                raise UnpairableRuns(
                    f"cannot pair {run_name(first)} ({field} {first[field]}) with {run_name(other)} "
                    f"({field} {other[field]}): runs are paired only under the same "
                    f"{', '.join(f.replace('_', ' ') for f in fields)}"
                )
