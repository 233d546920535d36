"""Inputs manifests (``artifacts/inputs/<stage>.json``): what stands for a stage's code and params deps.

The validate stage writes them from what each stage reads, derived from the source
(:mod:`dmlbench.pipeline.manifests`; the derivation itself: ``tests/test_dvc_deps.py``); every other
stage depends on its own manifest only (plus its data), and refuses to run when the manifest no
longer matches the code or params.yaml (:func:`dmlbench.stage_inputs.check_manifest`). These tests
run the real writer on a copy of this checkout's pipeline and check that a params edit changes
exactly the manifests of the stages that read it, that the layout keeps DVC away from params.yaml
and the code for every stage but validate, that a stale manifest stops a stage before it starts,
that a failed validate keeps the manifests, and that a checkpoint is kept across edits of code its
stage does not read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from dmlbench.errors import ConfigError
from dmlbench.grid import RunSpec
from dmlbench.pipeline.manifests import resolved_stages, write_manifests
from dmlbench.stage_inputs import MANIFEST_DIR, check_manifest, lookup, manifest_path

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pipeline_copy(tmp_path_factory) -> Path:
    """This checkout's dvc.yaml, params.yaml, stages/ and src/ in a DVC repository of their own."""
    root = tmp_path_factory.mktemp("pipeline")
    for name in ("src", "stages"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, root / name)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=root, check=True)
    return root


def _params(root: Path) -> dict:
    return yaml.safe_load((root / "params.yaml").read_text())


def _manifests(root: Path) -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted((root / MANIFEST_DIR).iterdir())}


def _changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    assert set(before) == set(after)
    return {name for name in before if before[name] != after[name]}


def test_every_stage_but_validate_has_one_manifest_and_no_code_or_params_deps():
    stages = resolved_stages(ROOT)
    assert "validate" in stages and len(stages) > 20
    for name, stage in stages.items():
        deps = [str(d) for d in stage.get("deps") or []]
        if name == "validate":
            assert {"stages", "src/dmlbench"} <= set(deps)
            assert stage["params"] == [{"params.yaml": None}]
            outs = {next(iter(o)): o[next(iter(o))] for o in stage["outs"]}  # a failed validate keeps them
            assert {"artifacts/inputs", "artifacts/params.validated"} == set(outs)
            assert all(out["persist"] is True for out in outs.values())
            continue
        assert [d for d in deps if d.startswith("artifacts/inputs/")] == [manifest_path(name).as_posix()], name
        assert not [d for d in deps if d.startswith(("src/", "stages/"))], f"{name}: code listed as DVC deps"
        assert "params" not in stage, f"{name}: DVC would parse params.yaml for it on every status"


def test_manifest_holds_md5_of_each_code_file_and_value_of_each_key(pipeline_copy):
    root = pipeline_copy
    written = write_manifests(root)
    names = {p.stem for p in (root / MANIFEST_DIR).iterdir()}
    assert written == len(names) == len(resolved_stages(root)) - 1
    train = next(n for n in names if n.startswith("train@"))
    manifest = json.loads(manifest_path(train, root).read_text())
    assert manifest["stage"] == train
    loss = train.split("@")[1].split("-")[2]
    assert f"src/dmlbench/losses/{loss}.py" in manifest["code"]
    other_losses = [f for f in manifest["code"] if f.startswith("src/dmlbench/losses/") and f.count("/") == 3]
    assert set(other_losses) <= {f"src/dmlbench/losses/{loss}.py", "src/dmlbench/losses/__init__.py",
                                 "src/dmlbench/losses/base.py", "src/dmlbench/losses/search.py"}  # fmt: skip
    loop = "src/dmlbench/train/loop.py"
    assert manifest["code"][loop] == hashlib.md5((root / loop).read_bytes()).hexdigest()
    models = [f for f in manifest["code"] if f.startswith("src/dmlbench/models/")]
    assert "src/dmlbench/models/__init__.py" in models and not any("__pycache__" in f for f in models)
    params = _params(root)
    assert manifest["params"]["protocol"] == params["protocol"]
    assert manifest["params"][f"losses.{loss}"] == params["losses"][loss]
    assert "report" not in manifest["params"]  # the training reads no report settings
    report = json.loads(manifest_path("report", root).read_text())
    assert report["params"]["params.yaml"]["report"] == params["report"]  # the report reads the whole file


