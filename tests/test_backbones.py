"""Backbones: the ImageNet trunks build and train a step on CPU, and their weights load from a
pinned URL (served here by a local HTTP server), a local file, or fail with a message that says
which file to provide."""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
from pathlib import Path

import pytest
import torch

from dmlbench.errors import ConfigError, WeightsError
from dmlbench.models import BACKBONES, build_model
from dmlbench.models.bn_inception import BNInception
from dmlbench.models.weights import hub_checkpoint_path


@pytest.fixture
def http_root(tmp_path):
    """A local HTTP server on 127.0.0.1 serving ``root``: yields (root, base_url)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(("name", "channels"), [("resnet50", 2048), ("googlenet", 1024), ("bn_inception", 1024)])
def test_imagenet_trunks_run_a_training_step_on_cpu(name, channels):
    """Forward + backward + one AdamW step at 64 px: trunk feature maps, unit-norm embeddings."""
    torch.manual_seed(0)
    spec = BACKBONES[name]
    trunk = spec.build(spec.params(), False)
    assert trunk.out_channels == channels
    feature_map = trunk.module.eval()(torch.rand(1, 3, 64, 64))
    assert feature_map.dim() == 4 and feature_map.shape[1] == channels  # no pooling, no classifier

    model = build_model(name, spec.params(), dim=32, pooling="gap+gmp", frozen_bn=True).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    images = torch.rand(4, 3, 64, 64)
    before = model.head.weight.detach().clone()
    out = model(images)
    assert out.shape == (4, 32)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(4))
    (out[:2] * out[2:]).sum().neg().backward()
    optimizer.step()
    assert not torch.equal(model.head.weight, before)
    bn = model.batchnorm_layers()
    assert bn and all(not layer.training and layer.weight.grad is None for layer in bn)


def test_torchvision_weight_urls_are_torchvisions_imagenet1k_v1():
    from torchvision.models import GoogLeNet_Weights, ResNet50_Weights

    resnet, googlenet = BACKBONES["resnet50"].params(), BACKBONES["googlenet"].params()
    assert resnet.weights_url == ResNet50_Weights.IMAGENET1K_V1.url
    assert googlenet.weights_url == GoogLeNet_Weights.IMAGENET1K_V1.url
    # torch hub file names carry a sha256 prefix, which is what we pin
    assert resnet.weights_url.endswith(f"-{resnet.weights_sha256}.pth")
    bn = BACKBONES["bn_inception"].params()
    assert bn.weights_url.endswith("bn_inception-52deb4733.pth") and bn.weights_sha256.startswith("52deb4733")
    assert len(bn.weights_sha256) == 64


def _cadene_file(path: Path) -> dict[str, torch.Tensor]:
    """A BN-Inception weights file in the Caffe port's format: BN tensors 1 x C, a classifier."""
    torch.manual_seed(1)
    state = BNInception().state_dict()
    state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    for key, value in state.items():
        if "_bn." in key:
            state[key] = value.uniform_(0.5, 1.5).unsqueeze(0)
    state["last_linear.weight"] = torch.randn(1000, 1024)
    state["last_linear.bias"] = torch.zeros(1000)
    torch.save(state, path)
    return state


def test_bn_inception_downloads_pinned_weights_from_a_server(hub_dir, http_root):
    root, url = http_root
    served = _cadene_file(root / "bn_inception-test.pth")
    params = BACKBONES["bn_inception"].params(
        weights_url=f"{url}/bn_inception-test.pth", weights_sha256=_sha256(root / "bn_inception-test.pth")
    )
    trunk = BACKBONES["bn_inception"].build(params, True)
    cached = hub_checkpoint_path(params.weights_url)
    assert cached.parent == hub_dir / "checkpoints" and cached.is_file()
    loaded = trunk.module.state_dict()
    torch.testing.assert_close(loaded["inception_5b_1x1_bn.weight"], served["inception_5b_1x1_bn.weight"].squeeze(0))
    torch.testing.assert_close(loaded["conv1_7x7_s2.weight"], served["conv1_7x7_s2.weight"])
    # Second build: from the verified cache, without downloading again.
    (root / "bn_inception-test.pth").unlink()
    again = BACKBONES["bn_inception"].build(params, True).module.state_dict()
    torch.testing.assert_close(again["conv1_7x7_s2.weight"], served["conv1_7x7_s2.weight"])


def test_wrong_checksum_leaves_no_file_and_says_what_to_do(hub_dir, http_root):
    root, url = http_root
    _cadene_file(root / "bn.pth")
    params = BACKBONES["bn_inception"].params(weights_url=f"{url}/bn.pth", weights_sha256="0" * 64)
    with pytest.raises(WeightsError, match=r"did not match sha256 0{64}.*download .*/bn.pth .*weights_path"):
        BACKBONES["bn_inception"].build(params, True)
    assert not hub_checkpoint_path(params.weights_url).exists()


def test_unreachable_url_names_the_file_to_provide(hub_dir):
    params = BACKBONES["resnet50"].params(weights_url="http://127.0.0.1:9/resnet50-0676ba61.pth")
    with pytest.raises(WeightsError) as error:
        BACKBONES["resnet50"].build(params, True)
    message = str(error.value)
    assert "cannot download http://127.0.0.1:9/resnet50-0676ba61.pth" in message
    assert str(hub_dir / "checkpoints" / "resnet50-0676ba61.pth") in message
    assert "backbones.resnet50.weights_path" in message and "\n" not in message


