"""The embedding model shared by every backbone: normalise -> trunk -> pool -> linear -> L2.

Pooling: global average (GAP), global max (GMP), or their sum (GAP+GMP, as Proxy-Anchor's
code does). The linear head maps the trunk's C channels to ``dim`` and is initialised with
Kaiming-normal (fan_out), as in Proxy-Anchor. Outputs have unit L2 norm.

Frozen BatchNorm (Reality Check, thesis): BN layers stay in eval mode (running statistics
are not updated) and their affine parameters get no gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dmlbench.models.base import InputNorm, Normalize, Trunk


class GlobalPool(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        if kind not in {"gap", "gmp", "gap+gmp"}:
            raise ValueError(f"pooling must be gap, gmp or gap+gmp, got {kind!r}")
        self.kind = kind

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        pooled = 0
        if "gap" in self.kind:
            pooled = pooled + features.mean(dim=(2, 3))
        if "gmp" in self.kind:
            pooled = pooled + features.amax(dim=(2, 3))
        return pooled


class EmbeddingModel(nn.Module):
    """Images in [0, 1] (``N x 3 x H x W``) -> unit-norm embeddings (``N x dim``)."""

    def __init__(self, trunk: Trunk, norm: InputNorm, dim: int, pooling: str = "gap", frozen_bn: bool = False):
        super().__init__()
        self.normalize = Normalize(norm)
        self.trunk = trunk.module
        self.pool = GlobalPool(pooling)
        self.head = nn.Linear(trunk.out_channels, dim)
        nn.init.kaiming_normal_(self.head.weight, mode="fan_out")
        nn.init.zeros_(self.head.bias)
        self.frozen_bn = frozen_bn
        if frozen_bn:
            for module in self.batchnorm_layers():
                for parameter in module.parameters():
                    parameter.requires_grad_(False)

    def batchnorm_layers(self) -> list[nn.modules.batchnorm._BatchNorm]:
        return [m for m in self.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    def train(self, mode: bool = True) -> EmbeddingModel:
        super().train(mode)
        if mode and self.frozen_bn:
            for module in self.batchnorm_layers():
                module.eval()
        return self

    def head_parameters(self) -> list[nn.Parameter]:
        """The embedding head: what trains during warm-up epochs (Proxy-Anchor's ``--warm``)."""
        return list(self.head.parameters())

    def trunk_parameters(self) -> list[nn.Parameter]:
        """Trunk parameters that train (frozen BN affine parameters excluded)."""
        frozen = {id(p) for layer in self.batchnorm_layers() for p in layer.parameters()} if self.frozen_bn else set()
        return [p for p in self.trunk.parameters() if id(p) not in frozen]

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Pooled trunk features before the head (the "Pretrained" baseline embedding)."""
        return self.pool(self.trunk(self.normalize(images)))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.features(images)), dim=1)
