"""Which runs may be paired: the paired statistics compare seed k of one loss with seed k of another,
fair only when both were trained under the same protocol on the same prepared data and split. Runs
of one experiment must agree on every field of :data:`~dmlbench.analysis.identity.PAIRING`, else
:func:`check_pairable` refuses in one line naming two runs and the field. Pure (identities in).
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
