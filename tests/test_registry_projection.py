"""A registry line is part of only its own item's stages: a per-item stage's manifest hashes the
registry ``__init__`` projected onto its own member (:func:`dmlbench.stage_inputs.registry_projection`),
so adding or removing another loss leaves it as it was, while any other edit of the file changes
every manifest that reads it; the stage's own run-time check agrees with validate."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from dmlbench.errors import ConfigError
from dmlbench.pipeline.reads import Derivation
from dmlbench.pipeline.source import StageItems
from dmlbench.stage_inputs import build_manifest, check_manifest, manifest_path, manifest_text, registry_projection

ROOT = Path(__file__).resolve().parents[1]
ITEMS = {"datasets": "glyphs", "backbones": "tiny_cnn"}
STAGES = [
    StageItems("train@glyphs-tiny_cnn-contrastive-32-0", "stages/train.py", {**ITEMS, "losses": "contrastive"}, True),
    StageItems("train@glyphs-tiny_cnn-triplet-32-0", "stages/train.py", {**ITEMS, "losses": "triplet"}, True),
    StageItems("evaluate@glyphs-tiny_cnn-triplet-32", "stages/evaluate.py", {**ITEMS, "losses": "triplet"}, True),
    StageItems("prepare@glyphs", "stages/prepare.py", {"datasets": "glyphs"}, True),
    StageItems("report", "stages/report.py", {}, False),
]
INIT = "src/dmlbench/losses/__init__.py"


@pytest.fixture
def checkout(tmp_path) -> Path:
    for name in ("src", "stages"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    return tmp_path


def _manifests(root: Path, stages: list[StageItems] = STAGES) -> dict[str, str]:
    """Every stage of ``stages`` as validate writes its manifest (written under ``root`` too)."""
    params = yaml.safe_load((root / "params.yaml").read_text())
    derivation = Derivation(root)
    texts = {}
    for stage in stages:
        manifest = build_manifest(
            stage.name, derivation.code(stage), derivation.params(stage, params), params, root,
            projections=derivation.projections(stage),
        )  # fmt: skip
        texts[stage.name] = manifest_text(manifest)
        manifest_path(stage.name, root).parent.mkdir(parents=True, exist_ok=True)
        manifest_path(stage.name, root).write_text(texts[stage.name])
    return texts


def _add_member(root: Path, name: str) -> None:
    """A copy of the triplet loss as a new member ``name``: its module and its registry line."""
    losses = root / "src" / "dmlbench" / "losses"
    (losses / f"{name}.py").write_text((losses / "triplet.py").read_text().replace('name="triplet"', f'name="{name}"'))
    text = (root / INIT).read_text()
    text = text.replace("    triplet,\n", f"    triplet,\n    {name},\n", 1)
    text = text.replace("        triplet.SPEC,\n", f"        triplet.SPEC,\n        {name}.SPEC,\n", 1)
    (root / INIT).write_text(text)


def test_adding_a_loss_changes_only_the_manifests_that_read_the_whole_registry(checkout):
    before = _manifests(checkout)
    assert INIT in before["train@glyphs-tiny_cnn-contrastive-32-0"]  # a per-item stage reads the registry
    _add_member(checkout, "my_triplet")
    for stage in STAGES:  # the stages run as they are, validate not re-run: their own check agrees
        if stage.name != "report":
            check_manifest(stage.name, checkout)
    with pytest.raises(ConfigError, match=r"report\.json: src/dmlbench/losses/__init__\.py changed"):
        check_manifest("report", checkout)
    after = _manifests(checkout)
    assert {name for name in before if before[name] != after[name]} == {"report"}


def test_removing_another_loss_keeps_the_manifests_of_the_others(checkout):
    before = _manifests(checkout)
    text = (checkout / INIT).read_text()
    text = text.replace("    contrastive,\n", "", 1).replace("        contrastive.SPEC,\n", "", 1)
    (checkout / INIT).write_text(text)
    (checkout / "src/dmlbench/losses/contrastive.py").unlink()
    after = _manifests(checkout, [s for s in STAGES if s.items.get("losses") != "contrastive"])
    assert after["train@glyphs-tiny_cnn-triplet-32-0"] == before["train@glyphs-tiny_cnn-triplet-32-0"]
    assert after["report"] != before["report"]


def test_editing_a_shared_line_changes_every_manifest_that_reads_it(checkout):
    before = _manifests(checkout)
    text = (checkout / INIT).read_text()
    (checkout / INIT).write_text(text.replace('__all__ = ["LOSSES", ', '__all__ = ["LOSSES", "LossSpec", ', 1))
    with pytest.raises(ConfigError, match="losses/__init__.py changed"):
        check_manifest("train@glyphs-tiny_cnn-contrastive-32-0", checkout)
    after = _manifests(checkout)
    readers = {name for name, text in before.items() if INIT in text}
    assert readers >= {"train@glyphs-tiny_cnn-contrastive-32-0", "evaluate@glyphs-tiny_cnn-triplet-32", "report"}
    assert {name for name in before if before[name] != after[name]} == readers


def test_a_file_the_projection_cannot_account_for_is_hashed_whole(tmp_path):
    package = tmp_path / "src" / "dmlbench" / "things"
    package.mkdir(parents=True)
    for name in ("a", "b"):
        (package / f"{name}.py").write_text("SPEC = 1\n")
    init = package / "__init__.py"
    init.write_text("from dmlbench.things import a, b\n\nTHINGS = {x: x for x in (a.SPEC, b.SPEC)}\n")
    own_a, own_b = registry_projection(init, "THINGS", ["a"]), registry_projection(init, "THINGS", ["b"])
    assert own_a is not None and own_b is not None and own_a != own_b
    init.write_text(init.read_text() + "DEFAULT = b.SPEC  # another member used beyond its registry line\n")
    assert registry_projection(init, "THINGS", ["a"]) is None
    assert registry_projection(init, "OTHER", ["a", "b"]) is None  # no registry dict of that name
