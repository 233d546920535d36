"""Pre-flight: what must be in place before any stage runs (``make repro`` and the ``validate``
stage call it), so that a missing input fails in seconds, not after download and prepare: every
pinned weights file of a pretrained grid (Hub files pinned in the weights lock first, so no stage
writes it), every dataset archive (in ``data/`` or downloadable; generated datasets need nothing),
and faiss when ``evaluate.backend: faiss``. The device check is apart
(:mod:`dmlbench.pipeline.device_check`), so that ``validate`` does not depend on the device code.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dmlbench.errors import DmlbenchError, WeightsError
from dmlbench.models.hub import hub_file_problem
from dmlbench.models.weights import HEAD_TIMEOUT, weights_file_problem
from dmlbench.params.model import Params
from dmlbench.pipeline.archives import require_archives
from dmlbench.weights_lock import ensure_lock, read_lock


def missing_weights(params: Params, timeout: float = HEAD_TIMEOUT) -> list[str]:
    """One line per pretrained weights file the grid needs that is neither here (with its pinned
    sha256) nor downloadable now; empty when the protocol is not pretrained (no file, no network)."""
    if not params.protocol.pretrained:
        return []
    problems: list[str] = []
    seen: set[Path] = set()
    for backbone, backbone_params in params.backbones.items():
        for file in backbone_params.weights_files(backbone):
            if file.path not in seen:
                seen.add(file.path)
                if file.hub is not None:
                    weights_path = file.path if file.local_only else None
                    problem = hub_file_problem(backbone, file.hub, weights_path, timeout=timeout)
                else:
                    problem = weights_file_problem(file, timeout)
                if problem:
                    problems.append(problem)
    return problems


def require_weights(params: Params, timeout: float = HEAD_TIMEOUT) -> None:
    """Raise :class:`WeightsError` listing every missing weights file (one line each), before any work."""
    problems = missing_weights(params, timeout)
    if problems:
        raise WeightsError(
            f"protocol {params.protocol_name!r} (pretrained: true) needs {len(problems)} pretrained weights "
            "file(s) that are neither here nor downloadable:\n" + "\n".join(problems)
        )


def weights_pins(params: Params) -> dict[str, dict[str, str]]:
    """What each backbone's pretrained Hub files are pinned at in the weights lock: backbone ->
    {lock key: "<sha256>@<commit>"}; empty when the protocol is not pretrained. Called after
    :func:`require_weights` (every file pinned); a file not pinned is left out."""
    if not params.protocol.pretrained:
        return {}
    lock = read_lock()
    pins: dict[str, dict[str, str]] = {}
    for backbone, backbone_params in params.backbones.items():
        for file in backbone_params.weights_files(backbone):
            entry = lock.get(file.hub.name) if file.hub is not None else None
            if file.hub is not None and entry is not None:
                pins.setdefault(backbone, {})[file.hub.name] = f"{entry.sha256}@{entry.revision}"
    return pins


def require_backend(params: Params) -> None:
    """Raise :class:`DmlbenchError` when ``evaluate.backend`` names faiss and faiss is not installed."""
    if params.evaluate.backend == "faiss" and importlib.util.find_spec("faiss") is None:
        raise DmlbenchError(
            "evaluate.backend: faiss, but the faiss module is not installed here; install the project's "
            "cpu or gpu extra (make setup EXTRAS=cpu,test or EXTRAS=gpu,test) or set backend to one of "
            "auto, torch, screened"
        )


def preflight(params: Params, dropbox: Path) -> None:
    """Every pre-flight check, all problems reported at once (one line each), before any stage."""
    ensure_lock()  # a dependency of the validate stage, so it exists even before a first pin
    problems = []
    for check, arguments in ((require_backend, ()), (require_weights, ()), (require_archives, (dropbox,))):
        try:
            check(params, *arguments)
        except DmlbenchError as exc:
            problems.append(str(exc))
    if problems:
        raise DmlbenchError("\n".join(problems))
