"""EfficientNet-Lite0 with the real ImageNet weights of the pinned wheel, on the CPU: loading
(``weights_only``), the key mapping onto timm's ``tf_efficientnet_lite0``, the pinned sha256,
the one-line refusals, the frozen-trunk features and a fine-tuning step.

The mapping is checked against an independent forward pass written here from the TensorFlow
block arguments and the file's own tensor names (no timm, no mapping): a layer mapped to the wrong
place, a wrong padding or BatchNorm epsilon changes its logits. Against the model-code package
``efficientnet-lite-pytorch`` only when it is importable (it is not a dependency)."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dmlbench.errors import WeightsError
from dmlbench.models import BACKBONES, build_model
from dmlbench.models import efficientnet_lite0 as lite0
from dmlbench.models.base import Normalize
from dmlbench.models.weights import load_state_dict, sha256_file, weights_file_problem

NAME = "efficientnet_lite0"
DAISY, PALACE, MILITARY_UNIFORM = 985, 698, 652  # ImageNet-1k class indices

# TF efficientnet_lite_builder / efficientnet_builder block args of Lite0:
# (repeats, kernel, first stride, expand ratio) per stage.
LITE0_STAGES = ((1, 3, 1, 1), (2, 3, 2, 6), (2, 5, 2, 6), (3, 3, 2, 6), (3, 5, 1, 6), (4, 5, 2, 6), (1, 3, 1, 6))


@pytest.fixture(scope="module")
def weights_path():
    return lite0.verified_weights(NAME, lite0.EfficientNetLite0Params())


@pytest.fixture(scope="module")
def file_state(weights_path):
    return load_state_dict(NAME, weights_path)


@pytest.fixture(scope="module")
def classifier():
    """The whole 1000-class network with the file's weights, in eval mode (to check them against labels)."""
    import timm

    net = timm.create_model(lite0.ARCHITECTURE, pretrained=False, num_classes=1000)
    lite0.load_weights(NAME, net, lite0.EfficientNetLite0Params())
    return net.eval()


class _Reads(dict):
    """A state dict that records which keys were read."""

    def __init__(self, state):
        super().__init__(state)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def _same_conv(x: torch.Tensor, weight: torch.Tensor, stride: int, groups: int = 1) -> torch.Tensor:
    """TensorFlow "SAME" convolution: output ceil(size / stride), the odd pad pixel at the end."""
    pads = []
    for size in (x.shape[-1], x.shape[-2]):  # F.pad: last dimension first
        total = max((math.ceil(size / stride) - 1) * stride + weight.shape[-1] - size, 0)
        pads += [total // 2, total - total // 2]
    return F.conv2d(F.pad(x, pads), weight, stride=stride, groups=groups)


def _bn(x: torch.Tensor, s: dict, name: str) -> torch.Tensor:
    return F.batch_norm(
        x, s[f"{name}.running_mean"], s[f"{name}.running_var"], s[f"{name}.weight"], s[f"{name}.bias"], False, 0.0, 1e-3
    )


def hand_written_lite0(s: dict, x: torch.Tensor) -> torch.Tensor:
    """EfficientNet-Lite0 logits from the file's tensors under their own names (ReLU6, no SE)."""
    x = F.relu6(_bn(_same_conv(x, s["_conv_stem.weight"], 2), s, "_bn0"))
    index = 0
    for repeats, kernel, stride, expand in LITE0_STAGES:
        for repeat in range(repeats):
            p = f"_blocks.{index}"
            h = x
            if expand != 1:
                h = F.relu6(_bn(_same_conv(h, s[f"{p}._expand_conv.weight"], 1), s, f"{p}._bn0"))
            dw = s[f"{p}._depthwise_conv.weight"]
            assert dw.shape[-1] == kernel
            h = F.relu6(_bn(_same_conv(h, dw, stride if repeat == 0 else 1, groups=dw.shape[0]), s, f"{p}._bn1"))
            h = _bn(_same_conv(h, s[f"{p}._project_conv.weight"], 1), s, f"{p}._bn2")
            x = x + h if repeat > 0 else h  # identity skip: stride 1 and same width (every repeat after the first)
            index += 1
    x = F.relu6(_bn(_same_conv(x, s["_conv_head.weight"], 1), s, "_bn1"))
    return F.linear(x.mean((2, 3)), s["_fc.weight"], s["_fc.bias"])


def _photo(name: str) -> torch.Tensor:
    """A photo shipped with matplotlib / scikit-learn, as TF's eval preprocessing makes it: centre
    crop of 0.875 of the short side, bicubic resize to 224; RGB in [0, 1], 3 x 224 x 224."""
    from PIL import Image

    if name == "grace_hopper.jpg":
        import matplotlib.cbook

        path = matplotlib.cbook.get_sample_data(name, asfileobj=False)
    else:
        import sklearn.datasets

        path = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images", name)
    image = Image.open(path).convert("RGB")
    width, height = image.size
    crop = int(lite0.CROP_FRACTION * min(width, height))
    top, left = (height - crop + 1) // 2, (width - crop + 1) // 2
    image = image.crop((left, top, left + crop, top + crop)).resize((lite0.RESOLUTION,) * 2, Image.BICUBIC)
    return torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1) / 255.0


