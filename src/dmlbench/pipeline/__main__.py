"""Run ``dvc repro`` with independent stages in parallel: ``python -m dmlbench.pipeline``.

``dvc repro`` runs one stage at a time (treeverse/dvc#755): this runs every stale stage and what
follows it on ``--jobs`` workers or on Slurm, after the checks that refuse a bad run before any
stage, and ends with a plain ``dvc repro``. Options: ``--help``; docs/pipeline.md, docs/cluster.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from dmlbench import paths
from dmlbench.cost.plan import plan_eta, show_plan
from dmlbench.errors import DmlbenchError
from dmlbench.launch import worker_environment
from dmlbench.messages import first_error
from dmlbench.params.complete import load_complete
from dmlbench.params.model import Params
from dmlbench.params.presets import listing, load_preset
from dmlbench.pipeline.device_check import export_device, preflight
from dmlbench.pipeline.fetch import fetch_all
from dmlbench.pipeline.interrupts import run_to_the_end
from dmlbench.pipeline.local import LOG_DIR, plan_after_validate, run_parallel, worker_gpus
from dmlbench.pipeline.mps import mps_control, mps_daemon
from dmlbench.pipeline.plan import Plan, record_empty_dropbox
from dmlbench.pipeline.presets import run_preset
from dmlbench.pipeline.slurm import run_on_slurm
from dmlbench.pipeline.slurm_state import STATE_FILE, RunState
from dmlbench.pipeline.summary import closing_summary
from dmlbench.tracking.replay import pending_spools, replay_spools
from dmlbench.tracking.store import ensure_experiment


class UsageError(DmlbenchError):
    """Runner options that do not go together (refused before anything is read or run)."""


@dataclass(frozen=True)
class Slots:
    """The local pool: ``jobs`` parallel stages, ``gpus`` the GPU ids given, ``worker_gpus`` one per worker."""

    jobs: int
    gpus: list[str]
    worker_gpus: list[str]


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executor", choices=["local", "slurm"], default="local",
                        help="local: a pool of --jobs workers here; slurm: one Slurm job per stage")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=None, help="parallel stages (default: CPU cores, or one per GPU)")
    parser.add_argument("--gpus", default="", help="comma-separated GPU ids, one worker per GPU (e.g. 0,1,2,3)")
    parser.add_argument("--gpu-slots", type=int, default=1,
                        help="workers per GPU given with --gpus (several small trainings share one GPU)")  # fmt: skip
    parser.add_argument("--mps", action="store_true",
                        help="run each GPU's --gpu-slots trainings side by side under CUDA MPS")  # fmt: skip
    parser.add_argument("--device", choices=["cuda", "cpu", "auto"], default=None,
                        help="override the protocol's device (cpu: a GPU protocol on the CPU, knowingly)")  # fmt: skip
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--preset", help="run presets/<name>.yaml in its own workspace (artifacts/presets/<name>)")
    parser.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    parser.add_argument("--plan", action="store_true",
                        help="print the grid's stages, GPU-hours, wall time, memory and disk, then stop")  # fmt: skip
    parser.add_argument("--fetch-only", action="store_true",
                        help="download and verify every archive and weights file of the grid, then stop")  # fmt: skip
    parser.add_argument("--attach", action="store_true",
                        help="slurm: take over the jobs an earlier run left in Slurm's hands, and go on")  # fmt: skip
    parser.add_argument("--detach", action="store_true",
                        help="slurm: return once what can be submitted now is; the jobs go on")  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """The runner: options, params and preset checked, then one executor (a preset's workspace,
    Slurm, or the local pool). Every user error ends here, as ``error: ...`` lines and status 2."""
    args = parse_arguments(argv)
    try:
        return _run(args, time.perf_counter())
    except (DmlbenchError, ValidationError) as exc:
        print(user_error(exc, args.params), file=sys.stderr)
        return 2


def user_error(exc: DmlbenchError | ValidationError, source: str = "params.yaml") -> str:
    """The ``error: ...`` line(s) of a user error (a :class:`DmlbenchError` of several lines: one
    ``error:`` each; a pydantic one: its first error, :func:`dmlbench.messages.first_error`)."""
    text = f"{source}: {first_error(exc)}" if isinstance(exc, ValidationError) else str(exc)
    return "\n".join(f"error: {line}" for line in text.splitlines() or [type(exc).__name__])


def check_options(args: argparse.Namespace) -> Slots:
    """The options that do not go together, refused (:class:`UsageError`) before anything is read;
    the local pool's slots."""
    if (args.attach or args.detach) and args.executor != "slurm":
        raise UsageError(f"--{'attach' if args.attach else 'detach'} is for --executor slurm (a local run ends "
                         "with its runner)")  # fmt: skip
    if args.mps and (args.executor != "local" or args.gpu_slots < 2 or not args.gpus.strip() or args.jobs == 1):
        raise UsageError(
            f"--mps runs the trainings --gpu-slots puts on each GPU side by side, with the local executor: "
            f"give --gpus and --gpu-slots N > 1, without --jobs 1 (got --executor {args.executor}, --gpus "
            f"{args.gpus or 'none'}, --gpu-slots {args.gpu_slots}, --jobs {args.jobs or 'default'}; on Slurm, MPS "
            "is the site's: cluster.shared_gres: mps)"
        )
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    if args.gpu_slots < 1 or (args.gpu_slots > 1 and not gpus):
        raise UsageError(f"--gpu-slots {args.gpu_slots}: needs --gpus and a positive count")
    workers = worker_gpus(gpus, args.gpu_slots)
    jobs = args.jobs or len(workers) or os.cpu_count() or 1
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: must be a positive number of parallel stages")
    if gpus and jobs > len(workers):
        raise UsageError(f"--jobs {jobs} exceeds the {len(gpus)} GPUs x {args.gpu_slots} slots given with --gpus "
                         "and --gpu-slots")  # fmt: skip
    return Slots(jobs, gpus, workers)


