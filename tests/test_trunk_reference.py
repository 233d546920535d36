"""Each modern trunk as its authors run it: the frozen features (``EmbeddingModel.features``, the
"Pretrained" baseline) equal timm's reference path on a fixed input, ``forward_head(
forward_features(x), pre_logits=True)`` of a model timm builds on its own (CLIP: its image
embedding, ``ln_post(CLS) @ proj``). The weights cannot be had here, so each registered module is
built through ``build_model`` with a tiny random-init configuration of the same timm architecture
(real model class, head and norm wiring; only depth and width shrink) and the reference model gets
the same tensors."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import timm
import torch
import torch.nn.functional as F

from dmlbench.errors import ConfigError
from dmlbench.models import BACKBONES, build_model

TINY_VIT = {"embed_dim": 32, "depth": 2, "num_heads": 2}
TINY_CONVNEXT = {"depths": (1, 1, 1, 1), "dims": (8, 16, 32, 64)}
# backbone -> (timm model of the weights, native pooling, architecture overrides)
TRUNKS = {
    "dinov2_vits14": ("vit_small_patch14_dinov2.lvd142m", "cls", TINY_VIT),
    "dinov2_vitb14": ("vit_base_patch14_dinov2.lvd142m", "cls", TINY_VIT),
    "dinov2_vits14_reg4": ("vit_small_patch14_reg4_dinov2.lvd142m", "cls", TINY_VIT),
    "dinov2_vitb14_reg4": ("vit_base_patch14_reg4_dinov2.lvd142m", "cls", TINY_VIT),
    "dinov3_vits16": ("vit_small_patch16_dinov3.lvd1689m", "cls", TINY_VIT),
    "dinov3_vitb16": ("vit_base_patch16_dinov3.lvd1689m", "cls", TINY_VIT),
    "dino_vits16": ("vit_small_patch16_224.dino", "cls", TINY_VIT),
    "clip_vitb16": ("vit_base_patch16_clip_quickgelu_224.openai", "cls", TINY_VIT),
    "siglip2_vitb16": ("vit_base_patch16_siglip_224.v2_webli", "native", TINY_VIT),
    "in21k_vits16": ("vit_small_patch16_224.augreg_in21k_ft_in1k", "cls", TINY_VIT),
    "in21k_vitb16": ("vit_base_patch16_224.augreg_in21k_ft_in1k", "cls", TINY_VIT),
    "convnext_tiny": ("convnext_tiny.fb_in1k", "gap", TINY_CONVNEXT),
}
# timm's reference path as the authors embed: DINOv3's class token (timm: "Pass global_pool='token' to
# use CLS-token pooling (matches upstream DINOv3)"; its default is the patch-token average)
AS_AUTHORS = {"dinov3_vits16": {"global_pool": "token"}, "dinov3_vitb16": {"global_pool": "token"}}


def tiny_model(monkeypatch, backbone: str, pooling: str, dim: int = 8, **params):
    """``build_model(backbone)`` with the module's own build, at the tiny architecture."""
    module = importlib.import_module(f"dmlbench.models.{backbone}")
    architecture = TRUNKS[backbone][2]
    spec = BACKBONES[backbone]
    tiny = dataclasses.replace(spec, build=lambda p, pretrained: module.SPEC.build(p, pretrained, **architecture))
    monkeypatch.setitem(BACKBONES, backbone, tiny)
    torch.manual_seed(0)
    return build_model(backbone, spec.params(**params), dim, pooling=pooling).eval()


def reference(model_name: str, trunk_net: torch.nn.Module, architecture: dict, **kwargs) -> torch.nn.Module:
    """timm's own model (its defaults: pooling, classifier, image size), with the trunk's tensors."""
    net = timm.create_model(model_name, pretrained=False, **architecture, **kwargs).eval()
    result = net.load_state_dict(trunk_net.state_dict(), strict=False)
    classifier = {"head.weight", "head.bias", "head.fc.weight", "head.fc.bias"}
    assert not result.unexpected_keys and set(result.missing_keys) <= classifier, result
    return net


