"""GPUs enforced and stores reachable on Slurm, with the stand-in Slurm (:mod:`helpers.fake_slurm`, whose jobs
run on this machine: no GPU here).

* a job that asked for a GPU runs with ``DMLBENCH_DEVICE=cuda``: on a node without a usable GPU its
  stage refuses in one line (a CPU job beside it runs on the CPU);
* the probe job: with the GPU kind's resources before the grid; where it fails, nothing of the grid is
  submitted and one line says what it found and where its log is; it passes on a reachable store;
* a loopback tracking server (or database), or a store on this machine's disk, is refused in one line
  before anything is submitted, unless every node is this machine;
* a job's share of a GPU is read from Slurm (MPS percentage, shards of the node's).
"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.fake_slurm import inject, install, submitted
from helpers.project import dvc_project

from dmlbench import devices
from dmlbench.errors import DmlbenchError
from dmlbench.launch import write_job_environment
from dmlbench.params.cluster import ClusterConfig
from dmlbench.params.complete import parse_complete as parse_params
from dmlbench.pipeline.job import spec_path
from dmlbench.pipeline.probe import ProbeJob, probe_command, run_probe
from dmlbench.pipeline.reachability import reachability_problems
from dmlbench.pipeline.slurm import Submission, job_environment, states

STAGE = '''"""A stand-in stage: the device a stage gets."""
from dmlbench.cli import main, stage_parser
from dmlbench.devices import default_device

main(stage_parser(__doc__), lambda loaded, args: print("device", default_device()), load=lambda args: None)
'''


def test_a_gpu_job_on_a_node_without_a_gpu_refuses_in_one_line(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "stage.py").write_text(STAGE)
    env = install(tmp_path / "bin", tmp_path / "slurm")
    monkeypatch.chdir(root)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DMLBENCH_DEVICE", raising=False)
    order = ["train@gpu", "evaluate@cpu"]
    for stage in order:
        path = spec_path(stage)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"stage": stage, "lines": ["python stage.py"], "cwd": str(root), "env": {},
                                    "remove": []}))  # fmt: skip
    env_file = (root / "artifacts" / "logs" / "slurm-job.env").resolve()
    write_job_environment(env_file, job_environment(dict(os.environ), env_file))
    config = ClusterConfig.model_validate({
        "poll_seconds": [0.2, 0.5], "default": {"cpus": 1, "mem": "1G", "time": "10"},
        "stages": {"train": {"gpus": 1, "partition": "gpu"}},
    })  # fmt: skip
    final = Submission(order, {}, config, root, Path("artifacts/logs"), env_file=env_file).run()
    assert final == {"train@gpu": "FAILED", "evaluate@cpu": "COMPLETED"}
    train = next(call["args"] for call in submitted(tmp_path / "slurm") if "--job-name=train@gpu" in call["args"])
    assert "--gres=gpu:1" in train and "--partition=gpu" in train
    log = [line for line in (root / "artifacts/logs/train@gpu.log").read_text().splitlines() if line.strip()]
    assert len(log) == 1 and "Traceback" not in log[0], log  # one line, no fall-back to the CPU
    assert log[0].startswith(
        f"error: Slurm job 1 on node {socket.gethostname()} needs a CUDA GPU (DMLBENCH_DEVICE=cuda"
    )
    assert "torch" in log[0] and ("sees no CUDA GPU" in log[0] or "CPU-only build" in log[0])
    assert (root / "artifacts/logs/evaluate@cpu.log").read_text().strip() == "device cpu"  # asked for none


def _project(tmp_path: Path, raw: dict, cluster: dict) -> tuple[Path, dict[str, str], Path]:
    root = tmp_path / "repo"
    env = dvc_project(root, {**raw, "cluster": cluster}, mlflow_db=tmp_path / "store" / "mlflow.db")
    write = "import sys; open(sys.argv[1], 'w').write('done')"
    stages = {f"train@s{i}": {"cmd": f'python -c "{write}" out{i}', "outs": [f"out{i}"]} for i in range(2)}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {name.replace("@", "_"): stage
                                                              for name, stage in stages.items()}}))  # fmt: skip
    env.update(install(tmp_path / "bin", tmp_path / "slurm"), DVC_NO_ANALYTICS="1")
    return root, env, tmp_path / "slurm"


def _runner(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dmlbench.pipeline", "--executor", "slurm"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip


def test_stores_out_of_reach_and_a_failing_probe_stop_the_grid_before_any_submission(tmp_path, small_raw_params):
    cluster = {"poll_seconds": [0.2, 1.0], "partition": "cpu",
               "default": {"cpus": 1, "mem": "1G", "time": "10", "gpus": 1, "partition": "gpu"}}  # fmt: skip
    root, env, state = _project(tmp_path, small_raw_params, cluster)
    # a loopback tracking server on a cluster of other nodes: refused before validate, before any job
    refused = _runner(root, {**env, "MLFLOW_TRACKING_URI": "http://127.0.0.1:5001", "FAKE_SLURM_NODES": "n1,n2"})
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert "MLFLOW_TRACKING_URI=http://127.0.0.1:5001 is this machine's loopback address" in line
    assert "compute nodes (n1, n2) cannot reach" in line and f"http://{socket.getfqdn()}:5001" in line
    assert submitted(state) == [] and not (root / "artifacts").exists()
    # every node is this machine (the stand-in's one node): the SQLite store is fine; the grid asks for
    # GPUs, the probe job finds none on the node: one line, and the grid is not submitted
    probed = _runner(root, env)
    assert probed.returncode == 2, probed.stdout + probed.stderr
    (line,) = [line for line in probed.stderr.splitlines() if line.startswith("error:")]
    log = root / "artifacts" / "logs" / "dmlbench-probe.log"
    assert line.startswith(f"error: probe job 1 on Slurm job 1 on node {socket.gethostname()}: gpu: torch ")
    assert f"nothing of the grid submitted (log: {log})" in line
    (call,) = submitted(state)  # the probe alone
    assert {"--job-name=dmlbench-probe", "--gres=gpu:1", "--partition=gpu", "--time=5", "--no-requeue"} <= set(
        call["args"]
    )
    assert "FAILED gpu:" in log.read_text() and "tracking: sqlite:" in log.read_text()
    assert not (root / "out0").exists() and not (root / "out1").exists()


def test_a_re_attach_with_nothing_new_to_submit_adopts_its_jobs_without_a_probe(tmp_path, small_raw_params):
    """The probe checks a node for what is about to be submitted; jobs an earlier run left in Slurm's
    hands passed the probe of that run and are adopted at once. Here the grid's kind asks for a GPU
    only after its jobs were submitted: a probe on re-attach would find none on the node and stop."""
    cpu = {"poll_seconds": [0.2, 1.0], "default": {"cpus": 1, "mem": "1G", "time": "10"}}
    root, env, state = _project(tmp_path, small_raw_params, cpu)
    inject(state, *({"name": f"train_s{i}", "reason": "JobHeldUser", "seconds": 10} for i in range(2)))
    detached = subprocess.run([sys.executable, "-m", "dmlbench.pipeline", "--executor", "slurm", "--detach"],
                              cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert detached.returncode == 0 and "detached: 2 job(s)" in detached.stderr, detached.stdout + detached.stderr
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["cluster"]["default"]["gpus"] = 1
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    attached = subprocess.run([sys.executable, "-m", "dmlbench.pipeline", "--executor", "slurm", "--attach"],
                              cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    said = attached.stdout + attached.stderr
    assert attached.returncode == 0, said
    taken_over = said.count("adopted ") + said.count("completed while nobody watched")  # (held 10 s: mostly adopted)
    assert "probe" not in said and taken_over == 2, said
    names = [next(a for a in call["args"] if a.startswith("--job-name=")) for call in submitted(state)]
    assert sorted(names) == ["--job-name=train_s0", "--job-name=train_s1"]  # each once, no probe job
    assert (root / "out0").read_text() == "done" and (root / "out1").read_text() == "done"


def test_the_probe_passes_on_a_store_that_holds_the_experiment_and_fails_on_another(tmp_path, monkeypatch, capsys):
    from dmlbench.tracking.store import ensure_experiment

    monkeypatch.chdir(tmp_path)
    for key, value in install(tmp_path / "bin", tmp_path / "slurm").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    ensure_experiment("grid")
    env_file = (tmp_path / "job.env").resolve()
    write_job_environment(env_file, job_environment(dict(os.environ), env_file))
    job = ProbeJob("train@x", gpu=False, storage=None)
    from dmlbench.launch import job_script

    def sbatch(experiment: str) -> list[str]:
        command = probe_command(job, experiment, tmp_path / "logs" / "dmlbench-probe.json")
        return ["sbatch", "--parsable", "--job-name=dmlbench-probe", f"--chdir={tmp_path}",
                f"--wrap={job_script(command, env_file)}"]  # fmt: skip

    run_probe(sbatch("grid"), job, "grid", tmp_path / "logs", states, poll=0.2)
    out = capsys.readouterr().out
    assert f"probe job 1 passed on Slurm job 1 on node {socket.gethostname()}: tracking: sqlite:" in out
    with pytest.raises(DmlbenchError) as failed:
        run_probe(sbatch("other"), job, "other", tmp_path / "logs", states, poll=0.2)
    assert "\n" not in str(failed.value) and "holds no experiment 'other' (not the run's store)" in str(failed.value)


def _params(raw: dict, storage: str | None = None):
    raw = copy.deepcopy(raw)
    raw["tuning"]["storage"] = storage
    return parse_params(raw)


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5001", "http://localhost:5001", "http://[::1]:5001",
                                 "https://127.0.1.1"])  # fmt: skip
def test_a_loopback_tracking_server_is_refused_unless_every_node_is_this_machine(default_raw_params, monkeypatch, uri):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    params = _params(default_raw_params)
    (problem,) = reachability_problems(params, nodes=["gpu01", "gpu02"])
    assert f"MLFLOW_TRACKING_URI={uri} is this machine's loopback address" in problem and "\n" not in problem
    assert reachability_problems(params, nodes=[socket.gethostname()]) == []  # a single-node cluster here
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.lab.example:5000")
    assert reachability_problems(params, nodes=["gpu01"]) == []


def test_a_store_or_database_of_this_machine_alone_is_refused(default_raw_params, monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    (problem,) = reachability_problems(_params(default_raw_params), nodes=["gpu01"])
    assert f"MLflow's SQLite store {tmp_path / 'mlflow.db'} is on this machine's own disk" in problem
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.lab.example:5000")
    for storage in (
        "postgresql://me@127.0.0.1:5432/optuna",
        "postgresql://me@localhost/optuna",
        "postgresql:///optuna",
    ):
        (problem,) = reachability_problems(_params(default_raw_params, storage), nodes=["gpu01"])
        assert problem.startswith("--executor slurm: tuning.storage reaches the database at") and "gpu01" in problem
    assert reachability_problems(_params(default_raw_params, "postgresql://me@db.lab/optuna"), nodes=["gpu01"]) == []


SCONTROL = ("NodeName=gpu07 Arch=x86_64 CoresPerSocket=32 Gres=gpu:h100:4(S:0-1),shard:h100:32(S:0-1) "
            "NodeAddr=gpu07 NodeHostName=gpu07 State=MIXED")  # fmt: skip


def test_a_jobs_share_of_its_gpu_is_read_from_slurm(monkeypatch):
    monkeypatch.setattr(devices.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, SCONTROL, ""))  # fmt: skip
    assert devices.node_gres("gpu07") == {"gpu": 4, "shard": 32}
    job = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "gpu07", "DMLBENCH_GPU_SHARE": "4"}
    assert devices.gpu_share({**job, "SLURM_SHARDS_ON_NODE": "2"}) == 4.0  # 2 of the node's 8 shards per GPU
    assert devices.gpu_share({**job, "SLURM_SHARDS_ON_NODE": "8"}) == 1.0
    assert devices.gpu_share({**job, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}) == 4.0
    assert devices.gpu_share(job) == 1.0  # a whole GPU: the executor's assumed share does not apply
    assert devices.gpu_share({"DMLBENCH_GPU_SHARE": "3"}) == 3.0  # the local executor's workers
    assert devices.gpu_share({}) == 1.0
    monkeypatch.setattr(devices.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "no"))
    assert devices.gpu_share({**job, "SLURM_SHARDS_ON_NODE": "2"}) == 4.0  # the node not known: the assumed share


@pytest.mark.parametrize(
    ("host", "public", "addresses"),
    [
        ("127.0.0.1", "", "http://127.0.0.1:5001 -"),  # this machine only: no address for the compute nodes
        ("0.0.0.0", "login.example", "http://127.0.0.1:5001 http://login.example:5001"),
        ("10.1.2.3", "", "http://10.1.2.3:5001 http://10.1.2.3:5001"),
    ],
)
def test_make_server_names_the_address_the_compute_nodes_reach(host, public, addresses):
    from helpers.project import ROOT

    env = {**os.environ, "DMLBENCH_MLFLOW_PUBLIC_HOST": public}
    shown = subprocess.run(["bash", "-c", f'source "{ROOT}/cluster/lib.sh" && mlflow_addresses {host} 5001'], env=env,
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert shown.stdout.strip() == addresses
