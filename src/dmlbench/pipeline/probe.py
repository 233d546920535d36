"""The probe: one short Slurm job, before the grid, that checks a compute node can run it.

Submitted with the resources of the grid's GPU kind (a time limit of :data:`PROBE_TIME` minutes,
not requeued) when a compute node must reach what this machine cannot check for it (a GPU, a
tracking or tuning server); the grid is submitted only when it passed. In the job
(``python -m dmlbench.pipeline.probe``): a usable GPU (:func:`dmlbench.devices.cuda_problem`) and
its share (:func:`dmlbench.devices.gpu_share`), an MLflow store that answers and holds the run's
experiment (else it is another store, e.g. a node's own SQLite file), the Optuna storage when set.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from dmlbench.errors import DmlbenchError
from dmlbench.launch import job_script, resource_args
from dmlbench.params.cluster import ClusterConfig
from dmlbench.params.model import Params
from dmlbench.params.tuning import tuning_settings

PROBE_TIME = "5"  # minutes: importing torch and mlflow from a network file system can take one
JOB_NAME = "dmlbench-probe"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED", "SPECIAL_EXIT"}  # fmt: skip
PENDING_NOTICE_SECONDS = 60.0
UNKNOWN_POLLS = 10  # polls in a row in which Slurm knows nothing of the probe: it is over
STORE_TIMEOUT_SECONDS = 20


# --------------------------------------------------------------------------- in the job


def check_gpu() -> tuple[str, str | None]:
    """(what the node has, the problem or None): the device pre-flight, and the job's share."""
    from dmlbench import devices

    facts = devices.cuda_facts()
    problem = devices.cuda_problem(facts)
    driver = facts.driver or devices.nvidia_smi()[0] or "unknown"
    gpus = ", ".join(gpu.name for gpu in facts.gpus) or "no GPU"
    share = devices.gpu_share()
    found = f"{gpus}; driver {driver}; torch {facts.torch_version} (CUDA {facts.build or 'none'})"
    return found + (f"; 1/{share:g} of the GPU" if share > 1 else ""), problem


def check_tracking(experiment: str) -> tuple[str, str | None]:
    """(the store, the problem or None): it answers and holds ``experiment``."""
    from dmlbench.tracking.store import configure_background_client, sqlite_path, tracking_uri

    uri = tracking_uri()
    database = sqlite_path(uri)
    if database is not None and not database.exists():  # MLflow would create a store of this node's own
        return uri, f"the MLflow SQLite store {database} does not exist on this node (not the file the run uses)"
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(STORE_TIMEOUT_SECONDS))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    configure_background_client()
    try:
        from mlflow.tracking import MlflowClient

        found = MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment)
    except Exception as exc:
        detail = str(exc).splitlines()[0][:300] if str(exc) else ""
        return uri, f"the MLflow store {uri} does not answer from this node ({type(exc).__name__}: {detail})"
    if found is None:
        return uri, f"the MLflow store {uri} answers but holds no experiment {experiment!r} (not the run's store)"
    return uri, None


def check_database(url: str) -> tuple[str, str | None]:
    """(the database's host, the problem or None): a connection to the Optuna storage opens."""
    parsed = urlparse(url)
    where = f"{parsed.hostname or 'a local socket'}:{parsed.port or ''}".rstrip(":")
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": STORE_TIMEOUT_SECONDS})
        with engine.connect():
            pass
        engine.dispose()
    except Exception as exc:
        detail = str(exc).splitlines()[0][:300] if str(exc) else ""
        return where, f"the tuning storage at {where} does not answer from this node ({type(exc).__name__}: {detail})"
    return where, None


def probe(experiment: str, gpu: bool, storage: str | None) -> dict:
    """Every check this job was asked for: ``{"node", "checks": {name: found}, "problems": [...]}``."""
    from dmlbench.devices import where

    checks, problems = {}, []
    steps: list[tuple[str, Callable[[], tuple[str, str | None]]]] = []
    if gpu:
        steps.append(("gpu", check_gpu))
    steps.append(("tracking", lambda: check_tracking(experiment)))
    if storage:
        steps.append(("tuning storage", lambda: check_database(storage)))
    for name, check in steps:
        found, problem = check()
        checks[name] = found
        if problem:
            problems.append(f"{name}: {problem}")
    return {"node": where(), "checks": checks, "problems": problems}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the Slurm executor's probe job (run inside the job)")
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--gpu", action="store_true", help="the job asked for a GPU: check it")
    parser.add_argument("--storage", default=None, help="the Optuna storage URL to connect to")
    parser.add_argument("--out", type=Path, required=True, help="where the JSON result goes")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # Slurm's warning before the time limit: finish the checks
    result = probe(args.experiment, args.gpu, args.storage)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for name, found in result["checks"].items():
        print(f"probe {result['node']}: {name}: {found}", flush=True)
    for problem in result["problems"]:
        print(f"probe {result['node']}: FAILED {problem}", flush=True)
    return 1 if result["problems"] else 0


# --------------------------------------------------------------------------- on the submitting node


@dataclass(frozen=True)
class ProbeJob:
    """What to probe: the resources of ``stage``'s kind, with or without its GPU."""

    stage: str
    gpu: bool
    storage: str | None


