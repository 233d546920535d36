"""What each stage reads is derived from the source (:mod:`dmlbench.pipeline.reads`), and the
validate stage's manifests follow the code: planted edits on a copy of this checkout's pipeline
change exactly the manifests of the stages that run or read what was edited. A dependency missing
would let ``dvc repro`` keep results computed by old code or old settings; one too many re-runs
stages (GPU-days at real scale) for nothing.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dmlbench.errors import ConfigError
from dmlbench.params.declared_reads import MEMBERS, REGISTRIES, SECTIONS
from dmlbench.pipeline.manifests import write_manifests
from dmlbench.pipeline.reads import Derivation
from dmlbench.pipeline.source import StageItems
from dmlbench.stage_inputs import MANIFEST_DIR

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    """This checkout's dvc.yaml, params.yaml, stages/ and src/ in a DVC repository of their own."""
    root = tmp_path_factory.mktemp("pipeline")
    for name in ("src", "stages"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, root / name)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=root, check=True)
    return root


@pytest.fixture(scope="module")
def before(pipeline) -> dict[str, dict]:
    """The manifests of the pipeline as it is."""
    write_manifests(pipeline)
    return _manifests(pipeline)


def _manifests(root: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((root / MANIFEST_DIR).iterdir())}


def _after(root: Path, path: str, edit) -> dict[str, dict]:
    """The manifests after ``edit`` (text -> text) of ``root/path``; the file restored."""
    file = root / path
    original = file.read_text()
    file.write_text(edit(original))
    try:
        write_manifests(root)
    finally:
        file.write_text(original)
    return _manifests(root)


def _changed(before: dict, after: dict) -> set[str]:
    assert set(before) == set(after)
    return {name for name in before if before[name] != after[name]}


def _groups(names) -> set[str]:
    return {name.split("@")[0] for name in names}


def test_editing_a_loss_changes_only_its_own_stages(pipeline, before):
    losses = sorted(yaml.safe_load((pipeline / "params.yaml").read_text())["losses"])
    loss, other = losses[0], losses[1]
    after = _after(pipeline, f"src/dmlbench/losses/{loss}.py", lambda text: text + "\n# an edit\n")
    changed = _changed(before, after)
    assert _groups(changed) == {"tune", "train", "evaluate", "baseline", "report"} & _groups(before)
    assert all(f"-{loss}-" in name or name.endswith(f"-{loss}") or name == "report" for name in changed)
    assert not [name for name in changed if f"-{other}-" in name]
    # the registry's other members stay out of a per-item stage, and so do the other backbones'
    train = next(m for name, m in before.items() if name.startswith(f"train@glyphs-tiny_cnn-{loss}-"))
    members = {f for f in train["code"] if f.startswith("src/dmlbench/losses/")}
    assert members == {f"src/dmlbench/losses/{n}.py" for n in ("__init__", "base", "search", loss)}
    models = {f.rsplit("/", 1)[1] for f in train["code"] if f.startswith("src/dmlbench/models/")}
    assert "tiny_cnn.py" in models and not models & {"resnet50.py", "dinov2_vits14.py", "timm_models.py"}
    assert {f"src/dmlbench/losses/{n}.py" for n in losses} <= set(before["report"]["code"])  # the whole grid
    write_manifests(pipeline)
    assert _manifests(pipeline) == before  # the edit undone: the manifests as they were


def test_an_import_added_to_a_module_a_stage_reaches_joins_its_manifest(pipeline, before):
    """The training loop lazily imports one more module: every stage that runs the loop (train,
    tune, baseline) now reads it and what it imports; the others do not change."""
    added = "\n\ndef _added():\n    from dmlbench.analysis import statistics\n"
    after = _after(pipeline, "src/dmlbench/train/loop.py", lambda text: text + added)
    changed = _changed(before, after)
    assert _groups(changed) == {"train", "tune", "baseline"} & _groups(before)
    for name in changed:
        new = set(after[name]["code"]) - set(before[name]["code"])
        assert {"src/dmlbench/analysis/__init__.py", "src/dmlbench/analysis/statistics.py"} <= new, name
        assert all(f.startswith("src/dmlbench/analysis/") for f in new), new


def test_a_params_key_read_by_new_code_joins_the_manifest(pipeline, before):
    line = "    config = run_config(params, run)\n"
    added = f"{line}    print(params.report.title)\n"
    after = _after(pipeline, "src/dmlbench/train/stage.py", lambda text: text.replace(line, added, 1))
    train = sorted(name for name in before if name.startswith("train@"))
    assert train and all(after[name]["params"]["report.title"] is not None for name in train)
    assert all(set(after[name]["params"]) - set(before[name]["params"]) == {"report.title"} for name in train)
    assert not [name for name in _changed(before, after) if not name.startswith(("train@", "baseline@", "report"))]