def fixed_input(model_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Images in [0, 1] at the weights' native size (a ViT's fixed input; 64 px for a CNN), and the
    same normalised as their config says."""
    cfg = timm.models.get_pretrained_cfg(model_name)
    size = cfg.input_size[-1] if cfg.fixed_input_size else 64
    images = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    mean, std = torch.tensor(cfg.mean).view(1, 3, 1, 1), torch.tensor(cfg.std).view(1, 3, 1, 1)
    return images, (images - mean) / std


@pytest.mark.parametrize("backbone", sorted(TRUNKS))
def test_frozen_features_are_timms_pre_logits(monkeypatch, backbone):
    model_name, pooling, architecture = TRUNKS[backbone]
    model = tiny_model(monkeypatch, backbone, pooling, **({"projection": False} if backbone == "clip_vitb16" else {}))
    net = reference(model_name, model.trunk.net, architecture, **AS_AUTHORS.get(backbone, {}))
    images, normalised = fixed_input(model_name)
    with torch.no_grad():
        expected = net.forward_head(net.forward_features(normalised), pre_logits=True)
        features = model.features(images)
    assert features.shape == expected.shape == (2, model.head.in_features)
    torch.testing.assert_close(features, expected)
    assert model.interpolation == timm.models.get_pretrained_cfg(model_name).interpolation


def test_clip_runs_quickgelu_and_embeds_ln_post_cls_times_proj(monkeypatch):
    """CLIP's activation and image embedding: the QuickGELU variant, and ``ln_post(CLS) @ proj``
    from an OpenAI-layout checkpoint (``visual.proj``, 768 x 512 in ViT-B) after timm's conversion."""
    model_name, _, architecture = TRUNKS["clip_vitb16"]
    model = tiny_model(monkeypatch, "clip_vitb16", "cls")
    act = model.trunk.net.blocks[0].mlp.act
    x = torch.linspace(-3, 3, 7)
    assert type(act).__name__ == "QuickGELU"
    torch.testing.assert_close(act(x), x * torch.sigmoid(1.702 * x))
    # OpenAI's layout of the trunk's tensors, the projection a fresh width x 512 matrix as CLIP stores it
    proj = torch.randn(32, 512, generator=torch.Generator().manual_seed(2))
    swaps = [("patch_embed.proj", "conv1"), ("norm_pre", "ln_pre"), ("blocks.", "transformer.resblocks."),
             ("attn.qkv.", "attn.in_proj_"), ("attn.proj", "attn.out_proj"), ("mlp.fc1", "mlp.c_fc"),
             ("mlp.fc2", "mlp.c_proj"), ("norm1", "ln_1"), ("norm2", "ln_2")]  # fmt: skip
    openai = {"visual.proj": proj}
    for key, value in model.trunk.net.state_dict().items():
        if key.startswith("head."):
            continue
        if key == "cls_token":
            key, value = "class_embedding", value.flatten()
        elif key == "pos_embed":
            key, value = "positional_embedding", value[0]
        elif key.startswith("norm."):
            key = key.replace("norm.", "ln_post.")
        for new, old in swaps:
            key = key.replace(new, old)
        openai[f"visual.{key}"] = value
    net = model.trunk.net
    net.load_state_dict(timm.models.vision_transformer.checkpoint_filter_fn(openai, net))
    images, _ = fixed_input(model_name)
    with torch.no_grad():
        embedding = model.features(images)
        ln_post_cls = net.forward_features(model.normalize(images))[:, 0]  # ln_post is timm's final norm
    assert embedding.shape == (2, 512) and model.head.in_features == 512
    torch.testing.assert_close(embedding, ln_post_cls @ proj)
    # the pre-projection feature is the explicit option
    plain = tiny_model(monkeypatch, "clip_vitb16", "cls", projection=False)
    assert plain.head.in_features == 32


def test_convnext_features_are_the_layernorm_of_the_pooled_map(monkeypatch):
    model = tiny_model(monkeypatch, "convnext_tiny", "gap")
    net = model.trunk.net
    images, normalised = fixed_input("convnext_tiny.fb_in1k")
    with torch.no_grad():
        pooled = net.forward_features(normalised).mean(dim=(2, 3))
        expected = F.layer_norm(pooled, (64,), net.head.norm.weight, net.head.norm.bias, net.head.norm.eps)
        features = model.features(images)
    torch.testing.assert_close(features, expected)
    with torch.no_grad():  # the stage-4 average alone (what ConvNeXt's LayerNorm was dropped to) differs
        net.head.norm.weight.mul_(3.0)
        assert not torch.allclose(model.features(images), pooled)


