"""Pre-flight for dataset archives: before any stage runs, every archive the grid's datasets
need is in the drop-box ``data/`` or downloadable now (an HTTP ``HEAD``), else the pipeline
stops with the download stage's own messages (:func:`dmlbench.data.archives.missing_archives_error`
for files without a public URL). Generated datasets (glyphs) need nothing, so the offline demo
makes no request. Checksums are verified by the download stage, which reads every byte.
"""

from __future__ import annotations

from pathlib import Path

from dmlbench.config import Params
from dmlbench.data import DATASETS
from dmlbench.data.archives import missing_archives_error, resolve
from dmlbench.errors import DataError
from dmlbench.models.weights import HEAD_TIMEOUT, url_unreachable


def missing_archives(params: Params, dropbox: Path, timeout: float = HEAD_TIMEOUT) -> list[str]:
    """One line per dataset archive that is neither in ``dropbox`` nor downloadable now."""
    problems: list[str] = []
    for name, dataset_params in params.datasets.items():
        archives = resolve(DATASETS[name].archives, dataset_params.source)
        absent = [item for item in archives if not (Path(dropbox) / item.filename).exists()]
        no_url = [item for item in absent if item.url is None]
        if no_url:
            problems.append(str(missing_archives_error(name, no_url, Path(dropbox))))
        for item in absent:
            reason = url_unreachable(item.url, timeout) if item.url is not None else None
            if reason is not None:
                problems.append(
                    f"{name}: {item.url} cannot be reached ({reason}); place {item.describe()} in {dropbox}/ "
                    f"(or set datasets.{name}.source.{item.archive.key}.url to a mirror)"
                )
    return problems


def require_archives(params: Params, dropbox: Path, timeout: float = HEAD_TIMEOUT) -> None:
    """Raise :class:`DataError` listing every missing archive (one line each), before any work."""
    problems = missing_archives(params, dropbox, timeout)
    if problems:
        raise DataError(
            f"{len(problems)} dataset archive(s) are neither in {dropbox}/ nor downloadable:\n" + "\n".join(problems)
        )
