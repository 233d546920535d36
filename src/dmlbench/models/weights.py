"""Pretrained weights: a pinned URL and sha256, a local-path override, clear errors.

``resolve_weights`` returns a verified local file: ``weights_path`` if set, else the file in
torch's hub cache (``$TORCH_HOME/hub/checkpoints/<file name>``, where torchvision keeps its
weights too), downloading it there first if needed. Downloads go to a temporary file and are
moved into place only when the sha256 matches (``torch.hub.download_url_to_file``), so a
failed or wrong download leaves nothing that looks valid. Every failure says which file to put
where (or which param to set), in one line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import Field

from dmlbench.errors import DmlbenchError
from dmlbench.models.base import BackboneParams


class WeightsError(DmlbenchError):
    """Pretrained weights are missing, unreachable or do not match their pinned checksum."""


class WeightsParams(BackboneParams):
    """Where a backbone's ImageNet weights come from (used when the protocol has pretrained: true).

    ``weights_sha256``: the full hex digest or a prefix of it (torch hub file names carry one).
    """

    weights_url: str = Field(min_length=1)
    weights_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{8,64}$")
    weights_path: str | None = None  # a local copy of the file: used instead of downloading


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_size), b""):
            digest.update(block)
    return digest.hexdigest()


def hub_checkpoint_path(url: str) -> Path:
    """Where torch.hub (and torchvision) cache the file of ``url``."""
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name


def _how_to_fix(backbone: str, params: WeightsParams, cached: Path) -> str:
    sha = f" (sha256 {params.weights_sha256})" if params.weights_sha256 else ""
    return (
        f"download {params.weights_url}{sha} and put it at {cached} or set backbones.{backbone}.weights_path "
        f"to it (or set the protocol's pretrained: false)"
    )


def _verify(backbone: str, params: WeightsParams, path: Path, cached: Path) -> None:
    if params.weights_sha256 is None:
        return
    actual = sha256_file(path)
    if not actual.startswith(params.weights_sha256):
        raise WeightsError(
            f"backbones.{backbone}: {path} has sha256 {actual}, expected {params.weights_sha256}...; "
            + _how_to_fix(backbone, params, cached)
        )


def resolve_weights(backbone: str, params: WeightsParams) -> Path:
    """A local, checksum-verified copy of the backbone's weights file (downloaded if needed)."""
    import torch

    cached = hub_checkpoint_path(params.weights_url)
    if params.weights_path:
        path = Path(params.weights_path).expanduser()
        if not path.is_file():
            raise WeightsError(
                f"backbones.{backbone}.weights_path: {path} does not exist; " + _how_to_fix(backbone, params, cached)
            )
        _verify(backbone, params, path, cached)
        return path
    if cached.is_file():
        _verify(backbone, params, cached, cached)
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.hub.download_url_to_file(params.weights_url, str(cached), hash_prefix=params.weights_sha256)
    except RuntimeError as exc:  # torch.hub's hash check: the temporary file was removed
        raise WeightsError(
            f"backbones.{backbone}: {params.weights_url} did not match sha256 {params.weights_sha256} ({exc}); "
            + _how_to_fix(backbone, params, cached)
        ) from None
    except OSError as exc:  # URLError, HTTPError, connection refused, DNS failure
        reason = getattr(exc, "reason", None) or exc
        raise WeightsError(
            f"backbones.{backbone}: cannot download {params.weights_url} ({reason}); "
            + _how_to_fix(backbone, params, cached)
        ) from None
    return cached


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