def test_every_timm_key_runs_timms_pre_logits_with_the_head_norm():
    torch.manual_seed(0)
    model = build_model("timm_test_convnext", BACKBONES["timm_test_convnext"].params(), 8, pooling="gap").eval()
    net = model.trunk.net
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        normalised = model.normalize(images)
        expected = net.forward_head(net.forward_features(normalised), pre_logits=True)
        features = model.features(images)
        unnormed = net.forward_features(normalised).mean(dim=(2, 3))
    torch.testing.assert_close(features, expected)
    assert type(net.head.norm).__name__ == "LayerNorm2d" and not torch.allclose(features, unnormed)


@pytest.mark.parametrize(("pooling", "timm_pool"), [("gap", "avg"), ("gmp", "max"), ("gap+gmp", "avgmax")])
def test_the_protocols_pooling_sets_timms_global_pool_and_keeps_the_norm(monkeypatch, pooling, timm_pool):
    model_name, _, architecture = TRUNKS["dinov2_vits14"]
    model = tiny_model(monkeypatch, "dinov2_vits14", pooling)
    net = reference(model_name, model.trunk.net, architecture)  # built with CLS pooling, norm on the tokens
    images, normalised = fixed_input(model_name)
    with torch.no_grad():
        tokens = net.forward_features(normalised)  # after the final norm
        expected = net.pool(tokens, pool_type=timm_pool)
        features = model.features(images)
    torch.testing.assert_close(features, expected)
    patches = tokens[:, 1:]
    by_hand = {"gap": patches.mean(1), "gmp": patches.amax(1), "gap+gmp": (patches.mean(1) + patches.amax(1)) / 2}
    torch.testing.assert_close(features, by_hand[pooling])


def test_poolings_a_trunk_cannot_do_are_refused_in_one_line(monkeypatch):
    with pytest.raises(ConfigError) as caught:
        tiny_model(monkeypatch, "siglip2_vitb16", "cls")
    assert "\n" not in str(caught.value) and "siglip2_vitb16" in str(caught.value) and "native" in str(caught.value)
    with pytest.raises(ConfigError, match="projection: false") as caught:
        tiny_model(monkeypatch, "clip_vitb16", "gap")
    assert "\n" not in str(caught.value)
    averaged = tiny_model(monkeypatch, "siglip2_vitb16", "gap")  # SigLIP 2's patch-token average instead of MAP
    assert averaged.trunk.net.attn_pool is None


def test_dinov2_keeps_its_native_position_grid_and_takes_any_crop(monkeypatch):
    model = tiny_model(monkeypatch, "dinov2_vits14", "cls")
    assert model.trunk.net.pos_embed.shape == (1, 1 + 37 * 37, 32)  # 518 px / 14 px: never resampled at load
    net = reference("vit_small_patch14_dinov2.lvd142m", model.trunk.net, TRUNKS["dinov2_vits14"][2],
                    dynamic_img_size=True)  # fmt: skip
    images = torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # 224 px: 16 x 16 patches, the 37 x 37 embeddings interpolated at each forward
        expected = net.forward_head(net.forward_features(model.normalize(images)), pre_logits=True)
        torch.testing.assert_close(model.features(images), expected)
        assert model(torch.rand(1, 3, 112, 112)).shape == (1, 8)


def test_each_trunk_records_its_weights_config():
    for backbone, (model_name, _, _) in TRUNKS.items():
        module = importlib.import_module(f"dmlbench.models.{backbone}")
        cfg = timm.models.get_pretrained_cfg(model_name)
        assert module.MODEL_NAME == model_name and module.HUB_FILE.repo == cfg.hf_hub_id
    assert timm.models.get_pretrained_cfg(TRUNKS["dinov3_vits16"][0]).input_size == (3, 256, 256)
