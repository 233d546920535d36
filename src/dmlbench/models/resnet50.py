"""ResNet-50 (He et al., CVPR 2016) from torchvision; trunk = everything before the global
pooling (``conv1`` ... ``layer4``), 2048 channels at stride 32.

ImageNet weights: torchvision's ``ResNet50_Weights.IMAGENET1K_V1`` (the original
``resnet50-0676ba61.pth`` that DML papers use, not V2), fetched through
:mod:`dmlbench.models.weights` (pinned sha256 prefix, local-path override). Input: RGB in [0, 1]
normalised with the ImageNet mean/std.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from dmlbench.models.base import BackboneSpec, InputNorm, Trunk
from dmlbench.models.weights import WeightsParams, load_into, load_state_dict, resolve_weights

IMAGENET1K_V1_URL = "https://download.pytorch.org/models/resnet50-0676ba61.pth"


class ResNet50Params(WeightsParams):
    weights_url: str = IMAGENET1K_V1_URL
    weights_sha256: str | None = "0676ba61"  # torch hub file-name hash prefix


def build(params: ResNet50Params, pretrained: bool) -> Trunk:
    from torchvision.models import resnet50

    net = resnet50(weights=None)
    if pretrained:
        path = resolve_weights("resnet50", params)
        load_into("resnet50", net, load_state_dict("resnet50", path), path)
    names = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")
    return Trunk(nn.Sequential(OrderedDict((name, getattr(net, name)) for name in names)), 2048)


SPEC = BackboneSpec(
    name="resnet50",
    params=ResNet50Params,
    build=build,
    input_norm=InputNorm(),
    description="ResNet-50, torchvision, ImageNet IMAGENET1K_V1 weights",
)
