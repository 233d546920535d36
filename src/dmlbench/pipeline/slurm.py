"""Stale DVC stages as Slurm jobs: Slurm schedules them, its ``afterok`` dependencies order them.

Each stage of the plan becomes one ``sbatch`` job running ``python -m dmlbench.pipeline.job <stage>``
offline (archives and weights are fetched here first), but the record-only ``tune@`` stages (run here)
and those whose inputs came out the same (not run, as ``dvc repro``). This process records each
COMPLETED stage. What is refused before any submission, SIGTERM/SIGHUP (detach), Ctrl-C (cancel):
docs/cluster.md.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import FrameType

from dmlbench import paths
from dmlbench.cost.plan import RunnerEta, run_shape, runner_eta
from dmlbench.errors import DmlbenchError
from dmlbench.launch import JOB_ENV_VARIABLE, MAX_JOBS_VARIABLE, tunes_as_array, write_job_environment
from dmlbench.params.cluster import DEFAULT_MAX_JOBS, ClusterConfig, cluster_settings
from dmlbench.params.model import Params
from dmlbench.params.tuning import tuning_settings
from dmlbench.pipeline.cluster_checks import require_array_storage, require_slurm, require_tracking_for_cluster
from dmlbench.pipeline.fetch import require_fetched
from dmlbench.pipeline.job import MAX_RETRIES_VARIABLE
from dmlbench.pipeline.local import GPU_SHARE_VARIABLE, LOG_DIR, plan_after_validate, tail
from dmlbench.pipeline.plan import Plan
from dmlbench.pipeline.probe import probe_grid
from dmlbench.pipeline.reachability import require_reachable_stores
from dmlbench.pipeline.record import StageBook
from dmlbench.pipeline.record_only import here_environment, record_only_stages
from dmlbench.pipeline.slurm_command import Detached, Job, say, sbatch_command, waiting_resources
from dmlbench.pipeline.slurm_endings import DONE, FAILED, ending_hint
from dmlbench.pipeline.slurm_queries import cancel, gres_per_gpu, site_max_jobs, states
from dmlbench.pipeline.slurm_state import STATE_FILE, RunState
from dmlbench.pipeline.slurm_submission import Submission
from dmlbench.tracking.store import ensure_experiment, tracking_uri

__all__ = ["Job", "Submission", "failure_report", "job_environment", "run_on_slurm", "sbatch_command", "states",
           "waiting_resources"]  # fmt: skip

JOB_ENV_FILE = "slurm-job.env"  # in LOG_DIR: the variables every job exports (job_environment)
# what a job takes from the submitting environment (besides what job_environment sets itself)
FORWARDED_PREFIXES = ("DMLBENCH_", "MLFLOW_", "DVC_", "OPTUNA_")
FORWARDED = ("PGPASSFILE", "PGSERVICEFILE", "PYTHONPATH", "TORCH_HOME", "HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT",
             "XDG_CACHE_HOME", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "NO_PROXY",
             "no_proxy")  # fmt: skip
DETACH_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
REATTACH = "make repro EXECUTOR=slurm (or: python -m dmlbench.pipeline --executor slurm --attach)"


def job_environment(environ: dict[str, str], env_file: Path) -> dict[str, str]:
    """The variables every job exports itself: those of ``environ`` it needs (:data:`FORWARDED`,
    :data:`FORWARDED_PREFIXES`), the tracking URI, torch's cache (where ``make fetch`` put the
    weights; the Hub cache is found through ``HF_HOME``/``HF_HUB_CACHE`` or the home directory),
    ``DMLBENCH_OFFLINE=1`` and ``HF_HUB_OFFLINE=1`` (no job asks the Hub: the weights lock and the
    cache hold everything) and where this file is (for the tune worker arrays)."""
    env = {k: v for k, v in environ.items() if k in FORWARDED or k.startswith(FORWARDED_PREFIXES)}
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    env.setdefault("TORCH_HOME", environ.get("TORCH_HOME") or os.path.join(cache, "torch"))
    env.update(MLFLOW_TRACKING_URI=tracking_uri(), DMLBENCH_OFFLINE="1", HF_HUB_OFFLINE="1", DVC_NO_ANALYTICS="1")
    env[JOB_ENV_VARIABLE] = str(env_file)
    return env


def failure_report(jobs: list[Job], final: dict[str, str], tail_lines: int = 15,
                   config: ClusterConfig | None = None) -> str:  # fmt: skip
    """Which stages failed (state, log, last lines; with ``config``, the setting to raise after a
    TIMEOUT or OUT_OF_MEMORY) and which were cancelled because of them."""
    failed = [job for job in jobs if final.get(job.stage) in FAILED]
    lines = []
    first = [job for job in failed if final[job.stage] != "CANCELLED"] or failed
    for job in first:
        hint = ending_hint(job.stage, final[job.stage], config) if config is not None else ""
        head = f"stage {job.stage} {final[job.stage]} ({job.describe()}); log: {job.log}"
        lines.append(head + (f"\n{hint}" if hint else "") + f"\n{tail(job.log, tail_lines)}")
    cancelled = [job.stage for job in failed if job not in first]
    if cancelled:
        lines.append(f"cancelled as their dependencies failed (by Slurm, or never submitted): {', '.join(cancelled)}")
    return "\n".join(lines)


@contextmanager
def detach_on(submission: Submission) -> Iterator[None]:
    """SIGTERM and SIGHUP make ``submission`` detach at its next step (:class:`Detached`), not die."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def detach(signum: int, _frame: FrameType | None) -> None:
        submission.detach_requested = signal.Signals(signum).name

    previous = {signum: signal.signal(signum, detach) for signum in DETACH_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def slurm_eta(params: Params, order: list[str], cluster: ClusterConfig) -> RunnerEta | None:
    """The watcher's ETA for ``order`` on ``cluster.max_jobs`` slots: the local runner's model
    (:func:`dmlbench.cost.plan.runner_eta`, what ``make plan EXECUTOR=slurm`` prices), corrected by the
    stages done; None (and a warning line) where the grid cannot be priced: the run goes on without."""
    try:
        shape = run_shape(params, executor="slurm", stages=len(order))
        if cluster.max_jobs is not None and shape.workers != min(cluster.max_jobs, len(order)):
            shape = replace(shape, workers=max(1, min(cluster.max_jobs, len(order))))
        return runner_eta(Path("."), params, order, shape)
    except Exception as exc:  # an estimate must never stop a run
        say(f"warning: no ETA ({type(exc).__name__}: {exc})", error=True)
        return None


def run_on_slurm(params: Params, dropbox: Path = paths.DROPBOX, *, attach: bool = False,
                 detach: bool = False) -> tuple[int, Plan, bool]:  # fmt: skip
    """Fetch what the grid needs, take over what an earlier run left in Slurm's hands, submit the rest,
    watch the jobs: ``(0 when every stage completed, else 1 (reported); the plan; whether it detached)``.
    ``attach``: only where an earlier run left jobs (else :class:`DmlbenchError`); ``detach``: return
    once everything that can be submitted now is."""
    require_slurm()
    require_tracking_for_cluster(tracking_uri())
    require_reachable_stores(params)  # no loopback server, no store on this machine's disk alone
    require_array_storage(tuning_settings(params))
    state = RunState(LOG_DIR / STATE_FILE)
    if attach and not state.entries:
        raise DmlbenchError(f"--attach: no job of an earlier run of this checkout is in Slurm's hands "
                            f"({LOG_DIR / STATE_FILE} lists none); run without --attach")  # fmt: skip
    plan = plan_after_validate()
    if not plan.order and not state.entries:
        return 0, plan, False
    require_fetched(params, dropbox)  # here, with the internet: the jobs run offline
    ensure_experiment(params.tracking.experiment)  # once, before the jobs fan out
    here = record_only_stages(params, plan.order)  # tune@ of published values: run here, no job
    # a tune@ job that runs its workers as an array only waits for them (and stands for them in max_jobs)
    tuning = tuning_settings(params)
    arrays = tunes_as_array(tuning.workers, tuning.storage)
    waiters = frozenset(stage for stage in plan.order if arrays and stage.startswith("tune@") and stage not in here)
    env_file = (LOG_DIR / JOB_ENV_FILE).resolve()
    cluster = cluster_settings(params)
    if cluster.max_jobs is None:  # what the site allows this user, else a number no site refuses
        cluster = cluster.model_copy(update={"max_jobs": site_max_jobs(cluster.qos) or DEFAULT_MAX_JOBS})
    if cluster.gpu_slots > 1 and cluster.shares_per_gpu is None:  # a GPU share in the site's units
        shares = gres_per_gpu(cluster.shared_gres, cluster.partition)
        cluster = cluster.model_copy(update={"shares_per_gpu": shares}) if shares else cluster
    environment = job_environment(dict(os.environ), env_file)
    environment[MAX_RETRIES_VARIABLE] = str(cluster.max_retries)
    environment[MAX_JOBS_VARIABLE] = str(cluster.max_jobs)  # a worker array's %N
    if cluster.gpu_slots > 1:  # a GPU job's share where it cannot read it from Slurm (devices.gpu_share)
        environment[GPU_SHARE_VARIABLE] = str(cluster.gpu_slots)
    write_job_environment(env_file, environment)
    # the probe only for stages this start submits afresh: jobs an earlier run left in Slurm's hands (the state
    # file) passed its probe and are adopted at once; a re-attach with nothing new to submit probes nothing
    fresh = [stage for stage in plan.order if stage not in here and stage not in state.entries]
    probe_grid(params, cluster, fresh, env_file, LOG_DIR, states)
    with StageBook(".") as book:  # this process records every stage (DVC's lock held meanwhile)
        submission = Submission(plan.order, plan.waits_for, cluster, Path("."), LOG_DIR, array_waiters=waiters,
                                env_file=env_file, book=book, here=here, here_env=here_environment(environment),
                                stale=plan.stale, state=state,
                                weights=dict.fromkeys(waiters, 1 + tuning.workers))  # fmt: skip
        submission.progress_note = slurm_eta(params, plan.order, cluster)
        try:
            with detach_on(submission):
                final = submission.run(detach=detach)
        except Detached:
            in_flight, left = submission.in_flight(), [s for s in submission.pending if s not in submission.here]
            more = f"; {len(left)} stage(s) not submitted yet (submitted when re-attached)" if left else ""
            say(f"detached: {len(in_flight)} job(s) go on in Slurm{more}; re-attach with: {REATTACH}", error=True)
            return 0, plan, True
        except KeyboardInterrupt:
            in_flight_ids = [job.job_id for job in submission.in_flight()]
            cancel(in_flight_ids)  # nobody would record them, and a new run would race them for their outputs
            state.forget(*state.entries)
            stopped = submission.stopped_here  # (run() stopped them)
            say(
                f"interrupted: the stages recorded so far stay recorded; {len(in_flight_ids)} job(s) still queued "
                f"or running cancelled" + (f", {len(stopped)} stage(s) running here stopped" if stopped else ""),
                error=True,
            )
            raise
    if not state.entries:
        (LOG_DIR / STATE_FILE).unlink(missing_ok=True)
    jobs = list(submission.jobs.values())
    if all(state in DONE for state in final.values()):
        return 0, plan, False
    say("error: " + failure_report(jobs, final, config=cluster), error=True)
    return 1, plan, False
