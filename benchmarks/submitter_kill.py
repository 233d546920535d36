"""What a killed submitter costs: the pipeline killed with SIGKILL right after a training finished,
then started again at once, on a small glyphs grid; prints what ran twice.

``--executor local``: ``make repro``'s runner (``--jobs 2``) killed 0.5 s after a training's
``done`` line (``--tree``: with every process under it). ``--executor slurm``: the Slurm executor on
the project's stand-in Slurm (``tests/helpers/fake_slurm.py``), ``cluster.max_jobs: 3``, killed once a
training job was reported done. Either way the same command is then started again and run to the
end. Printed: jobs or stages started more than once (Slurm: ``sbatch`` calls per job name), trainings
whose MLflow runs (deleted ones included) are not exactly one FINISHED run (a training started over
from epoch 0 makes a new run), and ``dvc status`` at the end.

    python benchmarks/submitter_kill.py --executor slurm            # 3 losses x 2 seeds
    python benchmarks/submitter_kill.py --executor local [--tree]   # 3 losses x 1 seed
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.fake_slurm import install, submitted  # noqa: E402
from helpers.project import dvc_project, small_params_dict  # noqa: E402


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found += [child]
            todo.append(child)
    return found


def _training_runs(uri: str) -> dict[str, list[str]]:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    by_key: dict[str, list[str]] = {}
    for run in client.search_runs(experiments, "tags.kind = 'train'", run_view_type=ViewType.ALL, max_results=1000):
        by_key.setdefault(run.data.tags["grid_key"], []).append(run.info.status)
    return by_key


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executor", choices=["local", "slurm"], default="slurm")
    parser.add_argument("--tree", action="store_true", help="local: kill every process under the runner too")
    args = parser.parse_args()
    raw = small_params_dict(yaml.safe_load((ROOT / "params.yaml").read_text()))
    raw["losses"] = {loss: raw["losses"][loss] for loss in ("contrastive", "triplet", "multi_similarity")}
    raw["dims"], raw["seeds"] = [32], [0, 1] if args.executor == "slurm" else [0]
    raw["protocols"][raw["protocol"]]["epochs"] = 3
    raw["cluster"] = {"max_jobs": 3, "poll_seconds": [0.5, 2.0], "default": {"cpus": 1, "mem": "2G", "time": "30"}}
    work = Path(tempfile.mkdtemp(prefix="submitter-kill-"))
    root = work / "repo"
    env = dvc_project(root, raw, mlflow_db=work / "mlflow.db")
    env["PYTHONUNBUFFERED"] = "1"
    command = [sys.executable, "-m", "dmlbench.pipeline"]
    if args.executor == "slurm":
        env.update(install(work / "bin", work / "slurm"))
        command += ["--executor", "slurm"]
    else:
        command += ["--jobs", "2"]
    started = time.perf_counter()
    runner = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert runner.stdout is not None
    for line in runner.stdout:
        if line.startswith("done") and "train@" in line:
            time.sleep(0.5)
            break
    tree = _descendants(runner.pid) if args.tree else []
    runner.kill()
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    runner.wait()
    jobs_before = len(submitted(work / "slurm")) if args.executor == "slurm" else 0
    again = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    status = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=root, env=env, capture_output=True,
                            text=True, check=False).stdout.strip()  # fmt: skip
    runs = _training_runs(env["MLFLOW_TRACKING_URI"])
    print(f"executor {args.executor}{' (process tree killed)' if args.tree else ''}; work in {work}")
    if args.executor == "slurm":
        names = Counter(next(a for a in call["args"] if a.startswith("--job-name=")).split("=", 1)[1]
                        for call in submitted(work / "slurm"))  # fmt: skip
        twice = sorted(name for name, count in names.items() if count > 1)
        print(f"jobs submitted before the kill: {jobs_before}; in all: {sum(names.values())}")
        print(f"stages submitted more than once: {len(twice)} {twice}")
    wrong = {key: statuses for key, statuses in runs.items() if statuses != ["FINISHED"]}
    print(f"trainings: {len(runs)}; without exactly one FINISHED MLflow run (deleted included): {len(wrong)} {wrong}")
    print(f"second run exit {again.returncode}; dvc status: {status.splitlines()[0] if status else '?'}")
    print(f"wall: {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
