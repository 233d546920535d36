"""GoogLeNet (Inception v1, Szegedy et al., CVPR 2015) from torchvision; trunk = everything up
to ``inception5b`` (1024 channels), without the auxiliary classifiers, pooling and ``fc``.

ImageNet weights: torchvision's ``GoogLeNet_Weights.IMAGENET1K_V1`` (``googlenet-1378be20.pth``,
a port of TensorFlow weights with batch norm). As torchvision does for these weights,
``transform_input`` maps the ImageNet-normalised input to the (x - 0.5) / 0.5 range they were
trained on (the Proxy-Anchor code skips this step).
"""

from __future__ import annotations

import torch
from torch import nn

from dmlbench.models.base import BackboneSpec, InputNorm, Trunk
from dmlbench.models.weights import WeightsParams, load_into, load_state_dict, resolve_weights

IMAGENET1K_V1_URL = "https://download.pytorch.org/models/googlenet-1378be20.pth"
LAYERS = (
    "conv1",
    "maxpool1",
    "conv2",
    "conv3",
    "maxpool2",
    "inception3a",
    "inception3b",
    "maxpool3",
    "inception4a",
    "inception4b",
    "inception4c",
    "inception4d",
    "inception4e",
    "maxpool4",
    "inception5a",
    "inception5b",
)


class GoogLeNetParams(WeightsParams):
    weights_url: str = IMAGENET1K_V1_URL
    weights_sha256: str | None = "1378be20"  # torch hub file-name hash prefix


class GoogLeNetTrunk(nn.Module):
    """torchvision's GoogLeNet without its head; returns the ``inception5b`` feature map."""

    def __init__(self, net: nn.Module):
        super().__init__()
        for name in LAYERS:
            self.add_module(name, getattr(net, name))
        self.transform_input = net.transform_input
        # ImageNet-normalised -> (x - 0.5) / 0.5, per channel (torchvision's GoogLeNet._transform_input)
        self.register_buffer("input_scale", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) / 0.5, False)
        self.register_buffer("input_shift", (torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) - 0.5) / 0.5, False)

    def forward(self, images):
        x = images * self.input_scale + self.input_shift if self.transform_input else images
        for name in LAYERS:
            x = getattr(self, name)(x)
        return x


def build(params: GoogLeNetParams, pretrained: bool) -> Trunk:
    from torchvision.models import googlenet

    net = googlenet(weights=None, aux_logits=pretrained, transform_input=pretrained, init_weights=not pretrained)
    if pretrained:
        path = resolve_weights("googlenet", params)
        load_into("googlenet", net, load_state_dict("googlenet", path), path)
    return Trunk(GoogLeNetTrunk(net), 1024)


SPEC = BackboneSpec(
    name="googlenet",
    params=GoogLeNetParams,
    build=build,
    input_norm=InputNorm(),
    description="GoogLeNet (Inception v1 with BN), torchvision, ImageNet IMAGENET1K_V1 weights",
)