def test_the_pinned_file_is_the_installed_wheels_and_loads_with_weights_only(weights_path, monkeypatch):
    assert weights_path.name == lite0.FILE_NAME and weights_path.parent.parent.name == lite0.PACKAGE
    assert sha256_file(weights_path) == lite0.SHA256 and lite0.SHA256.startswith(lite0.FILE_NAME.split("-")[-1][:8])
    seen = []
    real_load = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    BACKBONES[NAME].build(BACKBONES[NAME].params(), True)
    assert seen == [True]


def test_key_mapping_is_complete_one_to_one_and_loads_every_tensor_as_it_is(file_state, classifier):
    mapped = {key: lite0.timm_key(key) for key in file_state}
    assert None not in mapped.values()
    assert len(set(mapped.values())) == len(mapped) == 296  # one to one
    loaded = classifier.state_dict()
    assert set(mapped.values()) == set(loaded)  # every tensor of timm's model comes from the file
    for key, name in mapped.items():
        assert torch.equal(loaded[name], file_state[key]), (key, name)
    # the layer-by-place rule: in the first block (no expansion) _bn1 follows the depthwise conv ...
    assert lite0.timm_key("_blocks.0._bn1.running_var") == "blocks.0.0.bn1.running_var"
    # ... in the others _bn0 follows the expansion, _bn1 the depthwise conv; block 15 is the last stage's
    assert lite0.timm_key("_blocks.4._bn1.weight") == "blocks.2.1.bn2.weight"
    assert lite0.timm_key("_blocks.15._project_conv.weight") == "blocks.6.0.conv_pwl.weight"
    assert lite0.timm_key("_blocks.16._bn0.weight") is None and lite0.timm_key("_fc.weight") == "classifier.weight"


def test_an_unmapped_key_or_a_shape_mismatch_is_refused_in_one_line(file_state, weights_path):
    import timm

    reference = timm.create_model(lite0.ARCHITECTURE, num_classes=1000).state_dict()
    extra = {**file_state, "_blocks.0._se_reduce.weight": torch.zeros(8, 32, 1, 1)}
    with pytest.raises(WeightsError, match=r"has tensor '_blocks.0._se_reduce.weight', which no layer") as error:
        lite0.map_state_dict(NAME, extra, reference, weights_path)
    assert "\n" not in str(error.value)
    wrong = {**file_state, "_blocks.3._depthwise_conv.weight": torch.zeros(144, 1, 3, 3)}
    with pytest.raises(
        WeightsError,
        match=r"_blocks.3._depthwise_conv.weight -> blocks.2.0.conv_dw.weight has shape "
        r"\(144, 1, 3, 3\), expected \(144, 1, 5, 5\)",
    ) as error:
        lite0.map_state_dict(NAME, wrong, reference, weights_path)
    assert "\n" not in str(error.value)