def probe_job(stages: Sequence[str], gpus_of: Callable[[str], int], tracking: str,
              storage: str | None) -> ProbeJob | None:  # fmt: skip
    """The probe the plan's job ``stages`` need (``gpus_of``: a stage's GPU count), or None: the
    first stage that asks for a GPU; else, where the tracking store or the tuning storage is a
    server, the first training (or the first job)."""
    if not stages:
        return None
    gpu_stage = next((stage for stage in stages if gpus_of(stage)), None)
    server = urlparse(tracking).scheme in ("http", "https") or bool(storage)
    if gpu_stage is None and not server:
        return None
    stage = gpu_stage or next((s for s in stages if s.startswith("train@")), stages[0])
    return ProbeJob(stage, gpu_stage is not None, storage)


def probe_command(job: ProbeJob, experiment: str, out: Path, python: str = sys.executable) -> str:
    parts = [python, "-m", "dmlbench.pipeline.probe", "--experiment", experiment, "--out", str(out)]
    parts += ["--gpu"] if job.gpu else []
    parts += ["--storage", job.storage] if job.storage else []
    return " ".join(shlex.quote(part) for part in parts)


def wait_for(job_id: str, states: Callable[[list[str]], dict[str, str]], poll: float, log: Path) -> str:
    """Slurm's final state of ``job_id`` (``UNKNOWN`` when Slurm stopped knowing it: no accounting,
    and its record expired); a line when it is still pending after :data:`PENDING_NOTICE_SECONDS`;
    ``scancel`` on an interrupt."""
    started, noticed, unknown = time.monotonic(), False, 0
    try:
        while True:
            state = states([job_id]).get(job_id, "UNKNOWN")
            unknown = unknown + 1 if state == "UNKNOWN" else 0
            if state in ENDED or unknown >= UNKNOWN_POLLS:
                return state
            if state == "PENDING" and not noticed and time.monotonic() - started > PENDING_NOTICE_SECONDS:
                print(f"probe job {job_id} still pending (squeue --me --jobs {job_id} says why); the grid is "
                      "submitted once it has run", flush=True)  # fmt: skip
                noticed = True
            time.sleep(poll)
    except KeyboardInterrupt:
        subprocess.run(["scancel", job_id], check=False, capture_output=True)
        print(f"interrupted: probe job {job_id} cancelled; nothing submitted (its log: {log})", file=sys.stderr)
        raise


def run_probe(sbatch: list[str], job: ProbeJob, experiment: str, log_dir: Path,
              states: Callable[[list[str]], dict[str, str]], poll: float) -> None:  # fmt: skip
    """Submit the probe (``sbatch``: its command line up to ``--wrap``, built by the executor with
    the kind's resources) and wait for it; :class:`DmlbenchError` in one line when it did not pass
    (what it found, its log), so that nothing of the grid is submitted."""
    log, out = (log_dir / f"{JOB_NAME}.log").resolve(), (log_dir / f"{JOB_NAME}.json").resolve()
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    out.unlink(missing_ok=True)
    submitted = subprocess.run([*sbatch, f"--output={log}"], capture_output=True, text=True, check=False)
    if submitted.returncode != 0:
        raise DmlbenchError(f"sbatch refused the probe job: {submitted.stderr.strip()} (nothing of the grid submitted)")
    job_id = submitted.stdout.strip().split(";")[0]
    what = "its GPU, " if job.gpu else ""
    print(f"probe job {job_id}: checking a compute node ({what}the tracking store) with the resources of "
          f"{job.stage.split('@')[0]} jobs before the grid (log: {log})", flush=True)  # fmt: skip
    state = wait_for(job_id, states, poll, log)
    result = json.loads(out.read_text()) if out.exists() else None
    if state in ("COMPLETED", "UNKNOWN") and result is not None and not result["problems"]:
        found = "; ".join(f"{name}: {value}" for name, value in result["checks"].items())
        print(f"probe job {job_id} passed on {result['node']}: {found}", flush=True)
        return
    if result is not None and result["problems"]:
        why = "; ".join(result["problems"])
        where = result["node"]
        raise DmlbenchError(f"probe job {job_id} on {where}: {why}; nothing of the grid submitted (log: {log})")
    tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:] or ["no output"]
    raise DmlbenchError(f"probe job {job_id} ended {state} without a result ({tail[0][:300]}); nothing of the grid "
                        f"submitted (log: {log})")  # fmt: skip


def probe_grid(params: Params, config: ClusterConfig, stages: Sequence[str], env_file: Path | None, log_dir: Path,
               states: Callable[[list[str]], dict[str, str]], python: str = sys.executable) -> None:  # fmt: skip
    """Probe a compute node for the plan's job ``stages`` (:func:`probe_job`; nothing to probe:
    nothing done): one job with the resources of their GPU kind and a short time limit, not
    requeued, its environment from ``env_file`` as every job's; :class:`DmlbenchError` in one
    line when it did not pass."""
    from dmlbench.tracking.store import tracking_uri

    storage = tuning_settings(params).storage if any(stage.startswith("tune@") for stage in stages) else None
    job = probe_job(stages, lambda stage: config.resources(stage).gpus or 0, tracking_uri(), storage)
    if job is None:
        return
    resources = config.resources(job.stage).model_copy(update={"time": PROBE_TIME})
    out = (log_dir / f"{JOB_NAME}.json").resolve()
    command = probe_command(job, params.tracking.experiment, out, python)
    sbatch = [
        "sbatch", "--parsable", f"--job-name={JOB_NAME}", f"--chdir={Path.cwd()}",
        *resource_args(config.model_copy(update={"requeue": False}), resources), *config.extra_args,
        f"--wrap={job_script(command, env_file, resources.gpus)}",
    ]  # fmt: skip
    run_probe(sbatch, job, params.tracking.experiment, log_dir, states, poll=config.poll_seconds[0])


if __name__ == "__main__":
    sys.exit(main())
