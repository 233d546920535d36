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
(:func:`dmlbench.preflight.require_weights`), and every dataset archive must be in ``data/`` or
downloadable (:func:`dmlbench.archive_check.require_archives`); else nothing runs.

``--executor slurm`` hands the same plan to Slurm instead of the local pool: one job per stale
stage, ordered by ``afterok`` dependencies, resources from ``params.yaml``'s ``cluster:`` section
(:mod:`dmlbench.cluster.slurm`); the command watches the jobs and reports a failed stage with its
log, then runs the same closing check.

``--preset <name>`` runs ``presets/<name>.yaml`` (:mod:`dmlbench.presets`) the same way, after
the same checks, in a workspace of its own (:mod:`dmlbench.workspace`): the main checkout's
params.yaml and dvc.lock stay as they are.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from dmlbench import paths
from dmlbench.archive_check import require_archives
from dmlbench.config import Params, load_params
from dmlbench.errors import DmlbenchError
from dmlbench.preflight import require_weights
from dmlbench.presets import Preset, listing, load_preset, params_text
from dmlbench.workspace import environment, prepare_workspace, uncommitted_code

LOG_DIR = Path("artifacts/logs")


@dataclass(frozen=True)
class Plan:
    """Stages to run (topological order) and, for each, the planned stages it waits for."""

    order: list[str]
    waits_for: dict[str, set[str]]
    total: int = 0  # pipeline stages in dvc.yaml (order: the stale ones and what follows them)


def make_plan(root: Path = Path(".")) -> Plan:
    """Stale pipeline stages and all their descendants, from DVC's own graph and status."""
    import networkx as nx
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    with Repo(str(root)) as repo:
        graph = repo.index.graph  # edges: dependent stage -> stage it depends on
        by_name = {stage.addressing: stage for stage in graph.nodes if isinstance(stage, PipelineStage)}
        stale = [name for name in repo.status() if name in by_name]
        todo: set[str] = set()
        for name in stale:
            todo.add(name)
            todo.update(s.addressing for s in nx.ancestors(graph, by_name[name]) if s.addressing in by_name)
        waits_for = {
            name: {dep.addressing for dep in graph.successors(by_name[name]) if dep.addressing in todo} for name in todo
        }
        order = [s.addressing for s in reversed(list(nx.topological_sort(graph))) if s.addressing in todo]
    return Plan(order, waits_for, len(by_name))


def _log_path(stage: str) -> Path:
    return LOG_DIR / (re.sub(r"[^A-Za-z0-9_.@-]", "_", stage) + ".log")


def _environment(**extra: str) -> dict[str, str]:
    """os.environ with this interpreter's bin/ first on PATH (stage commands call ``python``)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return dict(os.environ, PATH=path, **extra)


def _run_stage(stage: str, slots: "queue.Queue[int]", threads: int, gpus: list[str]) -> tuple[str, int, float]:
    slot = slots.get()
    try:
        env = _environment(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[slot]
        started = time.perf_counter()
        with open(_log_path(stage), "w") as log:
            code = subprocess.run(
                [sys.executable, "-m", "dvc", "--wait-for-lock", "repro", "--single-item", stage],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            ).returncode
        return stage, code, time.perf_counter() - started
    finally:
        slots.put(slot)


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").replace("\r", "\n").splitlines()
    return "\n".join(line for line in text[-lines:] if line.strip())


def run_parallel(plan: Plan, jobs: int, gpus: list[str]) -> list[str]:
    """Run the plan; return the stages that failed (empty on success)."""
    from tqdm import tqdm

    LOG_DIR.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    slots: queue.Queue[int] = queue.Queue()
    for slot in range(jobs):
        slots.put(slot)
    done: set[str] = set()
    failed: list[str] = []
    pending = list(plan.order)
    running: dict[Future, str] = {}
    with (
        ThreadPoolExecutor(max_workers=jobs) as pool,
        tqdm(total=len(plan.order), desc="dvc stages", unit="stage") as bar,
    ):
        while pending or running:
            if not failed:
                ready = [s for s in pending if plan.waits_for[s] <= done][: jobs - len(running)]
                for stage in ready:
                    pending.remove(stage)
                    running[pool.submit(_run_stage, stage, slots, threads, gpus)] = stage
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                stage, code, seconds = future.result()
                del running[future]
                bar.update(1)
                if code == 0:
                    done.add(stage)
                    tqdm.write(f"done   {stage} ({seconds:.1f} s)")
                else:
                    failed.append(stage)
                    tqdm.write(
                        f"FAILED {stage} (exit {code}); last lines of {_log_path(stage)}:\n{_tail(_log_path(stage))}"
                    )
    return failed


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def closing_summary(plan: Plan | None, seconds: float, report: Path) -> str:
    """What ``make repro`` ends with: stages run and up to date, wall time, the report's tournament
    table and where to look next. ``plan``: None for a sequential ``dvc repro`` (its log says what ran)."""
    if plan is None:
        lines = [f"dvc repro finished in {_duration(seconds)}."]
    else:
        lines = [
            f"{len(plan.order)} of {plan.total} stages run, {plan.total - len(plan.order)} up to date, "
            f"in {_duration(seconds)}" + (f"; logs in {LOG_DIR}/" if plan.order else "") + "."
        ]
    if report.exists():
        text = report.read_text()
        if "## Tournament of losses\n" in text:
            section = text.split("## Tournament of losses\n", 1)[1].split("\n## ", 1)[0]
            table = [line for line in section.splitlines() if line.startswith("|")]
            lines += ["", "Tournament of losses (from the report):", *table]
        lines += ["", f"Report: {report}", "Runs: make ui (the MLflow UI on this project's tracking store)"]
    return "\n".join(lines)


def preflight(params: Params, dropbox: Path) -> None:
    """Every pre-flight check, all problems reported at once (one line each), before any stage."""
    problems = []
    for check, arguments in ((require_weights, ()), (require_archives, (dropbox,))):
        try:
            check(params, *arguments)
        except DmlbenchError as exc:
            problems.append(str(exc))
    if problems:
        raise DmlbenchError("\n".join(problems))


def record_empty_dropbox(root: Path) -> None:
    """``data.dvc`` tracks the archive drop-box ``data/``, committed empty; a fresh clone has neither the
    folder nor its (empty) cache entry, so ``dvc status`` would call it "not in cache" forever. While
    ``data/`` is missing or empty, create it and ``dvc commit`` it: the hash stays the committed one and
    ``data.dvc`` is unchanged. A drop-box holding archives is the user's to ``dvc add`` (docs/datasets.md)."""
    dropbox = root / paths.DROPBOX
    if not (root / "data.dvc").exists() or (dropbox.exists() and any(dropbox.iterdir())):
        return
    dropbox.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "dvc", "commit", "--force", "--quiet", "data.dvc"], cwd=root, check=False)