def test_a_params_edit_changes_only_the_manifests_of_the_stages_that_read_it(pipeline_copy):
    root = pipeline_copy
    params = _params(root)
    write_manifests(root, params)
    before = _manifests(root)

    edited = json.loads(json.dumps(params))
    key = next(iter(edited["evaluate"]["bootstrap"]))
    edited["evaluate"]["bootstrap"][key] = "edited"
    write_manifests(root, edited)
    changed = _changed(before, _manifests(root))
    assert {n.split("@")[0] for n in changed} >= {"train", "evaluate"}
    assert not [n for n in changed if n.startswith(("download@", "prepare@", "embed_pretrained@"))]

    write_manifests(root, params)  # back as it was: byte for byte
    assert _manifests(root) == before


def test_a_stale_manifest_refuses_the_stage_in_one_line(pipeline_copy):
    root = pipeline_copy
    params = _params(root)
    write_manifests(root, params)
    train = next(p.stem for p in (root / MANIFEST_DIR).iterdir() if p.stem.startswith("train@"))
    check_manifest(train, root)  # fresh: passes
    check_manifest("validate", root)  # no manifest of its own: passes

    loop = root / "src/dmlbench/train/loop.py"
    original = loop.read_text()
    loop.write_text(original + "\n# edited after validate ran\n")
    try:
        with pytest.raises(ConfigError, match=r"src/dmlbench/train/loop.py changed after the validate stage"):
            check_manifest(train, root)
    finally:
        loop.write_text(original)
    check_manifest(train, root)

    edited = _params(root)
    edited["protocol_unused_marker"] = 1  # a key no stage reads: nothing refused
    (root / "params.yaml").write_text(yaml.safe_dump(edited))
    check_manifest(train, root)
    edited["tracking"]["experiment"] = "another"
    (root / "params.yaml").write_text(yaml.safe_dump(edited))
    try:
        with pytest.raises(ConfigError, match=r"params.yaml key 'tracking.experiment' changed"):
            check_manifest(train, root)
    finally:
        shutil.copy(ROOT / "params.yaml", root / "params.yaml")


def test_the_stage_script_stops_before_any_work_on_a_stale_manifest(pipeline_copy):
    root = pipeline_copy
    write_manifests(root)
    prepare = next(p.stem for p in (root / MANIFEST_DIR).iterdir() if p.stem.startswith("prepare@"))
    dataset = prepare.split("@")[1]
    splits = root / "src/dmlbench/data/splits.py"
    original = splits.read_text()
    splits.write_text(original + "\n# edited\n")
    env = dict(os.environ, DVC_STAGE=prepare, PYTHONPATH=str(root / "src"))
    try:
        result = subprocess.run([sys.executable, "stages/prepare.py", "--dataset", dataset], cwd=root, env=env,
                                capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    finally:
        splits.write_text(original)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {MANIFEST_DIR}/{prepare}.json: src/dmlbench/data/splits.py changed"), line
    assert not (root / "artifacts/prepared").exists()


def test_the_check_refuses_a_missing_manifest_and_compares_values_as_their_json(tmp_path):
    (tmp_path / "params.yaml").write_text("a: 1\nb: {c: true}\n")
    check_manifest("train@x", tmp_path)  # no artifacts/inputs/: a pipeline without manifests
    (tmp_path / MANIFEST_DIR).mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"train@x.json: missing: the validate stage writes"):
        check_manifest("train@x", tmp_path)
    check_manifest("validate", tmp_path)  # it writes them, has none

    def write(params: dict) -> None:
        manifest_path("train@x", tmp_path).write_text(json.dumps({"stage": "train@x", "code": {}, "params": params}))

    write({"a": 1, "b.c": True})
    check_manifest("train@x", tmp_path)
    write({"a": True, "b.c": True})  # 1 and true are one value to Python, two to the manifest
    with pytest.raises(ConfigError, match=r"params.yaml key 'a' changed after the validate stage"):
        check_manifest("train@x", tmp_path)
    write({"a": 1, "b.c": True, "gone": None})  # a key removed from params.yaml is not a stored null
    with pytest.raises(ConfigError, match=r"key 'gone' changed while the stage ran \(its outputs are not recorded\)"):
        check_manifest("train@x", tmp_path, after_run=True)


