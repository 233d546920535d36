"""The embedding model's optimiser groups against timm 1.0's own (``timm.optim._param_groups``):
layer-wise lr decay as BEiT defines it and timm groups it (``param_groups_layer_decay``: the
classifier - here the embedding head - is the top layer, a depth-d ViT's block i gets decay^(d - i),
its embeddings decay^(d + 1), the final norm joins the last block), no weight decay on 1-D
parameters and on the model's ``no_weight_decay()`` names (``param_groups_weight_decay``), and the
``freeze`` key (Hyp-ViT's frozen ``patch_embed``).

timm's functions run on the timm model built with ``num_classes = dim`` (its classifier in the
embedding head's place); each parameter's lr scale and weight decay are compared, by name."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.optim._param_groups import param_groups_layer_decay, param_groups_weight_decay

from dmlbench.errors import ConfigError
from dmlbench.models import BACKBONES, build_model
from dmlbench.params.protocol import Protocol
from dmlbench.train.optim import freeze_modules, layer_ids, make_model_optimizer, model_param_groups

LR, WD, DIM = 1e-3, 0.05, 8
# backbone key -> (timm model name, create_model kwargs) of the same architecture
TIMM_TWINS = {
    "tiny_vit": ("test_vit", {"img_size": 32, "patch_size": 4, "dynamic_img_size": True}),
    "timm_test_convnext": ("test_convnext", {}),
}


def _protocol(**keys) -> Protocol:
    optimizer = {"name": "adamw", "lr": LR, "weight_decay": WD, **keys.pop("optimizer", {})}
    base = {"epochs": 2, "batch_size": 8, "optimizer": optimizer, "augment": {"crop_size": 32, "eval_resize": 36}}
    return Protocol.model_validate({**base, **keys})


def _twin(backbone: str) -> torch.nn.Module:
    name, kwargs = TIMM_TWINS[backbone]
    return timm.create_model(name, num_classes=DIM, **kwargs)


def _ours(backbone: str, protocol: Protocol, classifier: str = "head") -> dict[str, tuple[float, float]]:
    """Parameter name (the timm twin's: our head as its ``classifier``) -> (lr / LR, weight decay)."""
    model = build_model(backbone, BACKBONES[backbone].params(), DIM, pooling="gap")
    names = {id(p): n for n, p in model.named_parameters()}

    def twin_name(name: str) -> str:
        return name.removeprefix("trunk.net.") if name.startswith("trunk.") else classifier + name[len("head") :]

    return {
        twin_name(names[id(p)]): (round(g["lr"] / LR, 12), g["weight_decay"])
        for g in model_param_groups(protocol, model)
        for p in g["params"]
    }


def _timms(groups: list[dict], model: torch.nn.Module) -> dict[str, tuple[float, float]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (round(g.get("lr_scale", 1.0), 12), g["weight_decay"]) for g in groups for p in g["params"]}


@pytest.mark.parametrize("backbone", sorted(TIMM_TWINS))
@pytest.mark.parametrize("decay", [0.5, 0.75])
def test_layer_decay_groups_equal_timms_param_groups_layer_decay(backbone, decay):
    twin = _twin(backbone)
    ours = _ours(
        backbone, _protocol(layer_decay=decay, optimizer={"no_weight_decay": "timm"}), twin.default_cfg["classifier"]
    )
    no_decay = twin.no_weight_decay() if hasattr(twin, "no_weight_decay") else ()
    theirs = _timms(param_groups_layer_decay(twin, WD, no_weight_decay_list=no_decay, layer_decay=decay), twin)
    assert ours == theirs


def test_beits_exponents_on_a_vit():
    """Block i of a depth-d ViT at decay^(d - i), the embeddings at decay^(d + 1), the head at 1; the
    final norm with the last block (timm's MATCH_PREV_GROUP: BEiT's optim_factory puts it at 1)."""
    model = build_model("tiny_vit", BACKBONES["tiny_vit"].params(), DIM, pooling="cls")
    layers, count = layer_ids(model)
    depth = len(model.trunk.net.blocks)
    exponent = {name: count - 1 - layer for name, layer in layers.items()}
    assert count == depth + 2
    assert exponent["trunk.net.cls_token"] == exponent["trunk.net.pos_embed"] == depth + 1
    assert exponent["trunk.net.patch_embed.proj.weight"] == depth + 1
    assert [exponent[f"trunk.net.blocks.{i}.attn.qkv.weight"] for i in range(depth)] == [
        depth - i for i in range(depth)
    ]
    assert exponent["trunk.net.norm.weight"] == 1 and exponent["head.weight"] == exponent["head.bias"] == 0


@pytest.mark.parametrize("backbone", sorted(TIMM_TWINS))
def test_no_weight_decay_groups_equal_timms_param_groups_weight_decay(backbone):
    twin = _twin(backbone)
    ours = _ours(backbone, _protocol(optimizer={"no_weight_decay": "timm"}), twin.default_cfg["classifier"])
    no_decay = twin.no_weight_decay() if hasattr(twin, "no_weight_decay") else ()
    theirs = _timms(param_groups_weight_decay(twin, WD, no_weight_decay_list=no_decay), twin)
    assert ours == theirs
    skipped = {name for name, (_, wd) in ours.items() if wd == 0.0}
    if backbone == "tiny_vit":  # timm's no_weight_decay(): the position embedding and class token
        assert {"pos_embed", "cls_token", "head.bias", "norm.weight"} <= skipped and "head.weight" not in skipped


def test_the_backbone_multiplier_scales_the_trunk_not_the_head():
    protocol = _protocol(layer_decay=0.5, backbone_lr_multiplier=0.1)
    model = build_model("tiny_vit", BACKBONES["tiny_vit"].params(), DIM, pooling="cls")
    groups = make_model_optimizer(protocol, model).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    by_name = {names[id(p)]: g for g in groups for p in g["params"]}
    assert groups[0]["name"].startswith("head") and groups[0]["lr"] == LR  # the logged train/lr
    assert by_name["head.weight"]["lr"] == LR and by_name["head.weight"]["weight_decay"] == WD
    assert by_name["trunk.net.norm.weight"]["lr"] == pytest.approx(LR * 0.1 * 0.5)
    assert by_name["trunk.net.cls_token"]["lr"] == pytest.approx(LR * 0.1 * 0.5**7)
    every = [id(p) for g in groups for p in g["params"]]
    assert sorted(every) == sorted(id(p) for p in model.parameters()) and len(set(every)) == len(every)
    # the defaults: one group, every parameter at the lr (each 2020 recipe's optimiser)
    (single,) = make_model_optimizer(_protocol(), model).param_groups
    assert single["lr"] == LR and single["weight_decay"] == WD and len(single["params"]) == len(every)


def test_freeze_stops_the_patch_embedding_and_the_optimiser_leaves_it_out():
    protocol = _protocol(freeze=["patch_embed"], layer_decay=0.5)
    model = build_model("tiny_vit", BACKBONES["tiny_vit"].params(), DIM, pooling="cls")
    frozen = freeze_modules(protocol, model)
    assert frozen == ["net.patch_embed.proj.weight", "net.patch_embed.proj.bias"]
    trained = {id(p) for g in make_model_optimizer(protocol, model).param_groups for p in g["params"]}
    assert id(model.trunk.net.patch_embed.proj.weight) not in trained
    assert id(model.trunk.net.pos_embed) in trained and id(model.trunk.net.cls_token) in trained  # as Hyp-ViT
    with pytest.raises(ConfigError, match="freeze: the trunk has no module 'patch_embedding'"):
        freeze_modules(_protocol(freeze=["patch_embedding"]), model)


def test_layer_decay_on_a_trunk_without_layer_groups_is_refused_in_one_line():
    model = build_model("tiny_cnn", BACKBONES["tiny_cnn"].params(), DIM)
    with pytest.raises(ConfigError) as caught:
        make_model_optimizer(_protocol(layer_decay=0.5), model)
    assert "\n" not in str(caught.value) and "layer_decay 0.5 needs a trunk with layer groups" in str(caught.value)