def run_preset(preset: Preset, params_file: Path, forwarded: list[str]) -> int:
    """Run the pipeline (``forwarded``: its --jobs/--gpus) in the preset's own workspace."""
    main_root = params_file.resolve().parent
    changed = uncommitted_code(main_root)
    workspace = prepare_workspace(main_root, preset.name, params_text(preset))
    print(f"preset {preset.name!r}: {preset.description}")
    print(f"workspace: {workspace.root} (git worktree at {workspace.commit[:12]}; own params.yaml and dvc.lock)")
    if changed:
        print(f"note: the preset runs the committed code; uncommitted changes to {', '.join(changed)} are not in it")
    sys.stdout.flush()
    env = environment(workspace, main_root)
    code = subprocess.run(
        [sys.executable, "-m", "dmlbench.pipeline", *forwarded], cwd=workspace.root, env=env
    ).returncode
    print(
        f"\npreset {preset.name!r} {'finished' if code == 0 else f'stopped (exit {code})'}.\n"
        f"Workspace: {workspace.root}\nReport:    {workspace.report}\nLogs:      {workspace.logs}/\n"
        f"MLflow:    experiment {preset.params.tracking.experiment!r} in {env['MLFLOW_TRACKING_URI']} (make ui)"
    )
    return code


def run_on_slurm(params: Params) -> tuple[int, Plan]:
    """Submit the plan to Slurm, watch the jobs; 0 when every job completed, else 1 (reported)."""
    from dmlbench.cluster.array import tunes_as_array
    from dmlbench.cluster.slurm import failure_report, require_slurm, submit, wait
    from dmlbench.tracking import ensure_experiment

    require_slurm()
    ensure_experiment(params.tracking.experiment)  # once, before the jobs fan out
    plan = make_plan()
    if not plan.order:
        return 0, plan
    # a tune@ job that runs its workers as an array only waits for them
    arrays = tunes_as_array(params.tuning.workers, params.tuning.storage)
    waiters = frozenset(stage for stage in plan.order if arrays and stage.startswith("tune@"))
    jobs = submit(plan.order, plan.waits_for, params.cluster, Path("."), LOG_DIR, array_waiters=waiters)
    print(f"{len(jobs)} stage(s) submitted to Slurm as jobs {jobs[0].job_id}..{jobs[-1].job_id} "
          f"(squeue --me to watch; logs in {LOG_DIR}/)", flush=True)  # fmt: skip
    final = wait(jobs)
    if all(state == "COMPLETED" for state in final.values()):
        return 0, plan
    print("error: " + failure_report(jobs, final), file=sys.stderr)
    return 1, plan


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
            params = load_params(params_file)  # bad input fails here, in one line, before any stage runs
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
        from dmlbench.tracking import ensure_experiment

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
    command = [sys.executable, "-m", "dvc", "repro"]
    if plan is None:
        code = subprocess.run(command, env=_environment()).returncode
    else:
        check = subprocess.run(command, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print("\n".join(line for line in check.stdout.splitlines() if "didn't change, skipping" not in line))
        code = check.returncode
    if code == 0:
        print("\n" + closing_summary(plan, time.perf_counter() - started, paths.REPORTS / "report.md"))
    return code


if __name__ == "__main__":
    sys.exit(main())
