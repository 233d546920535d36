"""``make fetch`` (``python -m dmlbench.pipeline --fetch-only``): every file the grid downloads,
downloaded and verified now, here (on a cluster: the login node, which has the internet).

* Dataset archives go to the drop-box ``data/`` by the download stage's own code
  (:func:`dmlbench.data.archives.ensure_archive`: the published URL, then the mirrors, the md5
  the judge; a copy already there is verified), so the ``download@`` stage later only unpacks.
  Then each dataset's pre-flight (:func:`dmlbench.data.archives.dataset_problems`) must find
  every file it needs in ``data/`` (Cars196's alternative layouts included).
* Pinned pretrained weights (``pretrained: true`` protocols) go to torch's hub cache
  (:func:`dmlbench.models.weights.resolve_weights`: sha256-checked); files a package installs or
  ``weights_path`` names are checked where they are.

After it, no stage needs the network: the Slurm executor runs its jobs with
``DMLBENCH_OFFLINE=1``, under which the download and weights code fail in one line naming the
missing file and ``make fetch`` instead of downloading. timm backbones without ``weights_path``
fetch their weights through timm (Hugging Face Hub) and are not covered: pin a ``weights_path``.
"""

from __future__ import annotations

from pathlib import Path

from dmlbench.data import DATASETS
from dmlbench.data.archives import dataset_problems, ensure_archive, resolve
from dmlbench.errors import DmlbenchError
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


def fetch_weights(params: Params) -> list[str]:
    """Download (or verify) every pinned weights file of the grid's backbones; one line per problem."""
    if not params.protocol.pretrained:
        return []
    problems: list[str] = []
    for backbone, backbone_params in params.backbones.items():
        for file in backbone_params.weights_files(backbone):
            try:
                if isinstance(backbone_params, WeightsParams):
                    resolve_weights(backbone, backbone_params)
                elif problem := weights_file_problem(file):
                    problems.append(problem)
            except DmlbenchError as exc:
                problems.append(str(exc))
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