def test_lookup():
    data = {"backbones": {"timm_convnext_tiny.fb_in1k": {"lr": 1}}, "a": {"b": {"c": 2}}}
    assert lookup(data, "backbones.timm_convnext_tiny.fb_in1k") == {"lr": 1}  # a dotted name, whole
    assert lookup(data, "a.b.c") == 2 and lookup(data, "params.yaml") is data
    with pytest.raises(KeyError):
        lookup(data, "a.b.d")


PLACEHOLDER = """import os, sys
from pathlib import Path
for out in map(Path, sys.argv[2:]):  # argv[1]: the stage script it stands in for
    if out.suffix:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(os.environ.get("DVC_STAGE", "") + "\\n")
    else:
        out.mkdir(parents=True, exist_ok=True)
        (out / "part").write_text(os.environ.get("DVC_STAGE", "") + "\\n")
"""


@pytest.fixture
def small_grid(tmp_path: Path) -> Path:
    """This checkout's pipeline over 1 dataset x 1 backbone x 2 losses x 1 dim x 1 seed, in a git + DVC
    repository; every command a placeholder writing its outputs (naming the script it stands in for,
    whose code the manifest holds), but validate writes the real manifests."""
    root = tmp_path / "grid"
    root.mkdir()
    for name in ("src", "stages"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "weights.lock", root / "weights.lock")  # a dependency of validate
    params = _params(ROOT)
    params["losses"] = {name: params["losses"][name] for name in sorted(params["losses"])[:2]}
    params["dims"], params["seeds"] = params["dims"][:1], params["seeds"][:1]
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    pipeline = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    for name, stage in pipeline["stages"].items():
        body = stage.get("do", stage)
        outs = [o if isinstance(o, str) else next(iter(o)) for k in ("outs", "metrics") for o in body.get(k) or []]
        script = next(word for word in body["cmd"].split() if word.startswith("stages/"))
        body["cmd"] = f"python placeholder.py {script} " + " ".join(o for o in outs if o != MANIFEST_DIR.as_posix())
        if name == "validate":
            write = "from dmlbench.pipeline.manifests import write_manifests; write_manifests()"
            body["cmd"] = f'PYTHONPATH=src python -c "{write}" && ' + body["cmd"]
    pipeline.pop("plots", None)
    (root / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    (root / "placeholder.py").write_text(PLACEHOLDER)
    (root / ".gitignore").write_text("/artifacts\n/reports\n")
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(command, cwd=root, check=True, env=env)
    return root


def test_after_an_edit_dvc_lists_validate_and_the_runner_runs_only_what_reads_the_edit(small_grid, monkeypatch):
    from dmlbench.pipeline.local import plan_after_validate, run_parallel

    root = small_grid
    monkeypatch.chdir(root)
    first = plan_after_validate(root)  # validate ran first (recorded), then the plan: everything else
    assert "validate" not in first.order and len(first.order) == first.total - 1
    assert len(list((root / MANIFEST_DIR).iterdir())) == first.total - 1
    assert run_parallel(first, 2, [], root=root, progress=False) == []
    status = subprocess.run(
        [sys.executable, "-m", "dvc", "status"], cwd=root, capture_output=True, text=True, check=True
    )
    assert "Data and pipelines are up to date." in status.stdout, status.stdout
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    train = next(name for name in lock if name.startswith("train@"))
    assert "params" not in lock[train]  # the keys' values are in the manifest, its md5 in the lock
    assert [d["path"] for d in lock[train]["deps"]][0] == f"artifacts/inputs/{train}.json"

    params = _params(root)
    edited_loss, other_loss = sorted(params["losses"])
    params["losses"][edited_loss] = {"an_edit": 1}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"], cwd=root, capture_output=True, text=True, check=True
    )
    assert set(json.loads(status.stdout)) == {"validate"}  # DVC sees the edit at validate ...
    plan = plan_after_validate(root)  # ... which runs, rewriting the manifests: only the edited loss's changed
    assert plan.order, "the edited loss's stages must re-run"
    assert all(f"-{edited_loss}" in name or name == "report" for name in plan.order), plan.order
    assert not [name for name in plan.order if f"-{other_loss}" in name or name.startswith(("prepare@", "download@"))]
    assert run_parallel(plan, 2, [], root=root, progress=False) == []
    assert plan_after_validate(root).order == []


