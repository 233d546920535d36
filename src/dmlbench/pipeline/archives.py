"""Pre-flight for dataset archives: every archive the grid's datasets need is in the drop-box
``data/`` or downloadable now (:func:`dmlbench.models.weights.url_unreachable`), else one line per
archive (:func:`dmlbench.data.archives.dataset_problems`). Generated datasets need nothing (the
offline demo makes no request); checksums are verified by the download stage.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from dmlbench.data import DATASETS
from dmlbench.data.archives import dataset_problems
from dmlbench.errors import DataError
from dmlbench.models.weights import HEAD_TIMEOUT, url_unreachable
from dmlbench.params.model import Params


def missing_archives(params: Params, dropbox: Path, timeout: float = HEAD_TIMEOUT) -> list[str]:
    """One line per dataset archive that is neither in ``dropbox`` nor downloadable now."""
    problems: list[str] = []
    check = partial(url_unreachable, timeout=timeout)
    for name, dataset_params in params.datasets.items():
        problems += dataset_problems(DATASETS[name], dataset_params, Path(dropbox), check)
    return problems


def require_archives(params: Params, dropbox: Path, timeout: float = HEAD_TIMEOUT) -> None:
    """Raise :class:`DataError` listing every missing archive (one line each), before any work."""
    problems = missing_archives(params, dropbox, timeout)
    if problems:
        raise DataError(
            f"{len(problems)} dataset archive(s) are neither in {dropbox}/ nor downloadable:\n" + "\n".join(problems)
        )