def test_what_a_stage_reads_by_hand(pipeline, before):
    """The rules the derivation follows, on a few stages: imports through calls and aliases, a
    declared narrower key, guards, ``-m`` workers and data files."""
    manifests = before
    params = yaml.safe_load((pipeline / "params.yaml").read_text())
    active, dataset = params["protocol"], next(iter(params["datasets"]))
    download = manifests[f"download@{dataset}"]
    assert set(download["params"]) == {f"datasets.{dataset}.source"}  # every fetch reads only the source
    assert not [f for f in download["code"] if f.startswith(("src/dmlbench/losses/", "src/dmlbench/models/"))]
    train = next(m for name, m in manifests.items() if name.startswith("train@"))
    assert {"evaluate", "tracking.experiment", "protocol", f"protocols.{active}"} <= set(train["params"])
    assert not [key for key in train["params"] if key.startswith(("report", "cluster", "tuning"))]
    pretrained = next(m for name, m in manifests.items() if name.startswith("embed_pretrained@"))
    assert f"protocols.{active}.augment" in pretrained["params"] and f"protocols.{active}" not in pretrained["params"]
    tune = next(m for name, m in manifests.items() if name.startswith("tune@"))
    assert "src/dmlbench/tune/worker.py" in tune["code"]  # started as python -m dmlbench.tune.worker
    assert "src/dmlbench/params/cluster.py" in tune["code"] and "cluster" not in tune["params"]  # scheduling only
    report = manifests["report"]
    assert {"src/dmlbench/analysis/literature.csv", "src/dmlbench/analysis/methods.csv"} <= set(report["code"])
    assert set(report["params"]) == {"params.yaml"}  # Params handed where the derivation cannot follow
    everything = {p.relative_to(pipeline).as_posix() for p in (pipeline / "src/dmlbench").rglob("*.py")}
    assert not [f for m in manifests.values() for f in m["code"] if f.startswith("src/") and f not in everything
                and not f.endswith(".csv")]  # fmt: skip


def test_every_stage_must_depend_on_its_manifest(pipeline, before, tmp_path):
    root = tmp_path / "cut"
    shutil.copytree(pipeline, root, ignore=shutil.ignore_patterns("artifacts"))
    definition = yaml.safe_load((root / "dvc.yaml").read_text())
    deps = definition["stages"]["prepare"]["do"]["deps"]
    definition["stages"]["prepare"]["do"]["deps"] = [d for d in deps if not d.startswith("artifacts/inputs/")]
    (root / "dvc.yaml").write_text(yaml.safe_dump(definition, sort_keys=False))
    with pytest.raises(ConfigError, match=r"stage prepare@\w+ must depend on artifacts/inputs/prepare@\w+\.json"):
        write_manifests(root)
    assert not (root / MANIFEST_DIR).exists()  # nothing written


def test_each_registered_entry_is_found_in_its_own_module():
    """A stage iterating a registry reads the module named as its entry (else the ``__missing__``
    fallback): checked against the registries themselves, imported."""
    import importlib

    derivation = Derivation(ROOT)
    for section, (package, variable) in REGISTRIES.items():
        registry = importlib.import_module(package).__dict__[variable]
        keys = [*registry, *(["timm_convnext_tiny.fb_in1k"] if section == "backbones" else [])]
        for name in keys:
            member = derivation.registries[section].member_for(name)
            assert (
                importlib.import_module(member).SPEC is registry[name]
                or section == "backbones"
                and (name.startswith("timm") and member == "dmlbench.models.timm_models")
            ), f"{section}.{name}: found in {member}"
    with pytest.raises(ConfigError, match=r"losses.nope: no module dmlbench/losses/nope.py among the members"):
        derivation.registries["losses"].member_for("nope")


def test_every_member_of_params_declares_what_it_reads():
    tree = ast.parse((ROOT / "src/dmlbench/params/model.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Params"]
    members = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    members |= {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    assert members == set(MEMBERS) | set(SECTIONS)


def test_reading_an_undeclared_member_of_params_fails_in_one_line(tmp_path):
    for name in ("src", "stages"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    stage_py = tmp_path / "src/dmlbench/evaluate/stage.py"
    stage_py.write_text(stage_py.read_text().replace("params.evaluate", "params.evaluation_settings", 1))
    derivation = Derivation(tmp_path)
    stage = StageItems("evaluate@x", "stages/evaluate.py", {}, True)
    where = r"stages/evaluate.py -> dmlbench.evaluate.stage.evaluate_stage"
    with pytest.raises(ConfigError, match=rf"Params.evaluation_settings \(read as \w+ in {where}\) is not declared"):
        derivation.params(stage, yaml.safe_load((ROOT / "params.yaml").read_text()))