def test_a_failed_validate_keeps_the_manifests_and_every_other_stage_up_to_date(small_grid, monkeypatch):
    """A bad params edit under plain ``dvc repro``: validate fails in one line, and DVC (which removes
    a stage's outputs before running it, unless they persist) leaves the manifests as they were, so
    ``dvc status`` lists validate alone, not the whole grid."""
    from dmlbench.pipeline.local import plan_after_validate, run_parallel

    root = small_grid
    pipeline = yaml.safe_load((root / "dvc.yaml").read_text())
    pipeline["stages"]["validate"]["cmd"] = "PYTHONPATH=src python stages/validate.py"  # the real check
    (root / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    monkeypatch.chdir(root)
    plan = plan_after_validate(root)
    assert run_parallel(plan, 2, [], root=root, progress=False) == []
    before = _manifests(root)
    marker = (root / "artifacts/params.validated").read_text()

    params = _params(root)
    loss = sorted(params["losses"])[0]
    params["losses"][loss] = {"pos_margin": "wide"}  # a bad value of a key its stages read
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    failed = subprocess.run([sys.executable, "-m", "dvc", "repro", "validate"], cwd=root, env=env,
                            capture_output=True, text=True, check=False)  # fmt: skip
    (line,) = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert failed.returncode != 0 and f"losses.{loss}.pos_margin: Input should be a valid number" in line
    assert _manifests(root) == before and (root / "artifacts/params.validated").read_text() == marker
    status = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=root, capture_output=True,
                            text=True, check=True)  # fmt: skip
    assert set(json.loads(status.stdout)) == {"validate"}


def test_a_checkpoint_is_kept_across_an_edit_of_code_its_stage_does_not_read(
    pipeline_copy, small_raw_params, prepared_glyphs, monkeypatch, tmp_path
):
    """A training interrupted after epoch 1, DVC naming its stage (whose manifest keys the checkpoint):
    after an edit of the report's code and validate, its checkpoint is resumed and the training goes
    on from epoch 1; after an edit of the loss module and validate, it is not resumed."""
    from dmlbench.params.load import parse_params
    from dmlbench.params.run import run_config
    from dmlbench.train.checkpoint import load_checkpoint
    from dmlbench.train.loop import train

    root = pipeline_copy
    write_manifests(root)
    run = RunSpec("glyphs", "tiny_cnn", "multi_similarity", 32, 0)
    assert manifest_path(f"train@{run.key}", root).is_file()
    monkeypatch.setenv("DVC_STAGE", f"train@{run.key}")
    monkeypatch.setenv("DVC_ROOT", str(root))
    config, data = run_config(parse_params(small_raw_params), run), prepared_glyphs[1]  # 2 epochs

    class Killed(Exception):
        pass

    def kill_after_epoch_1(epoch, metrics):
        if epoch == 1:
            raise Killed

    def resumable_after_an_edit_of(path: str):
        """The checkpoint as the stage's re-run finds it after ``path`` was edited and validate ran."""
        file = root / path
        original = file.read_text()
        file.write_text(original + "\n# an edit\n")
        try:
            write_manifests(root)
            return load_checkpoint(tmp_path, config.config_hash)
        finally:
            file.write_text(original)
            write_manifests(root)

    with pytest.raises(Killed):
        train(config, data, checkpoint_dir=tmp_path, on_epoch=kill_after_epoch_1, device=torch.device("cpu"))
    state = resumable_after_an_edit_of("src/dmlbench/analysis/report.py")
    assert state is not None and state.epoch == 1
    resumed = train(config, data, checkpoint_dir=tmp_path, resume=state, device=torch.device("cpu"))
    assert resumed.resumed_from_epoch == 1 and [h["epoch"] for h in resumed.history] == [1, 2]
    assert resumable_after_an_edit_of(f"src/dmlbench/losses/{run.loss}.py") is None
    assert load_checkpoint(tmp_path, config.config_hash) is not None  # the edit undone


