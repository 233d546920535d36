"""Stale DVC stages as Slurm jobs: Slurm schedules them, its ``afterok`` dependencies order them.

Every stage the plan holds (:func:`dmlbench.pipeline.local.plan_after_validate`: the stale stages and
what follows them, once a stale ``validate`` has run here) becomes one ``sbatch`` job on the shared
checkout (but the record-only ``tune@`` stages, run here, and those found unchanged: below), submitted
in topological order with
``--dependency=afterok:<the jobs of its upstream stages still queued or running>`` and
``--kill-on-invalid-dep=yes``, so a failed job's dependents are cancelled by Slurm itself. With
``cluster.max_jobs: N`` at most N jobs are queued or running at once: the rest are submitted as
jobs end (a stage whose upstream failed is not submitted). Each job runs
``python -m dmlbench.pipeline.job <stage>`` (:mod:`dmlbench.pipeline.job`) and sets its own
environment (:func:`dmlbench.launch.job_script`: the venv's ``bin/`` first on ``PATH``, the
variables of :func:`job_environment`, ``DMLBENCH_OFFLINE=1``), so it needs neither the
submitting shell's environment (``SBATCH_EXPORT=NONE`` works) nor the internet: before
submitting, every archive and weights file is fetched here (:mod:`dmlbench.pipeline.fetch`).
Who records: this process. The jobs run their stages' commands without DVC (from the job spec
written at submission, :mod:`dmlbench.pipeline.job`); when Slurm reports a job COMPLETED, its stage
is recorded here (:class:`dmlbench.pipeline.record.StageBook`: hashes, cache, lock entry), all the
stages one poll found in one ``dvc.lock`` write. Jobs ending out of order or requeued never touch
the lock; a stage whose job did not complete is never recorded; stopping this command leaves the
recorded ones recorded (jobs still running then are re-run by the next run: keep it alive, e.g. in
``tmux``, or submit it as a small CPU job of its own). A stage stale now is submitted at once; one
only downstream of those is held back until they ended, then not run at all when its inputs came
out the same (as ``dvc repro``; e.g. ``tune@`` records re-run after an edit of ``tuning:``, and no
training after them). ``tune@`` stages that search nothing run here, not as jobs
(:mod:`dmlbench.pipeline.record_only`).
The submitting command watches the jobs (one ``squeue`` per poll for all of them, then
``sacct`` / ``scontrol`` for the ended; polls ``cluster.poll_seconds`` apart, the wait growing
while nothing ends) to report: which stage failed, its state and its log
(``artifacts/logs/<stage>.log``), and which were cancelled because of it. Re-running submits
only what is still stale. Refused in one line before anything is submitted: no Slurm, or an
MLflow SQLite store on a network file system (:mod:`dmlbench.pipeline.cluster_checks`), or a store
the compute nodes cannot reach (:mod:`dmlbench.pipeline.reachability`); then one short probe job
with the GPU kind's resources checks a compute node's GPU, driver, torch build and tracking store
before the grid is submitted (:mod:`dmlbench.pipeline.probe`). A job that asked for a GPU runs with
``DMLBENCH_DEVICE=cuda``: it refuses in one line where it finds none (:func:`dmlbench.launch.job_script`).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dmlbench import paths
from dmlbench.errors import DmlbenchError
from dmlbench.launch import (
    JOB_ENV_VARIABLE,
    job_script,
    resource_args,
    tunes_as_array,
    write_job_environment,
)
from dmlbench.params.cluster import ClusterConfig, StageResources, cluster_settings
from dmlbench.params.model import Params
from dmlbench.params.tuning import tuning_settings
from dmlbench.pipeline.cluster_checks import require_slurm, require_tracking_for_cluster
from dmlbench.pipeline.fetch import require_fetched
from dmlbench.pipeline.job import spec_path
from dmlbench.pipeline.local import GPU_SHARE_VARIABLE, LOG_DIR, plan_after_validate
from dmlbench.pipeline.plan import Plan
from dmlbench.pipeline.probe import probe_grid
from dmlbench.pipeline.reachability import require_reachable_stores
from dmlbench.pipeline.record import RecordError, StageBook
from dmlbench.pipeline.record_only import HereStages, here_environment, record_only_stages
from dmlbench.tracking.store import ensure_experiment, tracking_uri

JOB_ENV_FILE = "slurm-job.env"  # in LOG_DIR: the variables every job exports (job_environment)
# what a job takes from the submitting environment (besides what job_environment sets itself)
FORWARDED_PREFIXES = ("DMLBENCH_", "MLFLOW_", "DVC_", "OPTUNA_")
FORWARDED = ("PGPASSFILE", "PGSERVICEFILE", "PYTHONPATH", "TORCH_HOME", "HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT",
             "XDG_CACHE_HOME", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "NO_PROXY",
             "no_proxy")  # fmt: skip
HERE = "here"  # the job id of a stage this process runs itself (record_only: no job)
UNCHANGED = "UNCHANGED"  # not run: only downstream of a re-run stage, whose outputs came out the same
DONE = {"COMPLETED", UNCHANGED}
FAILED = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


@dataclass(frozen=True)
class Job:
    stage: str
    job_id: str
    log: Path


def waiting_resources(config: ClusterConfig, stage: str) -> StageResources:
    """A job that only submits a worker array and waits for it: one CPU, no GPU, 2G, its kind's
    time (the array tasks get the kind's resources, :func:`dmlbench.launch.array_command`)."""
    return StageResources(cpus=1, gpus=0, mem="2G", time=config.resources(stage).time)


def sbatch_command(stage: str, config: ClusterConfig, after: list[str], log: Path, root: Path, python: str,
                   waits_for_array: bool = False, env_file: Path | None = None) -> list[str]:  # fmt: skip
    """The ``sbatch`` command line of one stage's job (``after``: job ids it waits for;
    ``waits_for_array``: the job only waits for a worker array, :func:`waiting_resources`;
    ``env_file``: the variables the job exports, :func:`dmlbench.launch.job_script`)."""
    res = waiting_resources(config, stage) if waits_for_array else config.resources(stage)
    command = [
        "sbatch", "--parsable", f"--job-name={stage}", f"--chdir={root}", f"--output={log}", "--open-mode=append",
        *resource_args(config, res),
    ]  # fmt: skip
    if after:
        command += [f"--dependency=afterok:{':'.join(after)}", "--kill-on-invalid-dep=yes"]
    command += list(config.extra_args)
    # exec: the batch shell becomes the wrapper, so Slurm's B:USR1 reaches it
    wrapper = f"{shlex.quote(python)} -m dmlbench.pipeline.job {shlex.quote(stage)}"
    command.append(f"--wrap={job_script(wrapper, env_file, res.gpus)}")  # a GPU job: DMLBENCH_DEVICE=cuda
    return command


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


class Submission:
    """The plan's jobs: submitted in topological order, at most ``config.max_jobs`` queued or running
    at once (the rest as jobs end), watched until every stage has ended (:meth:`run`)."""

    def __init__(self, order: list[str], waits_for: dict[str, set[str]], config: ClusterConfig, root: Path,
                 log_dir: Path, python: str = sys.executable, array_waiters: frozenset[str] = frozenset(),
                 env_file: Path | None = None, quiet: bool = False, book: StageBook | None = None,
                 here: frozenset[str] = frozenset(), here_env: dict[str, str] | None = None,
                 stale: frozenset[str] | None = None) -> None:  # fmt: skip
        self.pending, self.waits_for, self.config = list(order), waits_for, config
        self.root, self.log_dir, self.python = root.resolve(), log_dir, python
        self.array_waiters, self.env_file, self.quiet = array_waiters, env_file, quiet
        self.limit = config.max_jobs or max(1, len(order))
        self.jobs: dict[str, Job] = {}  # every stage started (a job, or run here) or not submitted
        self.final: dict[str, str] = {}
        self.book = book  # writes each job's spec, records completed stages (None: the specs exist)
        # stages that only write a record (:mod:`dmlbench.pipeline.record_only`): run by this process, no job
        self.here, self.runner = here, HereStages(here_env if here_env is not None else dict(os.environ))
        # the stages stale now; the rest of the plan is only downstream of them: held back until what
        # they wait for ended, then run only if their inputs changed (as dvc repro; None: all stale)
        self.stale = stale
        self.stopped_here: list[str] = []  # running here when the run was stopped (not recorded)

    def in_flight(self) -> list[Job]:
        """The jobs queued or running (not the stages running here)."""
        return [job for job in self.jobs.values() if job.stage not in self.final and job.job_id != HERE]

    def _held_back(self, stage: str) -> bool:
        return self.stale is not None and stage not in self.stale

    def _ready(self, stage: str) -> bool:
        """Whether ``stage`` can start now: no stage it waits for is still to start; a stage run here
        or held back (:attr:`stale`) waits for all of them to end, a job for those run here (a job's
        ``afterok`` covers the jobs)."""
        upstream = self.waits_for.get(stage, set())
        if any(u in self.pending for u in upstream):
            return False
        started = [u for u in upstream if u in self.jobs]  # (the others are not in the plan)
        if stage in self.here:
            return self.runner.has_room() and all(u in self.final for u in started)
        if len(self.in_flight()) >= self.limit:
            return False
        waited = started if self._held_back(stage) else [u for u in started if self.jobs[u].job_id == HERE]
        return all(u in self.final for u in waited)

    def submit_more(self) -> int:
        """Start the pending stages that are ready (:meth:`_ready`), in order: a job while fewer than
        the limit are in flight, a record-only stage here; how many jobs were submitted."""
        count = 0
        for stage in list(self.pending):
            if not self._ready(stage):
                continue
            self.pending.remove(stage)
            upstream = sorted(u for u in self.waits_for.get(stage, ()) if u in self.jobs)
            log = (self.log_dir / (stage.replace("/", "_") + ".log")).resolve()
            failed = [u for u in upstream if self.final.get(u, "COMPLETED") not in DONE]
            if failed:  # Slurm would cancel it: it is not submitted at all
                log.write_text(f"not submitted: its upstream stage {failed[0]} ended {self.final[failed[0]]}\n")
                self.jobs[stage], self.final[stage] = Job(stage, "-", log), "CANCELLED"
                continue
            if self._held_back(stage) and self.book is not None and not self.book.is_changed(stage):
                log.write_text("not run: what it depends on came out the same (as dvc repro skips it)\n")
                self.jobs[stage], self.final[stage] = Job(stage, "-", log), UNCHANGED
                if not self.quiet:
                    print(f"{'same':<9} {stage} (its inputs came out the same: not run)", flush=True)
                continue
            log.write_text("")  # a fresh log per submission (a requeued job appends to it)
            spec: dict | None = None
            if self.book is not None:
                spec = self.book.job_spec(stage)
                spec_file = spec_path(stage, self.root)
                spec_file.parent.mkdir(parents=True, exist_ok=True)
                spec_file.write_text(json.dumps(spec, indent=1))
            if stage in self.here:
                if spec is None:
                    spec = json.loads(spec_path(stage, self.root).read_text())
                self.runner.start(stage, spec, log)
                self.jobs[stage] = Job(stage, HERE, log)
                continue
            after = [self.jobs[u].job_id for u in upstream if u not in self.final]
            result = subprocess.run(
                sbatch_command(stage, self.config, after, log, self.root, self.python, stage in self.array_waiters,
                               self.env_file),
                check=False, capture_output=True, text=True,
            )  # fmt: skip
            if result.returncode != 0:
                cancel([job.job_id for job in self.in_flight()])
                raise DmlbenchError(
                    f"sbatch refused {stage}: {result.stderr.strip()} (its jobs still queued are cancelled)"
                )
            self.jobs[stage] = Job(stage, result.stdout.strip().split(";")[0], log)
            count += 1
        return count

    def _ended(self, stage: str, state: str, where: str) -> None:
        if state == "COMPLETED" and self.book is not None:
            try:  # hashes, cache, lock entry (written in the next batch)
                self.book.finish(stage)
            except RecordError as exc:
                print(f"error: {exc}", file=sys.stderr, flush=True)
                state = "FAILED"
        self.final[stage] = state
        if not self.quiet:
            print(f"{'done  ' if state in DONE else state:<9} {stage} ({where})", flush=True)

    def record(self, current: dict[str, str]) -> int:
        """Record the jobs that ended (reported, one line each); how many did."""
        by_id = {job.job_id: job for job in self.in_flight()}
        ended = 0
        for job_id, state in current.items():
            job = by_id.get(job_id)
            if job is not None and (state in DONE or state in FAILED):
                self._ended(job.stage, state, f"job {job_id}")
                ended += 1
        return ended

    def record_here(self) -> int:
        """Record the stages run here that ended; how many did."""
        ended = self.runner.ended()
        for stage, code in ended:
            self._ended(stage, "COMPLETED" if code == 0 else "FAILED", "run here: no job")
        return len(ended)

    def run(self) -> dict[str, str]:
        """Submit and watch until every stage has ended; each stage's final state. Slurm is asked
        every poll; a stage run here is recorded (and what waits for it started) as soon as it ends.
        Whatever stops this (Ctrl-C, a refused sbatch) stops the stages running here first."""
        try:
            return self._run()
        except BaseException:
            self.stopped_here = self.runner.interrupt()
            raise

    def _run(self) -> dict[str, str]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        total = len(self.pending)
        self.submit_more()
        submitted = [job.job_id for job in self.jobs.values() if job.job_id not in ("-", HERE)]
        if not self.quiet and submitted:
            later = [stage for stage in self.pending if stage not in self.here]
            full = len(self.in_flight()) >= self.limit
            why = f"cluster.max_jobs: {self.limit}" if full else "after what they wait for"
            rest = f"; {len(later)} more as jobs end ({why})" if later else ""
            print(f"{len(submitted)} stage(s) submitted to Slurm as jobs {submitted[0]}..{submitted[-1]}{rest} "
                  f"(squeue --me to watch; logs in {self.log_dir}/)", flush=True)  # fmt: skip
        if not self.quiet and self.here:
            print(f"{len(self.here)} stage(s) only record published values (tune@ of a protocol that searches "
                  "nothing): run here, no job", flush=True)  # fmt: skip
        first, longest = self.config.poll_seconds
        delay, asked = first, time.monotonic()
        while len(self.final) < total:
            self.runner.wait(max(0.0, asked + delay - time.monotonic()))
            self.record_here()
            ask = time.monotonic() >= asked + delay
            jobs = 0  # jobs that ended or were submitted: Slurm is asked again soon (stages run here: no)
            if ask:
                jobs += self.record(states([job.job_id for job in self.in_flight()]))
                asked = time.monotonic()
            if self.book is not None:
                self.book.flush()  # one dvc.lock write for the stages recorded by this poll
            jobs += self.submit_more()
            if jobs:
                delay = first
            elif ask:
                delay = min(longest, delay * 1.5)
        return self.final


def submit(order: list[str], waits_for: dict[str, set[str]], config: ClusterConfig, root: Path, log_dir: Path,
           python: str = sys.executable, array_waiters: frozenset[str] = frozenset()) -> list[Job]:  # fmt: skip
    """Submit every stage of ``order`` at once, ignoring ``max_jobs`` (what :class:`Submission` does
    first when the limit allows); the jobs."""
    log_dir.mkdir(parents=True, exist_ok=True)
    submission = Submission(order, waits_for, config.model_copy(update={"max_jobs": None}), root, log_dir, python,
                            array_waiters, quiet=True)  # fmt: skip
    submission.submit_more()
    return list(submission.jobs.values())


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], check=False, capture_output=True)


