"""BN-Inception (Ioffe & Szegedy, ICML 2015), the Caffe port that DML papers use (Cadene's
``pretrainedmodels.bninception``, copied into the Proxy-NCA, Proxy-Anchor and thesis code).

Same module names as that port, so its ImageNet weights load as they are:
``http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth``, sha256
``52deb473...dd2353`` (full digest as verified in CausalityHQ/sfora; its prefix is the
``52deb4733`` of the file name). That file stores BN parameters as 1 x C; they are squeezed as
the Proxy-Anchor code does. Input: BGR, 0-255, minus mean (104, 117, 128), std 1. BN layers keep
the port's ``momentum=0.9`` (PyTorch semantics: 90% of each batch's statistics), which matters
only when BN is not frozen. Trunk output: ``inception_5b`` (1024 channels, stride 32), no pooling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dmlbench.models.base import BackboneSpec, InputNorm, Trunk
from dmlbench.models.weights import WeightsParams, load_into, load_state_dict, resolve_weights

CADENE_URL = "http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth"
CADENE_SHA256 = "52deb473314542a5c2f87e9e6f26f4ca42fe863d15f986414dbae8c2dfdd2353"

# name, in, 1x1, 3x3 reduce, 3x3, double 3x3 reduce, double 3x3, pool, pool projection.
# 1x1 == 0: a grid-reduction block (3x3 convs at stride 2, max-pool branch without projection).
BLOCKS = (
    ("3a", 192, 64, 64, 64, 64, 96, "avg", 32),
    ("3b", 256, 64, 64, 96, 64, 96, "avg", 64),
    ("3c", 320, 0, 128, 160, 64, 96, "max", 0),
    ("4a", 576, 224, 64, 96, 96, 128, "avg", 128),
    ("4b", 576, 192, 96, 128, 96, 128, "avg", 128),
    ("4c", 576, 160, 128, 160, 128, 160, "avg", 128),
    ("4d", 608, 96, 128, 192, 160, 192, "avg", 128),
    ("4e", 608, 0, 128, 192, 192, 256, "max", 0),
    ("5a", 1056, 352, 192, 320, 160, 224, "avg", 128),
    ("5b", 1024, 352, 192, 320, 192, 224, "max", 128),
)


class BNInceptionParams(WeightsParams):
    weights_url: str = CADENE_URL
    weights_sha256: str | None = CADENE_SHA256


class BNInception(nn.Module):
    """The port's layers (conv -> BN -> ReLU units named ``<unit>`` and ``<unit>_bn``)."""

    def __init__(self):
        super().__init__()
        self._unit("conv1_7x7_s2", 3, 64, 7, stride=2, padding=3)
        self._unit("conv2_3x3_reduce", 64, 64, 1)
        self._unit("conv2_3x3", 64, 192, 3, padding=1)
        for name, cin, c1, c3r, c3, cdr, cd, _pool, proj in BLOCKS:
            prefix, stride = f"inception_{name}", 1 if c1 else 2
            if c1:
                self._unit(f"{prefix}_1x1", cin, c1, 1)
            self._unit(f"{prefix}_3x3_reduce", cin, c3r, 1)
            self._unit(f"{prefix}_3x3", c3r, c3, 3, stride=stride, padding=1)
            self._unit(f"{prefix}_double_3x3_reduce", cin, cdr, 1)
            self._unit(f"{prefix}_double_3x3_1", cdr, cd, 3, padding=1)
            self._unit(f"{prefix}_double_3x3_2", cd, cd, 3, stride=stride, padding=1)
            if proj:
                self._unit(f"{prefix}_pool_proj", cin, proj, 1)

    def _unit(self, name: str, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0) -> None:
        self.add_module(name, nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding))
        self.add_module(f"{name}_bn", nn.BatchNorm2d(cout, eps=1e-5, momentum=0.9))

    def _run(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return F.relu(getattr(self, f"{name}_bn")(getattr(self, name)(x)), inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self._run("conv1_7x7_s2", x), 3, stride=2, ceil_mode=True)
        x = self._run("conv2_3x3", self._run("conv2_3x3_reduce", x))
        x = F.max_pool2d(x, 3, stride=2, ceil_mode=True)
        for name, _, c1, *_, pool, _proj in BLOCKS:
            p = f"inception_{name}"
            branches = [self._run(f"{p}_1x1", x)] if c1 else []
            branches.append(self._run(f"{p}_3x3", self._run(f"{p}_3x3_reduce", x)))
            double = self._run(f"{p}_double_3x3_1", self._run(f"{p}_double_3x3_reduce", x))
            branches.append(self._run(f"{p}_double_3x3_2", double))
            if not c1:  # grid reduction: 3x3 max-pool at stride 2, no projection
                branches.append(F.max_pool2d(x, 3, stride=2, ceil_mode=True))
            elif pool == "avg":
                pooled = F.avg_pool2d(x, 3, stride=1, padding=1, ceil_mode=True, count_include_pad=True)
                branches.append(self._run(f"{p}_pool_proj", pooled))
            else:
                branches.append(self._run(f"{p}_pool_proj", F.max_pool2d(x, 3, stride=1, padding=1, ceil_mode=True)))
            x = torch.cat(branches, 1)
        return x


def caffe_port_state_dict(state: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict:
    """The port's file stores BN tensors as 1 x C: squeeze them to the module's shapes."""
    fixed = {}
    for key, value in state.items():
        target = reference.get(key)
        if target is not None and value.dim() == target.dim() + 1 and value.shape[0] == 1:
            value = value.squeeze(0)
        fixed[key] = value
    return fixed


def build(params: BNInceptionParams, pretrained: bool) -> Trunk:
    net = BNInception()
    if pretrained:
        path = resolve_weights("bn_inception", params)
        state = caffe_port_state_dict(load_state_dict("bn_inception", path), net.state_dict())
        load_into("bn_inception", net, state, path, ignore_prefixes=("last_linear.",))
    return Trunk(net, 1024)


SPEC = BackboneSpec(
    name="bn_inception",
    params=BNInceptionParams,
    build=build,
    input_norm=InputNorm(mean=(104.0, 117.0, 128.0), std=(1.0, 1.0, 1.0), scale=255.0, bgr=True),
    description="BN-Inception, Caffe port (Cadene pretrainedmodels), ImageNet weights",
)
