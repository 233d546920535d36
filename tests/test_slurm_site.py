"""The Slurm executor on a real site's terms, with a stand-in Slurm (:mod:`helpers.fake_slurm`): per-kind
partition/account/QOS and GPU defaults on the sbatch line, presets forwarding every runner option
and carrying ``cluster:``, a submit limit never exceeded, jobs that set their own environment
(``--export=NONE``-like: no PATH of the venv, no variable of the submitting shell), jobs with the
network cut for real (``unshare -n``) after the fetch, the SQLite-on-NFS refusal, and the offline
switch of the download and weights code."""

from __future__ import annotations

import copy
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.archives import build_cub
from helpers.fake_slurm import install, submitted
from helpers.project import ROOT, dvc_project, run_checked

from dmlbench.errors import DataError, DmlbenchError
from dmlbench.params.cluster import ClusterConfig, cluster_settings
from dmlbench.params.complete import parse_complete as parse_params
from dmlbench.pipeline.cluster_checks import filesystem_type, require_tracking_for_cluster
from dmlbench.pipeline.slurm import sbatch_command


def _with_device(raw: dict, device: str, cluster: dict | None = None) -> dict:
    raw = copy.deepcopy(raw)
    raw["protocols"][raw["protocol"]]["device"] = device
    raw["cluster"] = cluster or {}
    return raw


def test_per_kind_partition_account_and_qos_reach_sbatch():
    config = ClusterConfig.model_validate({
        "partition": "cpu", "account": "lab", "qos": "normal",
        "stages": {"train": {"partition": "gpu", "qos": "gpu-long", "gpus": 2}, "report": {"account": "other"}},
    })  # fmt: skip
    train = sbatch_command("train@cub200-resnet50-triplet-512-0", config, [], Path("/l"), Path("/r"), "python")
    assert {"--partition=gpu", "--account=lab", "--qos=gpu-long", "--gres=gpu:2"} <= set(train)
    report = sbatch_command("report", config, [], Path("/l"), Path("/r"), "python")
    assert {"--partition=cpu", "--account=other", "--qos=normal"} <= set(report)
    assert not any(a.startswith("--gres") for a in report)


def test_gpu_kinds_get_one_gpu_when_the_grid_needs_one_unless_the_section_says_otherwise(default_raw_params):
    kinds = {"train": "train@a", "tune": "tune@a", "baseline": "baseline@a", "embed_pretrained": "embed_pretrained@a"}
    cuda = cluster_settings(parse_params(_with_device(default_raw_params, "cuda")))
    assert {kind: cuda.resources(stage).gpus for kind, stage in kinds.items()} == dict.fromkeys(kinds, 1)
    assert cuda.resources("evaluate@a").gpus == 0 and cuda.resources("prepare@a").gpus == 0
    auto = cluster_settings(parse_params(_with_device(default_raw_params, "auto")))
    assert all(auto.resources(stage).gpus == 0 for stage in kinds.values())
    own = {"stages": {"train": {"gpus": 4}, "baseline": {"gpus": 0}}}
    mine = cluster_settings(parse_params(_with_device(default_raw_params, "cuda", own)))
    assert mine.resources("train@a").gpus == 4 and mine.resources("baseline@a").gpus == 0
    assert mine.resources("tune@a").gpus == 1
    none = cluster_settings(parse_params(_with_device(default_raw_params, "cuda", {"default": {"gpus": 0}})))
    assert all(none.resources(stage).gpus == 0 for stage in kinds.values())


