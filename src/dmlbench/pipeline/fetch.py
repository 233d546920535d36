"""``make fetch`` (``python -m dmlbench.pipeline --fetch-only``): every file the grid downloads,
downloaded and verified now, here (on a cluster: the login node, which has the internet).

Dataset archives go to ``data/`` by the download stage's own code
(:func:`dmlbench.data.archives.ensure_archive`), then each dataset's pre-flight must find every
file it needs; pretrained weights are pinned in the weights lock and fetched into the Hub or
torch cache, sha256-checked (:mod:`dmlbench.models.hub`, :mod:`dmlbench.models.weights`). After it
no stage needs the network: Slurm jobs run with ``DMLBENCH_OFFLINE=1`` and ``HF_HUB_OFFLINE=1``
and must see the same caches (docs/cluster.md, "Login vs compute internet").
"""

from __future__ import annotations

from pathlib import Path

from dmlbench.data import DATASETS
from dmlbench.data.archives import dataset_problems, ensure_archive, resolve
from dmlbench.errors import DmlbenchError
from dmlbench.models.base import WeightsFile
from dmlbench.models.hub import hub_file_problem
from dmlbench.models.weights import WeightsParams, resolve_weights, weights_file_problem
from dmlbench.params.model import Params


def fetch_archives(params: Params, dropbox: Path) -> list[str]:
    """Download (or verify) every archive of the grid's datasets into ``dropbox``; one line per problem."""
    problems: list[str] = []
    for name, dataset_params in params.datasets.items():
        spec = DATASETS[name]
        own: list[str] = []
        needed = spec.archives_for(dataset_params, dropbox) if spec.archives_for else spec.archives
        for item in resolve(needed, dataset_params.source):
            if (dropbox / item.filename).exists() or item.urls:
                try:
                    ensure_archive(name, item, dropbox)
                except DmlbenchError as exc:
                    own.append(str(exc))
        if not own:  # every file the download stage needs must now be in the drop-box
            own = dataset_problems(spec, dataset_params, dropbox, lambda url: "not in the drop-box after the fetch")
        problems += own
    return problems


def download_unpinned(file: WeightsFile) -> str | None:
    """A timm model's URL-only weights into torch's hub cache (where timm's loader finds them); the problem."""
    import torch

    file.path.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.hub.download_url_to_file(str(file.url), str(file.path))
    except OSError as exc:
        return f"backbones.{file.backbone}: cannot download {file.url} ({getattr(exc, 'reason', None) or exc})"
    return None


def fetch_weights(params: Params) -> list[str]:
    """Download (or verify) every pretrained weights file of the grid's backbones, pinning each Hub
    file in the weights lock; one line per problem."""
    if not params.protocol.pretrained:
        return []
    problems: list[str] = []
    for backbone, backbone_params in params.backbones.items():
        for file in backbone_params.weights_files(backbone):
            try:
                if file.hub is not None:
                    problem = hub_file_problem(backbone, file.hub, file.path if file.local_only else None, fetch=True)
                elif isinstance(backbone_params, WeightsParams):
                    problem = None
                    resolve_weights(backbone, backbone_params)
                elif file.url and not file.local_only and not file.install and not file.path.is_file():
                    problem = download_unpinned(file)
                else:
                    problem = weights_file_problem(file)
            except DmlbenchError as exc:
                problem = str(exc)
            if problem:
                problems.append(problem)
    return problems


def fetch_all(params: Params, dropbox: Path) -> list[str]:
    """Every archive and weights file the grid needs, here and verified; the problems (empty: all there)."""
    dropbox.mkdir(parents=True, exist_ok=True)
    return fetch_archives(params, dropbox) + fetch_weights(params)


def require_fetched(params: Params, dropbox: Path) -> None:
    """:func:`fetch_all`, raising one line per file that could not be fetched."""
    problems = fetch_all(params, dropbox)
    if problems:
        raise DmlbenchError(
            f"{len(problems)} file(s) the grid needs could not be fetched (jobs run offline):\n" + "\n".join(problems)
        )
