"""Optuna studies: samplers and pruners by name, the storage, and resuming an interrupted study.

Storage: an Optuna ``JournalFileBackend`` (safe for processes on one machine) or an RDB URL for
several. Resume: a trial a killed process left ``RUNNING`` is failed and re-enqueued once (across
machines: only when its 30 s heartbeat is stale).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dmlbench.params.tuning import TuningConfig

JOURNAL = "journal.log"
JOURNAL_LOCK_GRACE_SECONDS = 30  # Optuna's default: a lock unchanged this long is stale
FINISHED_STATES = ("COMPLETE", "PRUNED")


# tuning.sampler -> Optuna sampler; one_at_a_time enqueues its whole grid (tune.space.one_at_a_time),
# trials beyond it are random
SAMPLERS = {"gp": "GPSampler", "tpe": "TPESampler", "random": "RandomSampler", "one_at_a_time": "RandomSampler"}


def make_sampler(tuning: TuningConfig) -> Any:
    """``tuning.sampler`` seeded with ``tuning.seed``; GP and TPE start with ``startup_trials`` random trials."""
    import optuna

    sampler = getattr(optuna.samplers, SAMPLERS[tuning.sampler])
    if sampler is optuna.samplers.RandomSampler:
        return sampler(seed=tuning.seed)
    return sampler(seed=tuning.seed, n_startup_trials=tuning.startup_trials)


def make_pruner(tuning: TuningConfig) -> Any:
    """``median``: prune after a fold whose running mean is below the median of earlier trials
    at that fold, once ``startup_trials`` trials have finished (Optuna's ``MedianPruner``)."""
    import optuna

    if tuning.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=max(1, tuning.startup_trials), n_warmup_steps=0)
    return optuna.pruners.NopPruner()


def make_storage(tuning: TuningConfig, directory: Path) -> Any:
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    if tuning.storage:
        # one idle connection per process (a worker array of N tasks holds N, not 5 N: SQLAlchemy's
        # default pool), a second one only while the heartbeat thread and the trial write at once;
        # a connection the server dropped meanwhile (a restart) is replaced, not used
        engine = {"pool_size": 1, "max_overflow": 1, "pool_pre_ping": True}
        sqlite = tuning.storage.startswith("sqlite")  # (one machine; SQLAlchemy's own pool for it)
        return optuna.storages.RDBStorage(tuning.storage, engine_kwargs=None if sqlite else engine)
    directory.mkdir(parents=True, exist_ok=True)
    # absolute: Optuna's lock is a symlink to this path, and a stale lock (its holder killed mid-write)
    # is released after the grace period only when the link resolves, which a relative one does not
    journal = str((directory / JOURNAL).resolve())
    lock = JournalFileSymlinkLock(journal, grace_period=JOURNAL_LOCK_GRACE_SECONDS)
    return optuna.storages.JournalStorage(JournalFileBackend(journal, lock_obj=lock))


def open_study(name: str, tuning: TuningConfig, storage: Any, worker: int = 0) -> Any:
    """The study ``name`` in ``storage``, created if new (maximising the objective). Each worker
    seeds its sampler with ``tuning.seed + worker``: equal seeds would draw the same points."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seeded = tuning.model_copy(update={"seed": tuning.seed + worker})
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=make_sampler(seeded),
        pruner=make_pruner(tuning),
        direction="maximize",
        load_if_exists=True,
    )


def finished_count(study: Any) -> int:
    import optuna

    states = tuple(getattr(optuna.trial.TrialState, s) for s in FINISHED_STATES)
    return len(study.get_trials(deepcopy=False, states=states))


HEARTBEAT = "heartbeat"  # user attr: the unix time a worker last said its running trial is alive
HEARTBEAT_SECONDS = 30.0


@contextmanager
def heartbeat(storage: Any, trial: Any, every: float = HEARTBEAT_SECONDS) -> Iterator[None]:
    """Stamp ``trial`` with the time every ``every`` s while the block runs, so other workers tell a
    dead trial from a live one (Optuna's heartbeat runs inside ``study.optimize`` only)."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            storage.set_trial_user_attr(trial._trial_id, HEARTBEAT, time.time())
            if stop.wait(every):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def recover_interrupted(study: Any, storage: Any, stale_after: float | None = None) -> list[int]:
    """Fail and re-enqueue trials a killed process left running; their numbers. ``stale_after`` None:
    every running trial (no other process works on the study), else those whose heartbeat (or start)
    is older. (``FrozenTrial._trial_id`` is the storage's key; Optuna has no public one.)"""
    import optuna

    now = time.time()
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if stale_after is not None:
        running = [t for t in running if now - _last_beat(t) > stale_after]
    for trial in running:
        storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
        storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number}, skip_if_exists=False)
    return [t.number for t in running]


def _last_beat(trial: Any) -> float:
    beat = trial.user_attrs.get(HEARTBEAT)
    if beat is not None:
        return float(beat)
    return trial.datetime_start.timestamp() if trial.datetime_start else 0.0


def enqueue_once(study: Any, points: list[dict[str, Any]]) -> None:
    """Enqueue ``points`` (the published values, the one-at-a-time grid) when the study is new."""
    if study.get_trials(deepcopy=False):
        return
    for index, point in enumerate(points):
        study.enqueue_trial(point, user_attrs={"planned": index}, skip_if_exists=False)
