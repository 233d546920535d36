"""The Slurm executor's jobs: submitted in order, watched, retried, recorded, taken over after a restart.

Every submission is written to the state file first (:mod:`dmlbench.pipeline.slurm_state`), so a run
started again takes over (:meth:`Submission.adopt`) instead of submitting twice. Endings, retries,
refused ``sbatch`` and jobs that can never start: :mod:`dmlbench.pipeline.slurm_endings`, docs/cluster.md.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dmlbench.errors import DmlbenchError
from dmlbench.params.cluster import DEFAULT_MAX_JOBS, ClusterConfig
from dmlbench.pipeline.checkpoints import progress
from dmlbench.pipeline.guard import stage_filename
from dmlbench.pipeline.job import spec_path
from dmlbench.pipeline.record import RecordError, StageBook
from dmlbench.pipeline.record_only import HereStages
from dmlbench.pipeline.slurm_command import Detached, Job, Where, say, sbatch_command
from dmlbench.pipeline.slurm_endings import DONE, FAILED, RETRYABLE, UNCHANGED, ending_hint, never_hint
from dmlbench.pipeline.slurm_queries import JobState, Submitted, cancel, find_jobs, poll, sbatch
from dmlbench.pipeline.slurm_state import Entry, RunState

REFUSALS_TOLD = 3  # a stage's sbatch refused this many times: one line with Slurm's reason


class Submission:
    """The plan's jobs: submitted in topological order, at most ``max_jobs`` queued or running at once
    (the rest as jobs end), watched until every stage has ended (:meth:`run`)."""

    def __init__(
        self,
        order: list[str],
        waits_for: dict[str, set[str]],
        config: ClusterConfig,
        root: Path,
        log_dir: Path,
        *,
        python: str = sys.executable,
        array_waiters: frozenset[str] = frozenset(),
        env_file: Path | None = None,
        quiet: bool = False,
        book: StageBook | None = None,
        here: frozenset[str] = frozenset(),
        here_env: dict[str, str] | None = None,
        stale: frozenset[str] | None = None,
        state: RunState | None = None,
        weights: dict[str, int] | None = None,
    ) -> None:
        self.order, self.pending, self.waits_for, self.config = list(order), list(order), waits_for, config
        self.root, self.log_dir, self.python = root.resolve(), log_dir, python
        self.array_waiters, self.env_file, self.quiet = array_waiters, env_file, quiet
        self.limit = config.max_jobs or DEFAULT_MAX_JOBS
        self.weights = weights or {}  # the jobs a stage stands for (a tune job's worker array: 1 + workers)
        self.jobs: dict[str, Job] = {}  # every stage started (a job, or run here) or not submitted
        self.final: dict[str, str] = {}
        self.book = book  # writes each job's spec, records completed stages (None: the specs exist)
        # stages that only write a record (:mod:`dmlbench.pipeline.record_only`): run by this process, no job
        self.here, self.runner = here, HereStages(here_env if here_env is not None else dict(os.environ))
        # the stages stale now; the rest of the plan is only downstream of them: held back until what
        # they wait for ended, then run only if their inputs changed (as dvc repro; None: all stale)
        self.stale = stale
        self.stopped_here: list[str] = []  # running here when the run was stopped (not recorded)
        self.state = state if state is not None else RunState(None)  # (not kept in a file)
        self.attempts: dict[str, int] = {}
        self.progress_at: dict[str, str | None] = {}  # each job's checkpoint fingerprint at submission
        self.refusals: dict[str, int] = {}
        self.sbatch_after, self.backoff = 0.0, 0.0  # no sbatch before then (after a refusal)
        self.seen: dict[str, str] = {}  # a retryable ending seen once (Slurm may be requeueing the job)
        self.told: set[str] = set()  # jobs whose never-starting reason was said
        self.detach_requested = ""  # a signal's name: detach at the next step (:func:`detach_on`)
        # the ETA after each ended stage (its name and seconds, None when not run; (None, None) at the
        # start), e.g. :class:`dmlbench.cost.plan.RunnerEta`, the local runner's: None, no ETA
        self.progress_note: Callable[[str | None, float | None], str] | None = None
        self.running_since: dict[str, float] = {}  # when each stage was submitted, or seen running
        self.started: set[str] = set()  # the jobs seen running
        if book is not None:
            book.on_written = self._written

    def _written(self, stages: list[str]) -> None:
        """These stages are in dvc.lock: no longer in Slurm's hands (until then, a run started again
        after a kill finds them in the state file, and records them)."""
        self.state.forget(*stages)

    def in_flight(self) -> list[Job]:
        """The jobs queued or running (not the stages running here)."""
        return [job for job in self.jobs.values() if job.stage not in self.final and job.in_slurm]

    def _load(self) -> int:
        return sum(self.weights.get(job.stage, 1) for job in self.in_flight())

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
        if self.in_flight() and self._load() + self.weights.get(stage, 1) > self.limit:
            return False
        if time.monotonic() < self.sbatch_after:
            return False
        waited = started if self._held_back(stage) else [u for u in started if self.jobs[u].where is Where.HERE]
        return all(u in self.final for u in waited)

    def _log(self, stage: str) -> Path:
        return (self.log_dir / stage_filename(stage, ".log")).resolve()

    def submit_more(self) -> int:
        """Start the pending stages that are ready (:meth:`_ready`), in order: a job while fewer than
        the limit are in flight, a record-only stage here; how many jobs were submitted."""
        count = 0
        for stage in list(self.pending):
            if not self._ready(stage):
                continue
            self.pending.remove(stage)
            upstream = sorted(u for u in self.waits_for.get(stage, ()) if u in self.jobs)
            log = self._log(stage)
            failed = [u for u in upstream if self.final.get(u, "COMPLETED") not in DONE]
            if failed:  # Slurm would cancel it: it is not submitted at all
                log.write_text(f"not submitted: its upstream stage {failed[0]} ended {self.final[failed[0]]}\n")
                self.jobs[stage], self.final[stage] = Job.nowhere(stage, log), "CANCELLED"
                self._note(stage, None)
                continue
            if self._held_back(stage) and self.book is not None and not self.book.is_changed(stage):
                log.write_text("not run: what it depends on came out the same (as dvc repro skips it)\n")
                self.jobs[stage], self.final[stage] = Job.nowhere(stage, log), UNCHANGED
                self._note(stage, None)
                if not self.quiet:
                    say(f"{'same':<9} {stage} (its inputs came out the same: not run)")
                continue
            spec = self._spec(stage)
            if stage in self.here:
                log.write_text("")
                self.runner.start(stage, spec, log)
                self.running_since[stage] = time.monotonic()
                self.jobs[stage] = Job.here(stage, log)
                continue
            count += self._submit(stage, spec, upstream, log)
        return count

    def _spec(self, stage: str) -> dict[str, Any]:
        """The stage's job spec: written now (its inputs hashed: :meth:`StageBook.job_spec`), or read."""
        spec_file = spec_path(stage, self.root)
        if self.book is None:
            return json.loads(spec_file.read_text())
        spec = self.book.job_spec(stage)
        spec_file.parent.mkdir(parents=True, exist_ok=True)
        spec_file.write_text(json.dumps(spec, indent=1))
        return spec

    def _submit(self, stage: str, spec: dict[str, Any], upstream: list[str], log: Path) -> int:
        """One ``sbatch``, its state-file entry written first; 1 when submitted, else 0 (retried later,
        or failed: :meth:`_refused`)."""
        after = [self.jobs[u].job_id for u in upstream if u not in self.final and self.jobs[u].in_slurm]
        attempts, fingerprint = self.attempts.get(stage, 1), progress(spec)
        snapshot = self.book.snapshot(stage) if self.book is not None else {}
        entry = self.state.submitting(stage, snapshot, attempts, fingerprint, self.weights.get(stage, 1))
        command = sbatch_command(stage, self.config, after, log, self.root, self.python,
                                 stage in self.array_waiters, self.env_file)  # fmt: skip
        if attempts == 1:
            log.write_text("")  # a fresh log per run of the stage (a requeued or retried job appends to it)
        result = sbatch(command)
        if result.job is None and result.unsure:  # no answer: it may be queued all the same
            found = [job for job, state in find_jobs(stage, str(self.root), entry.submitted) if state != "CANCELLED"]
            result = Submitted(found[-1]) if found else result
        if result.job is None:
            self.state.forget(stage)
            self._refused(stage, result, log)
            return 0
        self.state.submitted(stage, result.job)
        self.refusals.pop(stage, None)
        self.backoff = 0.0
        self.jobs[stage] = Job(stage, result.job, log)
        self.running_since[stage] = time.monotonic()  # (until Slurm says it runs)
        self.started.discard(stage)
        self.attempts[stage], self.progress_at[stage] = attempts, fingerprint
        return 1

    def _refused(self, stage: str, result: Submitted, log: Path) -> None:
        """A refused ``sbatch``: the stage fails when no retry can help, else it waits for its next try."""
        kind = stage.split("@", 1)[0]
        if result.permanent:
            log.write_text(f"sbatch refused it: {result.reason}\n")
            self.jobs[stage], self.final[stage] = Job.nowhere(stage, log), "FAILED"
            self._note(stage, None)
            say(f"error: sbatch refused {stage}: {result.reason} (check cluster.partition, account, qos and "
                 f"cluster.stages.{kind}; the rest of the grid goes on)", error=True)  # fmt: skip
            return
        self.pending = sorted([*self.pending, stage], key=self.order.index)
        self.refusals[stage] = self.refusals.get(stage, 0) + 1
        first, longest = self.config.poll_seconds
        self.backoff = min(longest * 5, max(first, self.backoff * 2))
        self.sbatch_after = time.monotonic() + self.backoff
        if self.refusals[stage] == REFUSALS_TOLD:
            say(f"warning: sbatch refused {stage} {REFUSALS_TOLD} times: {result.reason}; trying again after "
                 f"pauses of up to {longest * 5:g} s, the rest of the grid goes on", error=True)  # fmt: skip

    def _ended(self, stage: str, state: str, where: str) -> None:
        if state == "COMPLETED" and self.book is not None:
            try:  # hashes, cache, lock entry (written in the next batch)
                self.book.finish(stage)
            except RecordError as exc:
                say(f"error: {exc}", error=True)
                state = "FAILED"
        self.final[stage] = state
        if state != "COMPLETED" or self.book is None:  # (a recorded stage: once it is in dvc.lock, _written)
            self.state.forget(stage)
        hint = ending_hint(stage, state, self.config)
        since = self.running_since.pop(stage, None)
        ran = time.monotonic() - since if state == "COMPLETED" and since is not None else None
        note = self._note(stage, ran)
        if not self.quiet:
            say(f"{'done  ' if state in DONE else state:<9} {stage} ({where})" + (f": {hint}" if hint else "")
                 + (f" [{len(self.final)}/{len(self.order)} ended; {note}]" if note else ""))  # fmt: skip

    def _note(self, stage: str | None, seconds: float | None) -> str:
        """:attr:`progress_note` told that ``stage`` ended after ``seconds``; its line ("" without one)."""
        return self.progress_note(stage, seconds) if self.progress_note is not None else ""

    def _downstream(self, stage: str) -> list[str]:
        """Every stage of the plan after ``stage`` (what waits for it, directly or not)."""
        found: set[str] = set()
        todo = [stage]
        while todo:
            current = todo.pop()
            for other, upstream in self.waits_for.items():
                if current in upstream and other not in found:
                    found.add(other)
                    todo.append(other)
        return sorted(found, key=self.order.index)

    def _retry(self, job: Job, state: str) -> bool:
        """Submit a retryable ending again, with what waits for it (Slurm cancels those), within
        ``cluster.max_retries`` and, after the first retry, only if its checkpoint moved; else False."""
        stage, attempts = job.stage, self.attempts.get(job.stage, 1)
        spec = json.loads(spec_path(stage, self.root).read_text()) if spec_path(stage, self.root).exists() else {}
        moved = progress(spec)
        why = ""
        if attempts > self.config.max_retries:
            why = f"cluster.max_retries ({self.config.max_retries}) reached"
        elif attempts > 1 and moved is not None and moved == self.progress_at.get(stage):
            why = f"its checkpoint made no progress in attempt {attempts}"
        if why:
            say(f"{state:<9} {stage} (job {job.job_id}): not submitted again: {why}", error=True)
            return False
        after = [s for s in self._downstream(stage) if s not in self.pending]
        cancel([self.jobs[s].job_id for s in after if s in self.jobs and s not in self.final and self.jobs[s].in_slurm])
        for other in [stage, *after]:
            self.jobs.pop(other, None)
            self.final.pop(other, None)
        self.state.forget(stage, *after)
        self.pending = sorted({*self.pending, stage, *after}, key=self.order.index)
        self.attempts[stage] = attempts + 1
        say(f"{state:<9} {stage} (job {job.job_id}): submitted again (attempt {attempts + 1} of at most "
             f"{self.config.max_retries + 1})")  # fmt: skip
        return True

    def record(self, current: dict[str, JobState]) -> int:
        """Record the jobs that ended (reported, one line each), retry the retryable ones and say why a
        job can never start; how many ended or went back to be submitted again."""
        by_id = {job.job_id: job for job in self.in_flight()}
        ended = 0
        # retries first (they take back what waits for them), then in the plan's order: an upstream stage
        # is recorded before what depends on it, as dvc repro records them
        order = {stage: index for index, stage in enumerate(self.order)}
        ranked = sorted(
            current.items(),
            key=lambda item: (item[1].state not in RETRYABLE, order.get(getattr(by_id.get(item[0]), "stage", ""), 0)),
        )
        for job_id, found in ranked:
            job = by_id.get(job_id)
            if job is None or self.jobs.get(job.stage) is not job:  # (sent back by a retry meanwhile)
                continue
            if found.queued:
                self.seen.pop(job_id, None)
                if found.state == "RUNNING" and job.stage not in self.started:  # its run time starts
                    self.started.add(job.stage)
                    self.running_since[job.stage] = time.monotonic()
                hint = never_hint(job.stage, job_id, found.reason, self.config) if found.state == "PENDING" else None
                if hint and job_id not in self.told:
                    self.told.add(job_id)
                    say(f"warning: {hint}", error=True)
                continue
            if found.state != "COMPLETED" and self.seen.get(job_id) != found.state:
                self.seen[job_id] = found.state  # an ending but success, seen twice: Slurm may be requeueing it
                continue  # (--requeue, or the job's own scontrol requeue: a moment's FAILED in accounting)
            if found.state in RETRYABLE:
                if self._retry(job, found.state):
                    ended += 1
                    continue
            if found.state in DONE or found.state in FAILED:
                self._ended(job.stage, found.state, f"job {job_id}")
                ended += 1
        return ended

    def record_here(self) -> int:
        """Record the stages run here that ended; how many did."""
        ended = self.runner.ended()
        for stage, code in ended:
            self._ended(stage, "COMPLETED" if code == 0 else "FAILED", "run here: no job")
        return len(ended)

    def adopt(self) -> list[str]:
        """Take over what an earlier run of this checkout left in Slurm's hands (its state file): a job
        queued or running with the inputs it was submitted with is watched (submitted again: never);
        one that COMPLETED meanwhile is recorded when its inputs are the same now; the rest is
        submitted as usual. One line each; the stages taken over."""
        rank = {stage: index for index, stage in enumerate(self.order)}  # upstream recorded first
        entries = sorted(self.state.entries.values(), key=lambda entry: rank.get(entry.stage, len(rank)))
        for entry in entries:
            if entry.job is None:  # written before an sbatch whose answer was lost: Slurm says whether it ran
                ids = [job for job, _ in find_jobs(entry.stage, str(self.root), entry.submitted)]
                entry.job = ids[-1] if ids else None
                cancel(ids[:-1])  # (twins of one submission: never expected; kept to one)
        asked = [entry.job for entry in entries if entry.job]
        current = poll(asked)
        if asked and not current:  # never guess: a job Slurm may still hold would be submitted twice
            raise DmlbenchError(f"Slurm did not say what became of the {len(asked)} job(s) of the earlier run "
                                f"({', '.join(asked[:3])}{', ...' if len(asked) > 3 else ''}); try again when "
                                "squeue and sacct answer")  # fmt: skip
        taken: list[str] = []
        for entry in entries:
            found = current.get(entry.job or "")
            if entry.job is None or found is None or entry.stage not in self.pending:
                self.state.forget(entry.stage)
                if entry.job is not None and found is not None and found.queued:  # no longer to run
                    cancel([entry.job])
                    say(f"cancelled job {entry.job} ({entry.stage}): the stage is no longer to run")
                continue
            if (found.queued or found.state == "COMPLETED") and self._take(entry, found):
                taken.append(entry.stage)  # (its entry stays until the stage is in dvc.lock)
                continue
            self.state.forget(entry.stage)
            if found.state in RETRYABLE:
                self.attempts[entry.stage] = entry.attempts + 1
            elif not found.queued and found.state != "COMPLETED":
                say(f"{found.state:<9} {entry.stage} (job {entry.job}, while nobody watched): submitted again")
        return taken

    def _take(self, entry: Entry, found: JobState) -> bool:
        """Watch an earlier run's job still queued or running, or record it when it COMPLETED; False when
        its inputs changed since (then cancelled) or it cannot be recorded: it is submitted again."""
        stage, log, book, job_id = entry.stage, self._log(entry.stage), self.book, str(entry.job)  # (adopt: never None)
        if book is not None and not book.matches(stage, entry.snapshot):
            if found.queued:
                cancel([job_id])
            say(f"cancelled job {job_id} ({stage}): its inputs changed since it was submitted; submitted again")
            return False
        job = Job(stage, job_id, log)
        if found.queued:
            if book is not None:
                book.expect(stage, entry.snapshot)
            self.state.save()  # (its job id, where it was found by name)
            self.attempts[stage], self.progress_at[stage] = entry.attempts, entry.progress
            say(f"{'adopted':<9} {stage} (job {entry.job}, {found.state.lower()})")
        else:
            try:
                if book is not None:
                    book.adopt(stage, entry.snapshot)
            except RecordError as exc:
                say(f"error: {exc}; submitted again", error=True)
                return False
            self.final[stage] = "COMPLETED"
            say(f"{'done':<9} {stage} (job {entry.job}: completed while nobody watched; recorded now)")
        self.pending.remove(stage)
        self.jobs[stage] = job
        return True

    def run(self, detach: bool = False) -> dict[str, str]:
        """Submit and watch until every stage has ended; each stage's final state. Slurm is asked
        every poll; a stage run here is recorded (and what waits for it started) as soon as it ends.
        ``detach``: return (:class:`Detached`) once nothing more can start without a job ending.
        Whatever stops this (Ctrl-C, a detach) stops the stages running here first."""
        try:
            self.adopt()
            return self._run(detach)
        except BaseException:
            self.stopped_here = self.runner.interrupt()
            raise

    def _run(self, detach: bool) -> dict[str, str]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        total = len(self.order)
        self.submit_more()
        submitted = [job.job_id for job in self.jobs.values() if job.in_slurm]
        if not self.quiet and submitted:
            later = [stage for stage in self.pending if stage not in self.here]
            full = bool(self.in_flight()) and self._load() >= self.limit
            why = f"cluster.max_jobs: {self.limit}" if full else "after what they wait for"
            rest = f"; {len(later)} more as jobs end ({why})" if later else ""
            say(f"{len(submitted)} stage(s) submitted to Slurm as jobs {submitted[0]}..{submitted[-1]}{rest} "
                 f"(squeue --me to watch; logs in {self.log_dir}/)")  # fmt: skip
        if not self.quiet and self.here:
            say(f"{len(self.here)} stage(s) only record published values (tune@ of a protocol that searches "
                 "nothing): run here, no job")  # fmt: skip
        if not self.quiet and (note := self._note(None, None)):
            say(f"{len(self.final)}/{total} ended; {note}")
        first, longest = self.config.poll_seconds
        delay, asked = first, time.monotonic()
        while len(self.final) < total:
            if detach and not self.runner.running and not any(self._ready(s) for s in self.pending):
                raise Detached("--detach")
            deadline = asked + delay
            if self.pending and self.sbatch_after > time.monotonic():  # a refused sbatch's next try
                deadline = min(deadline, self.sbatch_after)
            while not self.detach_requested and (left := deadline - time.monotonic()) > 0:
                self.runner.wait(min(left, 0.5))  # (returns early when a stage running here ends)
                if self.runner.running and any(p.poll() is not None for p, _ in self.runner.running.values()):
                    break
            if self.detach_requested:
                raise Detached(self.detach_requested)
            self.record_here()
            ask = time.monotonic() >= asked + delay
            jobs = 0  # jobs that ended or were submitted: Slurm is asked again soon (stages run here: no)
            if ask:
                jobs += self.record(poll([job.job_id for job in self.in_flight()]))
                asked = time.monotonic()
            if self.book is not None:
                self.book.flush()  # one dvc.lock write for the stages recorded by this poll
            jobs += self.submit_more()
            if jobs:
                delay = first
            elif ask:
                delay = min(longest, delay * 1.5)
        return self.final
