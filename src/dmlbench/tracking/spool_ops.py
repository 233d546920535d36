"""What each spool record does to the tracking store, replayed as often as needed without a duplicate.

Every op is idempotent, so a record whose answer was lost is sent again without a duplicate:
``open_run`` tags its run with the record's key; an ``uncertain`` ``metrics`` record skips the
(key, step) pairs the server holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from dmlbench.tracking.cells import ensure_cell_run
from dmlbench.tracking.runs import PARENT_TAG, TrackedRun, find_training_run, open_training_run

# MLflow error codes that say the record itself is wrong: sending it again gives the same answer
REFUSED = frozenset({
    "INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "INVALID_STATE",
    "BAD_REQUEST", "MALFORMED_REQUEST",
})  # fmt: skip


class UnknownRun(Exception):
    """A record names a run whose opening record was refused: it cannot be sent either."""


def transient(exc: BaseException) -> bool:
    """Whether sending again may succeed (unreachable, timeout, 5xx/429, credentials, a locked SQLite);
    False for an answer refusing the record itself (:data:`REFUSED`) and for a bug here."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        return exc.error_code not in REFUSED
    if isinstance(exc, OSError):
        return True
    try:
        import requests
        import sqlalchemy.exc

        return isinstance(exc, requests.RequestException | sqlalchemy.exc.OperationalError)
    except ImportError:  # pragma: no cover (both come with mlflow)
        return False


class LoggedSteps:
    """The steps the server holds per (run, metric key), read once per key and kept up to date as
    records are sent: what an uncertain ``metrics`` record leaves out."""

    def __init__(self) -> None:
        self.known: dict[tuple[str, str], set[int]] = {}

    def of(self, client: Any, run_id: str, key: str) -> set[int]:
        if (run_id, key) not in self.known:
            self.known[(run_id, key)] = {int(m.step) for m in client.get_metric_history(run_id, key)}
        return self.known[(run_id, key)]

    def add(self, run_id: str, metrics: Mapping[str, float], step: int) -> None:
        for key in metrics:
            if (run_id, key) in self.known:
                self.known[(run_id, key)].add(step)


def _run(runs: Mapping[str, str], handle: str | None) -> str | None:
    if handle is None:
        return None
    if handle not in runs:
        raise UnknownRun(f"no run opened for {handle!r} (its opening record was refused)")
    return runs[handle]


def _metrics(client: Any, record: Mapping[str, Any], run_id: str, uncertain: bool, logged: LoggedSteps) -> None:
    from mlflow.entities import Metric

    step = int(record["step"])
    metrics = dict(record["metrics"])
    if uncertain or record.get("check"):
        metrics = {key: value for key, value in metrics.items() if step not in logged.of(client, run_id, key)}
    if metrics:
        stamp = int(record["timestamp"])
        client.log_batch(run_id, metrics=[Metric(key, float(value), stamp, step) for key, value in metrics.items()])
        logged.add(run_id, metrics, step)


def execute(
    client: Any,
    record: Mapping[str, Any],
    runs: MutableMapping[str, str],
    uncertain: bool,
    logged: LoggedSteps,
    files: Path,
) -> None:
    """Send one record (``uncertain``: it may have reached the server before); an ``open_*``
    record maps its handle in ``runs``. ``files``: where ``artifact`` records' copies are."""
    op = record["op"]
    if op == "open_cell":
        runs[record["run"]] = ensure_cell_run(
            client, record["experiment"], record["key"], record["tags"], record["name"], params=record["params"]
        )
        return
    if op == "open_run":
        parent = _run(runs, record.get("parent"))
        runs[record["run"]] = open_training_run(client, record["request"], parent, key=record["key"])
        return
    if op == "adopt":  # a member trained before its parent existed nests under it
        parent = _run(runs, record["parent"])
        found = find_training_run(record["grid_key"], record["config_hash"], record["experiment"], client)
        if found is not None and found.data.tags.get(PARENT_TAG) != parent:
            TrackedRun(found.info.run_id, client).set_tags({PARENT_TAG: parent})
        return
    run_id = _run(runs, record["run"])
    assert run_id is not None
    handlers: dict[str, Callable[[TrackedRun], None]] = {
        "metrics": lambda run: _metrics(client, record, run.run_id, uncertain, logged),
        "tags": lambda run: run.set_tags(record["tags"]),
        "dataset": lambda run: run.log_dataset(
            record["name"], record["digest"], record["source"], record["profile"], record["context"]
        ),
        "artifact": lambda run: run.log_artifact(files / record["file"], record.get("artifact_path")),
        "terminate": lambda run: client.set_terminated(run.run_id, status=record["status"], end_time=record["end"]),
    }
    handlers[op](TrackedRun(run_id, client))