def test_mapped_timm_model_gives_the_logits_of_a_hand_written_forward_of_the_file(file_state, classifier):
    """Seeded noise and a photo: same logits (to float rounding), same top-1. timm's symmetric-padding
    ``efficientnet_lite0`` with the same tensors does not pass: the check can fail."""
    torch.manual_seed(0)
    images = torch.cat([torch.rand(3, 3, 224, 224) * 2 - 1, ((_photo("flower.jpg") * 255 - 127) / 128)[None]])
    reads = _Reads(file_state)
    with torch.no_grad():
        expected = hand_written_lite0(reads, images)
        logits = classifier(images)
    assert reads.read == {k for k in file_state if not k.endswith("num_batches_tracked")}  # every tensor used
    assert (logits - expected).abs().max() < 1e-3
    assert torch.equal(logits.argmax(1), expected.argmax(1))

    import timm

    symmetric = timm.create_model("efficientnet_lite0", num_classes=1000).eval()
    symmetric.load_state_dict(classifier.state_dict())
    with torch.no_grad():
        assert (symmetric(images) - expected).abs().max() > 0.5


def test_real_photos_get_their_imagenet_labels_with_the_weights_preprocessing(classifier):
    """The backbone's own normalisation ((x * 255 - 127) / 128) on TF-preprocessed photos; a random
    init puts ~0.02 on its top class, the weights 0.2-0.3 on the right one."""
    photos = torch.stack([_photo(name) for name in ("flower.jpg", "china.jpg", "grace_hopper.jpg")])
    with torch.no_grad():
        probabilities = classifier(Normalize(BACKBONES[NAME].input_norm)(photos)).softmax(1)
    top = probabilities.argmax(1).tolist()
    assert top[:2] == [DAISY, PALACE] and probabilities[0, DAISY] > 0.25
    assert MILITARY_UNIFORM in probabilities[2].topk(3).indices.tolist()


def test_reference_implementation_gives_the_same_logits_when_importable(weights_path, classifier):
    """``pip install --no-deps --target DIR efficientnet-lite-pytorch`` and PYTHONPATH=DIR to run it."""
    reference_package = pytest.importorskip("efficientnet_lite_pytorch")
    reference = reference_package.EfficientNet.from_pretrained("efficientnet-lite0", weights_path=str(weights_path))
    torch.manual_seed(1)
    images = torch.cat([torch.rand(2, 3, 224, 224) * 2 - 1, ((_photo("china.jpg") * 255 - 127) / 128)[None]])
    with torch.no_grad():
        expected, logits = reference.eval()(images), classifier(images)
    assert (logits - expected).abs().max() < 1e-4
    assert torch.equal(logits.argmax(1), expected.argmax(1))


def test_a_wrong_sha256_is_refused_in_one_line():
    params = BACKBONES[NAME].params(weights_sha256="0" * 64)
    with pytest.raises(WeightsError, match=rf"has sha256 {lite0.SHA256}, expected 0{{64}}.*{lite0.INSTALL}") as error:
        BACKBONES[NAME].build(params, True)
    assert "\n" not in str(error.value)


def test_a_copy_is_verified_on_every_load_and_refused_once_changed(tmp_path, weights_path):
    copy = tmp_path / lite0.FILE_NAME
    shutil.copyfile(weights_path, copy)
    params = BACKBONES[NAME].params(weights_path=str(copy))
    assert BACKBONES[NAME].build(params, True).out_channels == 1280
    with open(copy, "r+b") as handle:  # one byte of a tensor changed: still a loadable file
        handle.seek(copy.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 1]))
    changed = rf"{NAME}: .*{lite0.FILE_NAME} has sha256 [0-9a-f]{{64}}, expected {lite0.SHA256}"
    with pytest.raises(WeightsError, match=changed) as error:
        BACKBONES[NAME].build(params, True)
    assert "\n" not in str(error.value)