def states(job_ids: list[str]) -> dict[str, str]:
    """Slurm's state of each job (``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ...): from
    ``squeue`` while it is queued or running, then from ``sacct`` (accounting) or, where accounting
    is off, ``scontrol show job`` (kept for MinJobAge seconds after the end)."""
    found: dict[str, str] = {}
    if not job_ids:
        return found
    queued = subprocess.run(
        ["squeue", "--noheader", "--format=%i %T", f"--jobs={','.join(job_ids)}"],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in queued.stdout.splitlines():
        job_id, state = line.split()[:2]
        found[job_id] = state
    rest = [j for j in job_ids if j not in found]
    if rest:
        finished = subprocess.run(
            ["sacct", "--noheader", "--parsable2", "--allocations", "--format=JobID,State", f"--jobs={','.join(rest)}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        for line in finished.stdout.splitlines():
            job_id, state = line.split("|")[:2]
            if job_id in rest:
                found[job_id] = state.split()[0]  # "CANCELLED by 0" -> CANCELLED
    for job_id in [j for j in job_ids if j not in found]:
        shown = subprocess.run(
            ["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True, check=False
        )
        fields = dict(part.split("=", 1) for part in shown.stdout.split() if "=" in part)
        if "JobState" in fields:
            found[job_id] = fields["JobState"]
    return found


def failure_report(jobs: list[Job], final: dict[str, str], tail_lines: int = 15) -> str:
    """Which stages failed (state, log, last lines) and which were cancelled because of them."""
    failed = [job for job in jobs if final.get(job.stage) in FAILED]
    lines = []
    first = [job for job in failed if final[job.stage] != "CANCELLED"] or failed
    for job in first:
        tail = "\n".join(
            line for line in job.log.read_text(errors="replace").splitlines()[-tail_lines:] if line.strip()
        )
        where = "run here" if job.job_id == HERE else f"job {job.job_id}"
        lines.append(f"stage {job.stage} {final[job.stage]} ({where}); log: {job.log}\n{tail}")
    cancelled = [job.stage for job in failed if job not in first]
    if cancelled:
        lines.append(f"cancelled as their dependencies failed (by Slurm, or never submitted): {', '.join(cancelled)}")
    return "\n".join(lines)


def run_on_slurm(params: Params, dropbox: Path = paths.DROPBOX) -> tuple[int, Plan]:
    """Fetch what the grid needs, submit the plan to Slurm, watch the jobs; 0 when every job
    completed, else 1 (reported)."""
    require_slurm()
    require_tracking_for_cluster(tracking_uri())
    require_reachable_stores(params)  # no loopback server, no store on this machine's disk alone
    plan = plan_after_validate()
    if not plan.order:
        return 0, plan
    require_fetched(params, dropbox)  # here, with the internet: the jobs run offline
    ensure_experiment(params.tracking.experiment)  # once, before the jobs fan out
    here = record_only_stages(params, plan.order)  # tune@ of published values: run here, no job
    # a tune@ job that runs its workers as an array only waits for them
    tuning = tuning_settings(params)
    arrays = tunes_as_array(tuning.workers, tuning.storage)
    waiters = frozenset(stage for stage in plan.order if arrays and stage.startswith("tune@") and stage not in here)
    env_file = (LOG_DIR / JOB_ENV_FILE).resolve()
    cluster = cluster_settings(params)
    environment = job_environment(dict(os.environ), env_file)
    if cluster.gpu_slots > 1:  # a GPU job's share where it cannot read it from Slurm (devices.gpu_share)
        environment[GPU_SHARE_VARIABLE] = str(cluster.gpu_slots)
    write_job_environment(env_file, environment)
    probe_grid(params, cluster, [stage for stage in plan.order if stage not in here], env_file, LOG_DIR, states)
    with StageBook(".") as book:  # this process records every stage (DVC's lock held meanwhile)
        submission = Submission(plan.order, plan.waits_for, cluster, Path("."), LOG_DIR, array_waiters=waiters,
                                env_file=env_file, book=book, here=here,
                                here_env=here_environment(environment), stale=plan.stale)  # fmt: skip
        try:
            final = submission.run()
        except KeyboardInterrupt:
            in_flight = [job.job_id for job in submission.in_flight() if job.job_id != "-"]
            cancel(in_flight)  # nobody would record them, and a new run would race them for their outputs
            stopped = submission.stopped_here  # (run() stopped them)
            print(f"interrupted: the stages recorded so far stay recorded; {len(in_flight)} job(s) still queued "
                  f"or running cancelled" + (f", {len(stopped)} stage(s) running here stopped" if stopped else ""),
                  file=sys.stderr)  # fmt: skip
            raise
    jobs = list(submission.jobs.values())
    if all(state in DONE for state in final.values()):
        return 0, plan
    print("error: " + failure_report(jobs, final), file=sys.stderr)
    return 1, plan
