"""timm architectures with weights pinned through the weights lock: the modern backbones.

A module per backbone declares its timm model name (architecture + pretrained tag, whose
``pretrained_cfg`` gives mean, std and resize interpolation), the Hub file of its weights
(:class:`HubFile`) and its ``create_model`` keyword arguments; :func:`build_pinned` does the rest.

Weights: ``https://huggingface.co/<repo>/resolve/<revision>/<file>``, downloaded into torch's
hub cache (``$TORCH_HOME/hub/checkpoints/<repo with / as -->--<file>``) and checked against
:mod:`dmlbench.models.weights_lock` (recorded at the first download, with the Hub commit it came
from, read from the ``X-Repo-Commit`` header; later downloads fetch that commit). ``weights_path``
points at a copy elsewhere (never downloaded; checked against the same lock entry). timm loads the
file (``pretrained_cfg_overlay={"file": ...}``) and adapts it to the model built here, e.g.
resamples DINOv2's 37 x 37 position embeddings (518 px) to the protocol's resolution.

Resolution: ViTs are built at 224 px with ``dynamic_img_size=True``, so they take whatever
``augment.crop_size`` the protocol sets (position embeddings interpolated per forward when it is
not 224), never timm's 518 px default for DINOv2; ``dynamic_img_pad=True`` pads a crop that is not a
multiple of the patch size (DINOv2's 14 px) up to one instead of refusing it (224 px needs none).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dmlbench.errors import ConfigError
from dmlbench.models.base import BackboneParams, Trunk, WeightsFile
from dmlbench.models.timm_models import timm_trunk
from dmlbench.models.weights import OFFLINE_FIX, WeightsError, offline
from dmlbench.models.weights_lock import locked, verify_or_record

HUB = "https://huggingface.co"
COMMIT_HEADER = "X-Repo-Commit"  # the Hub's answer names the commit a "main" URL resolves to
HEAD_TIMEOUT = 10.0  # s
VIT_KWARGS: dict[str, Any] = {"img_size": 224, "dynamic_img_size": True, "dynamic_img_pad": True}
CNN_KWARGS: dict[str, Any] = {}


@dataclass(frozen=True)
class HubFile:
    """A weights file on the Hugging Face Hub: ``repo`` (e.g. ``timm/vit_small_patch14_dinov2.lvd142m``)."""

    repo: str
    filename: str = "model.safetensors"

    @property
    def name(self) -> str:
        """Its key in the weights lock."""
        return f"{self.repo}/{self.filename}"

    def url(self, revision: str = "main") -> str:
        return f"{HUB}/{self.repo}/resolve/{revision}/{self.filename}"

    def cache_path(self) -> Path:
        import torch

        return Path(torch.hub.get_dir()) / "checkpoints" / f"{self.repo.replace('/', '--')}--{self.filename}"


class PinnedTimmParams(BackboneParams):
    """``weights_path``: a copy of the Hub file (used instead of downloading; checked against the lock)."""

    HUB_FILE: ClassVar[HubFile | None] = None
    weights_path: str | None = None

    def weights_files(self, backbone: str) -> list[WeightsFile]:
        hub = self.HUB_FILE
        if hub is None:
            return []
        entry = locked(hub.name)
        sha = entry.sha256 if entry else None
        if self.weights_path:
            return [WeightsFile(backbone, Path(self.weights_path).expanduser(), sha256=sha, local_only=True)]
        return [WeightsFile(backbone, hub.cache_path(), hub.url(entry.revision if entry else "main"), sha)]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        return None  # the Hub's first answer carries the commit; the CDN's does not


def hub_commit(url: str, timeout: float = HEAD_TIMEOUT) -> str | None:
    """The Hub commit ``url`` resolves to (its ``X-Repo-Commit`` header), or None when unknown."""
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, method="HEAD"), timeout=timeout) as response:
            return response.headers.get(COMMIT_HEADER)
    except urllib.error.HTTPError as exc:  # a 302 to the CDN lands here, headers included
        exc.close()
        return exc.headers.get(COMMIT_HEADER) if exc.headers else None
    except (OSError, ValueError):
        return None


def fetch_hint(backbone: str, url: str, target: Path) -> str:
    return (
        f"download {url} and put it at {target}, or set backbones.{backbone}.weights_path to a copy "
        "(or set the protocol's pretrained: false)"
    )


def pinned_weights(backbone: str, params: PinnedTimmParams) -> Path:
    """A local copy of the backbone's Hub file whose sha256 is the lock's (recorded on first use)."""
    import torch

    hub = params.HUB_FILE
    if hub is None:
        raise ConfigError(f"backbones.{backbone}: has no pretrained weights; set the protocol's pretrained: false")
    entry = locked(hub.name)
    revision = entry.revision if entry else "main"
    url = hub.url(revision)
    if params.weights_path:
        path = Path(params.weights_path).expanduser()
        if not path.is_file():
            raise WeightsError(
                f"backbones.{backbone}.weights_path: {path} does not exist; " + fetch_hint(backbone, url, path)
            )
    else:
        path = hub.cache_path()
        if not path.is_file():
            if offline():
                raise WeightsError(
                    f"backbones.{backbone}: {hub.filename} of {hub.repo} is not at {path}; {OFFLINE_FIX}, or "
                    + fetch_hint(backbone, url, path)
                )
            if entry is None:  # first download: pin the commit "main" points at now
                revision = hub_commit(url) or revision
                url = hub.url(revision)
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                torch.hub.download_url_to_file(url, str(path), progress=False)
            except OSError as exc:  # no network, DNS, HTTP error
                reason = getattr(exc, "reason", None) or exc
                raise WeightsError(
                    f"backbones.{backbone}: {hub.filename} of {hub.repo} is not at {path} and cannot be "
                    f"downloaded ({reason}); " + fetch_hint(backbone, url, path)
                ) from None
    verify_or_record(backbone, hub.name, path, url, revision)
    return path


def build_pinned(
    backbone: str, model_name: str, kwargs: dict[str, Any], params: BackboneParams, pretrained: bool
) -> Trunk:
    """``timm.create_model(model_name, num_classes=0, global_pool="", **kwargs)`` as a trunk, with the
    locked weights when ``pretrained``."""
    import timm

    if not isinstance(params, PinnedTimmParams):
        raise TypeError(f"backbones.{backbone}: expected PinnedTimmParams, got {type(params).__name__}")
    overlay = {"file": str(pinned_weights(backbone, params))} if pretrained else None
    try:
        net = timm.create_model(
            model_name, pretrained=pretrained, num_classes=0, global_pool="", pretrained_cfg_overlay=overlay, **kwargs
        )
    except Exception as exc:  # noqa: BLE001 - any reader's error means: a file that is not these weights
        if not pretrained:
            raise
        raise WeightsError(
            f"backbones.{backbone}: {overlay and overlay['file']} does not load into timm {model_name} "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    return timm_trunk(net)