def test_a_preset_carries_cluster_and_forwards_every_runner_option(tmp_path, default_raw_params, monkeypatch):
    from dmlbench.params.presets import load_preset
    from dmlbench.pipeline import __main__ as pipeline

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(default_raw_params))
    (tmp_path / "presets").mkdir()
    grid = {key: default_raw_params[key] for key in ("datasets", "backbones", "losses", "dims", "seeds", "protocol")}
    cluster = {"partition": "gpu", "max_jobs": 20, "stages": {"train": {"qos": "long"}}}
    (tmp_path / "presets" / "site.yaml").write_text(yaml.safe_dump({**grid, "cluster": cluster}))
    preset = load_preset("site", tmp_path / "params.yaml")
    assert preset.raw["cluster"]["partition"] == "gpu"
    config = cluster_settings(preset.params)
    assert config.max_jobs == 20 and config.resources("train@x").qos == "long"
    calls = []
    monkeypatch.setattr(pipeline, "run_preset", lambda preset, file, forwarded, **_: calls.append(forwarded) or 0)
    monkeypatch.setattr(pipeline, "preflight", lambda *args, **kwargs: None)
    arguments = ["--params", str(tmp_path / "params.yaml"), "--preset", "site"]
    assert pipeline.main([*arguments, "--executor", "slurm", "--jobs", "3"]) == 0
    assert pipeline.main([*arguments, "--fetch-only"]) == 0
    assert calls == [["--executor", "slurm", "--jobs", "3"], ["--executor", "local", "--fetch-only"]]
    make = subprocess.run(["make", "-n", "repro", "PRESET=site", "EXECUTOR=slurm", f"STAMP={os.devnull}"],
                          cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    (line,) = [line for line in make.stdout.splitlines() if "dmlbench.pipeline" in line]
    assert "--executor slurm" in line and "--preset site" in line


MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
nfs.example:/home /home nfs4 rw,vers=4.2 0 0
10.0.0.1@o2ib:/scratch /scratch lustre rw 0 0
/dev/sdb1 /home/local\\040disk ext4 rw 0 0
"""


def test_sqlite_tracking_on_a_network_filesystem_is_refused_in_one_line(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS)
    assert filesystem_type(Path("/home/alice/dmlbench"), mounts) == "nfs4"
    assert filesystem_type(Path("/scratch/alice"), mounts) == "lustre"
    assert filesystem_type(Path("/home/local disk/x"), mounts) == "ext4"
    assert filesystem_type(Path("/tmp/x"), mounts) == "ext4"
    with pytest.raises(DmlbenchError) as error:
        require_tracking_for_cluster("sqlite:////home/alice/dmlbench/mlflow.db", mounts)
    message = str(error.value)
    assert "\n" not in message and "nfs4 file system" in message and "/home/alice/dmlbench/mlflow.db" in message
    assert "MLFLOW_TRACKING_URI" in message and "make server DATABASE_URL=postgresql://" in message
    assert "MLFLOW_ALLOW_FILE_STORE" not in message
    require_tracking_for_cluster("sqlite:////tmp/mlflow.db", mounts)  # a local disk: fine
    require_tracking_for_cluster("http://mlflow.example:5000", mounts)  # a server: fine


def test_offline_jobs_never_download_and_name_make_fetch(tmp_path, monkeypatch):
    from dmlbench.data.download import download
    from dmlbench.errors import WeightsError
    from dmlbench.models.weights import WeightsParams, resolve_weights, url_unreachable

    monkeypatch.setenv("DMLBENCH_OFFLINE", "1")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    # an address nothing answers on: a request would fail differently (refused), not name make fetch
    with pytest.raises(DataError) as error:
        download("http://127.0.0.1:9/CUB_200_2011.tgz", tmp_path / "data" / "CUB_200_2011.tgz")
    assert "CUB_200_2011.tgz is not in" in str(error.value) and "`make fetch`" in str(error.value)
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())
    params = WeightsParams(weights_url="http://127.0.0.1:9/resnet50-0676ba61.pth", weights_sha256="0676ba61")
    with pytest.raises(WeightsError) as weights_error:
        resolve_weights("resnet50", params)
    assert "resnet50-0676ba61.pth is not at" in str(weights_error.value) and "`make fetch`" in str(weights_error.value)
    assert "make fetch" in (url_unreachable("http://127.0.0.1:9/x") or "")


def _fan_out(stages: int) -> dict:
    # 3 s: long enough that the first jobs are still running when the third is submitted
    write = "import sys, time; time.sleep(3); open(sys.argv[1], 'w').write(sys.argv[1])"
    dvc = {f"s{i}": {"cmd": f'python -c "{write}" out{i}', "outs": [f"out{i}"]} for i in range(stages)}
    dvc["join"] = {"cmd": "python -c \"print('joined')\" > joined", "deps": [f"out{i}" for i in range(stages)],
                   "outs": ["joined"]}  # fmt: skip
    return {"stages": dvc}


def _slurm_project(tmp_path: Path, raw: dict, cluster: dict) -> tuple[Path, dict[str, str], Path]:
    root = tmp_path / "repo"
    env = dvc_project(root, {**raw, "cluster": cluster}, mlflow_db=tmp_path / "store" / "mlflow.db")
    state = tmp_path / "slurm"
    env.update(install(tmp_path / "bin", state))
    return root, env, state


@pytest.mark.slow
def test_a_submit_limit_is_never_exceeded_and_jobs_set_their_own_environment(tmp_path, small_raw_params):
    cluster = {"max_jobs": 3, "poll_seconds": [0.2, 1.0], "default": {"cpus": 1, "mem": "1G", "time": "10"}}
    root, env, state = _slurm_project(tmp_path, small_raw_params, cluster)
    (root / "dvc.yaml").write_text(yaml.safe_dump(_fan_out(8)))
    env["DVC_NO_ANALYTICS"] = "1"
    result = subprocess.run([sys.executable, "-m", "dmlbench.pipeline", "--executor", "slurm"], cwd=root, env=env,
                            capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    calls = submitted(state)
    assert len(calls) == 9 and max(call["in_flight"] for call in calls) <= 3
    assert int((state / "max_in_flight").read_text()) == 3  # the limit was used, never passed
    assert "3 stage(s) submitted to Slurm as jobs 1..3; 6 more as jobs end (cluster.max_jobs: 3)" in result.stdout
    join = next(call["args"] for call in calls if "--job-name=join" in call["args"])
    upstream = {call["job"] for call in calls if any(arg.startswith("--job-name=s") for arg in call["args"])}
    after = [arg.split(":")[1:] for arg in join if arg.startswith("--dependency=afterok:")]
    assert set(*after or [[]]) < upstream  # only the upstream jobs still in flight (the ended are gone)
    assert (root / "joined").read_text() == "joined\n"
    assert "Running stage" not in result.stdout  # the closing dvc repro found everything done by the jobs
    assert "up to date" in run_checked([sys.executable, "-m", "dvc", "status"], root, env).stdout
    # the jobs ran with PATH=/usr/bin:/bin and no variable of this shell: the job script set them
    env_file = root / "artifacts" / "logs" / "slurm-job.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    exported = env_file.read_text()
    assert "DMLBENCH_OFFLINE=1" in exported and f"MLFLOW_TRACKING_URI={env['MLFLOW_TRACKING_URI']}" in exported
    wrap = next(arg for arg in join if arg.startswith("--wrap="))
    assert wrap.startswith(f"--wrap=export PATH={Path(sys.executable).parent}:") and str(env_file) in wrap


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False).returncode == 0
    except FileNotFoundError:
        return False


PROBE = """\
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=5)
except OSError as exc:
    open("probe.txt", "w").write(f"no network: {exc}")