def _run(args: argparse.Namespace, started: float) -> int:
    slots = check_options(args)
    if args.mps:
        mps_control()
    params_file = Path(args.params)
    if args.list_presets:
        print(listing(params_file))
        return 0
    if args.fetch_only and args.preset is None:
        return fetch_only(load_complete(params_file), params_file.parent / paths.DROPBOX)
    preset = load_preset(args.preset, params_file) if args.preset is not None else None  # unknown or bad: one line
    params = preset.params if preset is not None else load_complete(params_file)  # bad input fails here
    if args.plan:  # before anything runs: the price of the grid for these options (dmlbench.cost)
        print(show_plan(params_file.parent, params, preset, args))
        return 0
    preflight(  # so do missing weights and archives, and a GPU grid without a usable GPU
        params, params_file.parent / paths.DROPBOX, slots.gpus, args.device,
        check_device=args.executor == "local" and not args.fetch_only,
    )  # fmt: skip
    export_device(params, args.device, local=args.executor == "local")  # the stages' DMLBENCH_DEVICE
    if preset is not None:
        return run_preset(preset, params_file, forwarded_options(args), detach_on_hangup=args.executor == "slurm")
    record_empty_dropbox(params_file.parent)
    replay_spools(pending_spools())  # tracking records earlier trainings left unsent (a store outage)
    if args.executor == "slurm":
        return run_slurm(params, args, started)
    return run_local(params, args, slots, started)


def forwarded_options(args: argparse.Namespace) -> list[str]:
    """The runner options a preset's run in its workspace gets."""
    return [
        "--executor", args.executor, *(["--jobs", str(args.jobs)] if args.jobs else []),
        *(["--gpus", args.gpus] if args.gpus.strip() else []), *(["--fetch-only"] if args.fetch_only else []),
        *(["--gpu-slots", str(args.gpu_slots)] if args.gpu_slots != 1 else []), *(["--mps"] if args.mps else []),
        *(["--device", args.device] if args.device else []), *(["--attach"] if args.attach else []),
        *(["--detach"] if args.detach else []),
    ]  # fmt: skip


def run_slurm(params: Params, args: argparse.Namespace, started: float) -> int:
    """``--executor slurm``: submit and watch (:func:`run_on_slurm`), then the closing check here."""
    code, plan, detached = run_on_slurm(params, attach=args.attach, detach=args.detach)
    if code != 0 or detached:
        return code
    return slurm_closing_check(plan, started)


