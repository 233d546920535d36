"""A tiny CPU-friendly convolutional trunk for the offline demo and tests.

Four stages of conv3x3-BN-ReLU with ``width x (1, 2, 4, 8)`` channels and 2x2 max-pooling
between them: at 32 px, ~0.4 M parameters and ~1,500 training images/s on 2 CPU cores.
No pretrained weights exist for it.
"""

from __future__ import annotations

from pydantic import Field
from torch import nn

from dmlbench.errors import ConfigError
from dmlbench.models.base import BackboneParams, BackboneSpec, InputNorm, Trunk


class TinyCNNParams(BackboneParams):
    width: int = Field(32, ge=4, le=256)


def _conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


def build(params: TinyCNNParams, pretrained: bool) -> Trunk:
    if pretrained:
        raise ConfigError("backbones.tiny_cnn: has no pretrained weights; set the protocol's pretrained: false")
    widths = [params.width * m for m in (1, 2, 4, 8)]
    layers: list[nn.Module] = []
    cin = 3
    for index, cout in enumerate(widths):
        if index:
            layers.append(nn.MaxPool2d(2))
        layers.append(_conv(cin, cout))
        cin = cout
    trunk = nn.Sequential(*layers)
    for module in trunk.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    return Trunk(trunk, widths[-1])


SPEC = BackboneSpec(
    name="tiny_cnn",
    params=TinyCNNParams,
    build=build,
    input_norm=InputNorm(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)),
    description="4-stage conv net for CPU demos (no pretrained weights)",
)
