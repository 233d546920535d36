"""The embedding model shared by every backbone: normalise -> trunk -> pool -> linear -> L2.

Pooling: global average (GAP), global max (GMP), or their sum (GAP+GMP, as Proxy-Anchor's
code does); on a transformer these pool the patch tokens (timm's ``global_pool="avg"`` for GAP).
``cls``: the class token of a transformer, as DINO (Caron et al., ICCV 2021, ``eval_knn.py`` uses
the CLS output), DINOv2 (Oquab et al., TMLR 2024) and CLIP (Radford et al., ICML 2021) embed images,
and as Hyp-ViT (Ermolov et al., CVPR 2022, github.com/htdt/hyp_metric ``train.py``) fine-tunes them.
``native``: the trunk's own pooling, as its weights' authors embed (timm's ``global_pool`` of the
model: CLS for DINO/DINOv2/DINOv3/CLIP, attention pooling for SigLIP 2, average for ConvNeXt and
ResNets; GAP for the trunks built here). timm trunks pool themselves, through timm's pre-logits
path set to the protocol's pooling (:mod:`dmlbench.models.timm_models`: the head's norm included).
The linear head maps the trunk's C channels to ``dim`` and is initialised with Kaiming-normal
(fan_out), as in Proxy-Anchor. Outputs have unit L2 norm.

Frozen BatchNorm (Reality Check, thesis): BN layers stay in eval mode (running statistics
are not updated) and their affine parameters get no gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dmlbench.models.base import InputNorm, Normalize, Trunk

POOLINGS = ("gap", "gmp", "gap+gmp", "cls", "native")


class GlobalPool(nn.Module):
    """Pools an N x C x h x w map (``prefix_tokens`` > 0: N x C x (prefix + L) x 1 tokens) to N x C."""

    def __init__(self, kind: str, prefix_tokens: int = 0, cls_token: bool = False):
        super().__init__()
        kind = "gap" if kind == "native" else kind  # the pooling of the ImageNet classifiers built here
        if kind not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {kind!r}")
        if kind == "cls" and not cls_token:
            raise ValueError("pooling cls needs a trunk with a class token (a ViT such as DINO, DINOv2, CLIP)")
        self.kind, self.prefix_tokens = kind, prefix_tokens

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.kind == "cls":
            return features[:, :, 0, 0]
        if self.prefix_tokens:
            features = features[:, :, self.prefix_tokens :]
        pooled = 0
        if "gap" in self.kind:
            pooled = pooled + features.mean(dim=(2, 3))
        if "gmp" in self.kind:
            pooled = pooled + features.amax(dim=(2, 3))
        return pooled


class PooledByTrunk(nn.Identity):
    """The pooling of a trunk that pools itself (timm's pre-logits path, set to ``kind``)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind


class EmbeddingModel(nn.Module):
    """Images in [0, 1] (``N x 3 x H x W``) -> unit-norm embeddings (``N x dim``)."""

    def __init__(self, trunk: Trunk, norm: InputNorm, dim: int, pooling: str = "gap", frozen_bn: bool = False):
        super().__init__()
        self.normalize = Normalize(norm)
        self.trunk = trunk.module
        if trunk.set_pooling is not None:  # timm: the trunk's own pooling, set to ``pooling`` by build_model
            self.pool: nn.Module = PooledByTrunk(pooling)
        else:
            self.pool = GlobalPool(pooling, trunk.prefix_tokens, trunk.cls_token)
        self.interpolation = trunk.interpolation  # the transforms' resize kernel (data/augment.py)
        self.layer_groups = trunk.layer_groups
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

    def trunk_parameters(self) -> list[nn.Parameter]:
        """Trunk parameters that train (frozen BN affine parameters excluded)."""
        frozen = {id(p) for layer in self.batchnorm_layers() for p in layer.parameters()} if self.frozen_bn else set()
        return [p for p in self.trunk.parameters() if id(p) not in frozen]

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Pooled trunk features before the head (the "Pretrained" baseline embedding)."""
        return self.pool(self.trunk(self.normalize(images)))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.features(images)), dim=1)