def run_local(params: Params, args: argparse.Namespace, slots: Slots, started: float) -> int:
    """The local pool of ``slots.jobs`` workers (or, with one, ``dvc repro`` itself), ending with a
    ``dvc repro`` that must find nothing left."""
    in_slurm = RunState(LOG_DIR / STATE_FILE).entries
    if in_slurm:  # a local run would run those stages beside their jobs
        raise UsageError(f"{len(in_slurm)} stage(s) of an earlier run are in Slurm's hands ({LOG_DIR / STATE_FILE}: "
                         f"{', '.join(list(in_slurm)[:3])}{', ...' if len(in_slurm) > 3 else ''}); take them over "
                         "with make repro EXECUTOR=slurm, or scancel them and delete that file")  # fmt: skip
    plan = None
    if slots.jobs > 1:
        ensure_experiment(params.tracking.experiment)  # create the store once, before workers fan out
        plan = plan_after_validate()
        if plan.order:
            print(f"{len(plan.order)} stage(s) to run, {slots.jobs} at a time; logs in {LOG_DIR}/")
            daemon = mps_daemon(LOG_DIR / "mps") if args.mps else nullcontext(dict[str, str]())
            eta = plan_eta(params, plan.order, args, slots.jobs)  # the ETA on the progress bar (dmlbench.cost)
            with daemon as environment:
                failed = run_parallel(plan, slots.jobs, slots.worker_gpus, environment=environment,
                                      progress_note=eta)  # fmt: skip
            if failed:
                print(f"error: {len(failed)} stage(s) failed: {', '.join(failed)}", file=sys.stderr)
                return 1
    # Sequential dvc repro: runs everything when --jobs 1, else checks that nothing is left (its
    # "didn't change, skipping" line per stage left out).
    # --gpus holds here too (one id, or --jobs 1): the sequential stages see only the GPUs given
    env = worker_environment(gpu=",".join(slots.gpus) if slots.gpus else None)
    command = [sys.executable, "-m", "dvc", "repro"]
    if plan is None:
        try:  # the stage dvc runs stops at its checkpoint on Ctrl-C (subprocess.run would kill dvc)
            code = run_to_the_end(command, Path.cwd(), env)
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130
    else:
        check = subprocess.run(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
        )
        print("\n".join(line for line in check.stdout.splitlines() if "didn't change, skipping" not in line))
        code = check.returncode
    if code == 0:
        print("\n" + closing_summary(plan, time.perf_counter() - started, paths.REPORTS / "report.md"))
    return code


def slurm_closing_check(plan: Plan, started: float) -> int:
    """After a Slurm run, here on the login node: ``dvc status`` must find no pipeline stage stale
    (``dvc repro`` would run a stale stage here, e.g. a training on the login node; a ``.dvc`` file
    such as the drop-box's ``data.dvc`` is not a stage); 1 naming what is stale, else 0."""
    check = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], env=worker_environment(),
                           capture_output=True, text=True, check=False)  # fmt: skip
    try:
        stale = [name for name in json.loads(check.stdout or "{}") if not name.endswith(".dvc")]
    except ValueError:
        stale = [f"dvc status failed: {(check.stderr.strip().splitlines() or ['no output'])[-1]}"]
    if check.returncode != 0 or stale:
        print(f"error: dvc status finds {len(stale)} stage(s) stale after the run ({', '.join(stale[:5])}"
              f"{', ...' if len(stale) > 5 else ''}): run the pipeline again", file=sys.stderr)  # fmt: skip
        return 1
    print("Data and pipelines are up to date.")
    print("\n" + closing_summary(plan, time.perf_counter() - started, paths.REPORTS / "report.md"))
    return 0


def fetch_only(params: Params, dropbox: Path) -> int:
    """``--fetch-only``: every archive and weights file of the grid here and verified; 0, else 1."""
    problems = fetch_all(params, dropbox)
    if problems:
        print("\n".join(f"error: {line}" for line in problems), file=sys.stderr)
        return 1
    print(f"fetched: every archive ({dropbox}/) and weights file the grid needs is here and verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