def test_local_weights_path_override(tmp_path, hub_dir):
    from torchvision.models import resnet50

    torch.manual_seed(3)
    reference = resnet50(weights=None)
    path = tmp_path / "my-resnet50.pth"
    torch.save(reference.state_dict(), path)
    params = BACKBONES["resnet50"].params(weights_path=str(path), weights_sha256=_sha256(path)[:12])
    trunk = BACKBONES["resnet50"].build(params, True)
    torch.testing.assert_close(trunk.module.layer4[2].conv3.weight, reference.layer4[2].conv3.weight)
    # A file with another checksum, a missing file, and a file of another architecture are refused.
    with pytest.raises(WeightsError, match=r"has sha256 .*, expected 0676ba61"):
        BACKBONES["resnet50"].build(BACKBONES["resnet50"].params(weights_path=str(path)), True)
    with pytest.raises(WeightsError, match=r"weights_path: .*missing.pth does not exist; download https://"):
        BACKBONES["resnet50"].build(BACKBONES["resnet50"].params(weights_path=str(tmp_path / "missing.pth")), True)
    with pytest.raises(WeightsError, match=r"does not fit the googlenet architecture"):
        BACKBONES["googlenet"].build(BACKBONES["googlenet"].params(weights_path=str(path), weights_sha256=None), True)


def test_googlenet_loads_torchvision_format_and_transforms_input(tmp_path, hub_dir):
    from torchvision.models import googlenet

    torch.manual_seed(4)
    reference = googlenet(weights=None, aux_logits=True, init_weights=True).eval()
    path = tmp_path / "googlenet.pth"
    torch.save(reference.state_dict(), path)
    trunk = BACKBONES["googlenet"].build(
        BACKBONES["googlenet"].params(weights_path=str(path), weights_sha256=None), True
    )
    images = torch.rand(2, 3, 64, 64)
    reference.transform_input = True
    expected = reference._transform_input(images)
    for name in ("conv1", "maxpool1", "conv2", "conv3", "maxpool2", "inception3a", "inception3b", "maxpool3"):
        expected = getattr(reference, name)(expected)
    for name in ("inception4a", "inception4b", "inception4c", "inception4d", "inception4e", "maxpool4"):
        expected = getattr(reference, name)(expected)
    expected = reference.inception5b(reference.inception5a(expected))
    torch.testing.assert_close(trunk.module.eval()(images), expected)


def test_bn_inception_normalisation_is_caffe_bgr_0_255():
    model = build_model("bn_inception", BACKBONES["bn_inception"].params(), dim=8)
    rgb = torch.tensor([128.0, 117.0, 104.0]).view(1, 3, 1, 1) / 255  # BGR (104, 117, 128) = the mean
    torch.testing.assert_close(model.normalize(rgb.expand(1, 3, 2, 2)), torch.zeros(1, 3, 2, 2))


def test_timm_models_by_name():
    pytest.importorskip("timm")
    assert "timm_test_resnet" in BACKBONES and "timm_" not in BACKBONES
    spec = BACKBONES["timm_test_resnet"]
    assert spec.params().model_name == "test_resnet"
    model = build_model("timm_test_resnet", spec.params(), dim=16, pooling="gmp")
    assert model(torch.rand(2, 3, 64, 64)).shape == (2, 16)
    vit = build_model("timm", BACKBONES["timm"].params(model_name="test_vit", model_kwargs={"img_size": 64}), dim=8)
    out = vit(torch.rand(2, 3, 64, 64))
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2))
    with pytest.raises(ConfigError, match=r"backbones.timm.model_name: timm has no model 'no_such_net'"):
        build_model("timm", BACKBONES["timm"].params(model_name="no_such_net"), dim=8)


def test_timm_pretrained_weights_from_a_local_file(tmp_path, monkeypatch):
    timm = pytest.importorskip("timm")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(5)
    reference = timm.create_model("test_resnet", num_classes=0, global_pool="")
    path = tmp_path / "test_resnet.pth"
    torch.save(reference.state_dict(), path)
    params = BACKBONES["timm_test_resnet"].params(weights_path=str(path))
    trunk = BACKBONES["timm_test_resnet"].build(params, True)
    first = next(iter(reference.state_dict()))
    torch.testing.assert_close(trunk.module.net.state_dict()[first], reference.state_dict()[first])
    with pytest.raises(WeightsError, match=r"backbones.timm_test_resnet: cannot load ImageNet weights .*weights_path"):
        BACKBONES["timm_test_resnet"].build(params.model_copy(update={"weights_path": str(tmp_path / "no.pth")}), True)


def test_warmup_freezes_trunk_but_not_head_and_frozen_bn_stays_frozen():
    from dmlbench.train.loop import set_warmup

    model = build_model("tiny_cnn", BACKBONES["tiny_cnn"].params(width=4), dim=8, frozen_bn=True)
    trunk = [p for p in model.trunk_parameters() if p.requires_grad]  # as the training builds it
    set_warmup(trunk, True)
    assert all(not p.requires_grad for p in model.trunk.parameters())
    assert all(p.requires_grad for p in list(model.head.parameters()))
    set_warmup(trunk, False)
    convs = [m.weight for m in model.trunk.modules() if isinstance(m, torch.nn.Conv2d)]
    assert all(p.requires_grad for p in convs)
    assert all(not p.requires_grad for layer in model.batchnorm_layers() for p in layer.parameters())