def test_a_repinned_weights_file_changes_only_the_manifests_of_the_stages_that_load_it(pipeline_copy, monkeypatch):
    """A backbone's Hub file pinned at another sha256/commit in the weights lock makes exactly the
    stages that read that backbone stale (their manifest changes, and the stage refuses in one line
    until validate re-writes it); the other backbone's stages and the data stages keep theirs."""
    from dmlbench.weights_lock import LOCK_ENV, LockEntry, record

    root = pipeline_copy
    params = _params(root)
    params["backbones"] = {"tiny_cnn": params["backbones"]["tiny_cnn"], "tiny_vit": {}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    lock = root / "elsewhere.lock"
    monkeypatch.setenv(LOCK_ENV, str(lock))
    tracked = root / "weights.lock"
    assert not tracked.exists()  # the copy holds no lock of its own
    name = "timm/test_vit.r160_in1k/model.safetensors"
    first = LockEntry("a" * 64, "https://hub.test/a", "1" * 40)
    record(name, first, lock)
    try:
        write_manifests(root, params, pins={"tiny_vit": {name: f"{first.sha256}@{first.revision}"}})
        before = _manifests(root)
        loading = {stage for stage, text in before.items() if name in json.loads(text).get("weights", {})}
        reads_vit = {
            stage
            for stage, text in before.items()
            if any(k == "backbones" or k.startswith("backbones.tiny_vit") for k in json.loads(text)["params"])
        }
        assert loading == reads_vit and any(s.startswith("train@") for s in loading)
        assert not [s for s in loading if s.startswith(("download@", "prepare@"))]
        cnn_trainings = [s for s in before if s.startswith("train@") and s not in loading]
        assert cnn_trainings  # the tiny_cnn runs: no weights entry
        trained = next(s for s in loading if s.startswith("train@"))
        check_manifest(trained, root)  # the lock holds what validate saw: passes

        lock.unlink()
        second = LockEntry("b" * 64, "https://hub.test/b", "2" * 40)
        record(name, second, lock)  # re-pinned by hand
        # the lock is not the weights.lock dvc.yaml tracks: the fix forces validate
        refused = rf"the entry {name} of .*elsewhere.lock changed after the validate .*dvc repro --force validate"
        with pytest.raises(ConfigError, match=refused):
            check_manifest(trained, root)
        monkeypatch.delenv(LOCK_ENV)
        monkeypatch.setenv("DVC_ROOT", str(root))  # as DVC runs the stage
        shutil.copy(lock, tracked)  # the tracked lock: a plain `dvc repro` re-runs validate
        plain = r"weights.lock changed after the validate stage wrote it; run `dvc repro`"
        with pytest.raises(ConfigError, match=plain):
            check_manifest(trained, root)
        monkeypatch.setenv(LOCK_ENV, str(lock))
        check_manifest(cnn_trainings[0], root)  # a stage that does not load it: still fresh
        write_manifests(root, params, pins={"tiny_vit": {name: f"{second.sha256}@{second.revision}"}})
        assert _changed(before, _manifests(root)) == loading
        check_manifest(trained, root)
    finally:
        tracked.unlink(missing_ok=True)
        shutil.copy(ROOT / "params.yaml", root / "params.yaml")
        write_manifests(root)
