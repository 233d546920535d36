"""Run ``dvc repro`` with independent stages in parallel: ``python -m dmlbench.pipeline``.

``dvc repro`` runs one stage at a time (treeverse/dvc#755). This runner asks DVC for its
graph and for the stale stages, then runs every stale stage and everything downstream of
it, each as ``dvc --wait-for-lock repro --single-item <stage>`` in a pool of ``--jobs``
workers, a stage starting as soon as all its upstream stages are done. DVC still runs,
caches and locks every stage; the runner only decides the order. It ends with a plain
``dvc repro``, which must find everything up to date.

CPU: each worker gets ``cpu_count // jobs`` threads (``OMP_NUM_THREADS``), since small
models gain nothing from more threads and oversubscription slows everything. GPU box:
``--gpus 0,1,2,3`` runs one worker per GPU with ``CUDA_VISIBLE_DEVICES`` set per worker.
Each stage's output goes to ``artifacts/logs/<stage>.log``; a failing stage's tail is
printed and no new stage is started.

Before any stage: ``params.yaml`` is validated, every pinned weights file the grid needs must
be here or downloadable when the protocol is pretrained
(:func:`dmlbench.pipeline.preflight.preflight`): else nothing runs.

``--executor slurm`` hands the same plan to Slurm instead of the local pool: one job per stale
stage, ordered by ``afterok`` dependencies, resources from ``params.yaml``'s ``cluster:`` section
(:mod:`dmlbench.pipeline.slurm`); the command watches the jobs and reports a failed stage with its
log, then runs the same closing check.

``--preset <name>`` runs ``presets/<name>.yaml`` (:mod:`dmlbench.params.presets`) the same way, after
the same checks, in a workspace of its own (:mod:`dmlbench.pipeline.workspace`): the main checkout's
params.yaml and dvc.lock stay as they are.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from dmlbench import paths
from dmlbench.errors import DmlbenchError
from dmlbench.launch import worker_environment
from dmlbench.params.complete import load_complete
from dmlbench.params.presets import listing, load_preset
from dmlbench.pipeline.local import LOG_DIR, run_parallel
from dmlbench.pipeline.plan import make_plan, record_empty_dropbox
from dmlbench.pipeline.preflight import preflight
from dmlbench.pipeline.presets import run_preset
from dmlbench.pipeline.slurm import run_on_slurm
from dmlbench.pipeline.summary import closing_summary
from dmlbench.tracking.store import ensure_experiment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executor", choices=["local", "slurm"], default="local",
                        help="local: a pool of --jobs workers here; slurm: one Slurm job per stage")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=None, help="parallel stages (default: CPU cores, or one per GPU)")
    parser.add_argument("--gpus", default="", help="comma-separated GPU ids, one worker per GPU (e.g. 0,1,2,3)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--preset", help="run presets/<name>.yaml in its own workspace (artifacts/presets/<name>)")
    parser.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    params_file = Path(args.params)
    preset = None
    try:
        if args.list_presets:
            print(listing(params_file))
            return 0
        if args.preset is not None:
            preset = load_preset(args.preset, params_file)  # unknown or bad preset: one line, nothing runs
            params = preset.params
        else:
            params = load_complete(params_file)  # bad input fails here, in one line, before any stage runs
        preflight(params, params_file.parent / paths.DROPBOX)  # so do missing weights and archives
    except DmlbenchError as exc:
        print("\n".join(f"error: {line}" for line in str(exc).splitlines()), file=sys.stderr)
        return 2
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    jobs = args.jobs or len(gpus) or os.cpu_count() or 1
    if gpus and jobs > len(gpus):
        print(f"error: --jobs {jobs} exceeds the {len(gpus)} GPUs given with --gpus", file=sys.stderr)
        return 2
    if preset is not None:
        forwarded = [*(["--jobs", str(args.jobs)] if args.jobs else []), *(["--gpus", args.gpus] if gpus else [])]
        try:
            return run_preset(preset, params_file, forwarded)
        except DmlbenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    record_empty_dropbox(params_file.parent)
    plan = None
    if args.executor == "slurm":
        try:
            code, plan = run_on_slurm(params)
        except DmlbenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if code != 0:
            return code
    elif jobs > 1:
        ensure_experiment(params.tracking.experiment)  # create the store once, before workers fan out
        plan = make_plan()
        if plan.order:
            print(f"{len(plan.order)} stage(s) to run, {jobs} at a time; logs in {LOG_DIR}/")
            failed = run_parallel(plan, jobs, gpus)
            if failed:
                print(f"error: {len(failed)} stage(s) failed: {', '.join(failed)}", file=sys.stderr)
                return 1
    # Sequential dvc repro: runs everything when --jobs 1, else checks that nothing is left (its
    # "didn't change, skipping" line per stage left out).
    # --gpus holds here too (one id, or --jobs 1): the sequential stages see only the GPUs given
    env = worker_environment(gpu=",".join(gpus) if gpus else None)
    command = [sys.executable, "-m", "dvc", "repro"]
    if plan is None:
        code = subprocess.run(command, env=env, check=False).returncode
    else:
        check = subprocess.run(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
        )
        print("\n".join(line for line in check.stdout.splitlines() if "didn't change, skipping" not in line))
        code = check.returncode
    if code == 0:
        print("\n" + closing_summary(plan, time.perf_counter() - started, paths.REPORTS / "report.md"))
    return code


if __name__ == "__main__":
    sys.exit(main())