def test_a_missing_file_names_the_package_to_install_and_where(tmp_path, monkeypatch):
    expected_at = tmp_path / "site-packages" / lite0.PACKAGE / "models" / lite0.FILE_NAME
    monkeypatch.setattr(lite0, "installed_weights_path", lambda: expected_at)
    with pytest.raises(WeightsError) as error:
        BACKBONES[NAME].build(BACKBONES[NAME].params(), True)
    message = str(error.value)
    assert f"{lite0.FILE_NAME} is not at {expected_at}" in message and f"`{lite0.INSTALL}`" in message
    assert "\n" not in message
    (file,) = BACKBONES[NAME].params().weights_files(NAME)
    assert weights_file_problem(file, timeout=0.01) == message  # the pre-flight says the same, without network
    missing_copy = BACKBONES[NAME].params(weights_path=str(tmp_path / "copy.pth"))
    with pytest.raises(WeightsError, match=r"weights_path: .*copy.pth does not exist; put the file at"):
        BACKBONES[NAME].build(missing_copy, True)
    assert BACKBONES[NAME].build(BACKBONES[NAME].params(), False).out_channels == 1280  # random init needs no file


def _two_views(name: str, side: int = 64) -> np.ndarray:
    """Two uint8 ``side x side x 3`` crops of one photo (left and right parts), as the cache holds images."""
    from PIL import Image

    photo = (_photo(name).permute(1, 2, 0).numpy() * 255).astype(np.uint8)
    views = [photo[16:208, 0:192], photo[16:208, 32:224]]
    return np.stack([np.asarray(Image.fromarray(v).resize((side, side), Image.BILINEAR)) for v in views])


def test_frozen_trunk_features_with_the_real_weights_on_cpu():
    """The "Pretrained" row's path (``compute_embeddings(features=True)``): 1280 pooled channels;
    two views of one photo are each other's nearest neighbour."""
    from dmlbench.evaluate.embed import compute_embeddings

    torch.manual_seed(0)
    model = build_model(NAME, BACKBONES[NAME].params(), dim=1, pooling="gap", pretrained=True, frozen_bn=True)
    images = np.concatenate([_two_views(name) for name in ("flower.jpg", "china.jpg", "grace_hopper.jpg")])
    features = compute_embeddings(model, images, eval_resize=64, crop_size=56, batch_size=4, features=True)
    assert features.shape == (6, 1280) and np.isfinite(features).all()
    unit = features / np.linalg.norm(features, axis=1, keepdims=True)
    similarity = unit @ unit.T - 2 * np.eye(6)
    assert similarity.argmax(1).tolist() == [1, 0, 3, 2, 5, 4]


def test_one_fine_tuning_step_with_the_real_weights_on_cpu():
    """Forward, backward, one AdamW step at 64 px: head and trunk move, frozen BN statistics do not."""
    torch.manual_seed(0)
    model = build_model(NAME, BACKBONES[NAME].params(), dim=16, pooling="gap+gmp", pretrained=True, frozen_bn=True)
    model.train()
    bn = model.batchnorm_layers()
    stats = [layer.running_mean.clone() for layer in bn]
    conv = model.trunk.net.conv_stem.weight
    before = conv.detach().clone(), model.head.weight.detach().clone()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    out = model(torch.rand(4, 3, 64, 64))
    assert out.shape == (4, 16)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(4))
    loss = (out[:2] * out[2:]).sum().neg()
    assert torch.isfinite(loss)
    loss.backward()
    optimizer.step()
    assert not torch.equal(conv, before[0]) and not torch.equal(model.head.weight, before[1])
    assert all(torch.equal(layer.running_mean, stat) for layer, stat in zip(bn, stats, strict=True))
    assert all(not layer.training and layer.weight.grad is None for layer in bn)