else:
    sys.exit("the job reached the network")
"""


@pytest.mark.slow
@pytest.mark.skipif(not _unshare_works(), reason="unshare -n (a network namespace) is not permitted here")
def test_jobs_run_with_the_network_cut_after_the_fetch(tmp_path, small_raw_params, file_server):
    """The fetch downloads the real-format CUB archive from a 127.0.0.1 mirror; then every job runs
    in a network namespace of its own (no route at all) and the download stage unpacks it offline."""
    from dmlbench.io import md5_file

    archive = build_cub(tmp_path / "built")["files"][0]
    (file_server.root / archive.name).write_bytes(archive.read_bytes())
    raw = copy.deepcopy(small_raw_params)
    raw["datasets"] = {"cub200": {"source": {"archive": {"url": f"{file_server.url}/{archive.name}",
                                                         "md5": md5_file(archive)},
                                             "allow_subset": True}}}  # fmt: skip
    cluster = {"poll_seconds": [0.2, 1.0], "default": {"cpus": 1, "mem": "1G", "time": "10"}}
    root, env, state = _slurm_project(tmp_path, raw, cluster)
    pipeline = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    stages = {"download": pipeline["stages"]["download"]}
    deps = stages["download"]["do"]["deps"]  # no validate here, so no inputs manifest to depend on
    stages["download"]["do"]["deps"] = [dep for dep in deps if not dep.startswith("artifacts/inputs/")]
    (root / "probe.py").write_text(PROBE)
    stages["probe"] = {"cmd": f"python probe.py {file_server.url}/{archive.name}", "outs": ["probe.txt"]}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        env.pop(name, None)
    fetched = run_checked([sys.executable, "-m", "dmlbench.pipeline", "--fetch-only"], root, env)
    assert "fetched:" in fetched.stdout and (root / "data" / archive.name).is_file()
    served = len(file_server.requests)
    env["FAKE_SLURM_NETNS"] = "1"
    result = subprocess.run([sys.executable, "-m", "dmlbench.pipeline", "--executor", "slurm"], cwd=root, env=env,
                            capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(submitted(state)) == 2 and len(file_server.requests) == served  # nothing more was downloaded
    assert (root / "probe.txt").read_text().startswith("no network")  # the jobs had no route out
    assert (root / "artifacts" / "raw" / "cub200" / "archives.json").is_file()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://alice:s3cret@db.example/mlflow", "DATABASE_URL holds a password: put it in ~/.pgpass"),
        ("mysql://alice@db.example/mlflow", "DATABASE_URL: expected postgresql://<user>@<host>/<db>"),
    ],
)
def test_make_server_on_an_existing_database_refuses_a_bad_url_in_one_line(tmp_path, url, message):
    env = {**os.environ, "DMLBENCH_DATABASE_URL": url, "DMLBENCH_CLUSTER_DIR": str(tmp_path / "state")}
    result = subprocess.run(["bash", str(ROOT / "cluster" / "server.sh")], env=env, capture_output=True, text=True,
                            check=False)  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and message in lines[0], result.stderr
    assert "s3cret" not in result.stderr + result.stdout
