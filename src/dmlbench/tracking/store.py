"""The MLflow tracking store: ``$MLFLOW_TRACKING_URI`` or ``sqlite:///<repo>/mlflow.db``.

Concurrent creation corrupts a fresh sqlite store and ``set_experiment`` races route runs to
"Default" (mlflow#4123, #12259): both are created once under a file lock, runs with an explicit id.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dmlbench.paths import project_root

# MLflow 3 opens an experiment in its GenAI layout (traces, evaluations) unless the experiment's
# ``mlflow.experimentKind`` tag says it is for model training; the UI reads this tag (values
# "genai_development" / "custom_model_development", mlflow/server/js ExperimentKind enum).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"

QUIET_ENV = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}


def configure_environment() -> None:
    """Telemetry off and no "View run at" lines; call before importing mlflow."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)


# MLflow's HTTP client for a process whose records go through a spool (:mod:`dmlbench.tracking.spool`):
# its sender waits and retries itself, so a request fails fast instead of riding out MLflow's own
# backoff (7 retries, about 4 minutes) and its 120 s timeout; read by MLflow at every request
# (mlflow.environment_variables); a value set in the environment wins
BACKGROUND_CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


_background_users: list[dict[str, str | None]] = []  # one entry per open spool: the values it replaced


def configure_background_client() -> None:
    """Short retries and timeouts for MLflow's HTTP requests in this process (:data:`BACKGROUND_CLIENT_ENV`),
    until :func:`restore_client_environment` (a spool's close) is called as often."""
    configure_environment()
    _background_users.append({key: os.environ.get(key) for key in BACKGROUND_CLIENT_ENV})
    for key, value in BACKGROUND_CLIENT_ENV.items():
        os.environ.setdefault(key, value)


def restore_client_environment() -> None:
    """Undo :func:`configure_background_client` once the last spool of this process closed."""
    if not _background_users:
        return
    before = _background_users.pop()
    if _background_users:
        return
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` or the project's sqlite file; a URI carrying a password is refused (use
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlflow.db'}"
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https") and parsed.password is not None:
        from dmlbench.errors import ConfigError

        raise ConfigError(
            f"MLFLOW_TRACKING_URI holds a password ({parsed.scheme}://{parsed.username}:***@{parsed.hostname}); "
            "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in the environment instead"
        )
    return uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    if not uri.startswith("sqlite:"):
        return None
    path = urlparse(uri).path
    if uri.startswith("sqlite:////"):
        return Path("/" + path.lstrip("/"))
    return Path(path.lstrip("/")).resolve()


def store_lock() -> Any:
    """A file lock beside a local sqlite store, or in the (shared) project for a server: for creating
    the store and find-or-create of a shared run. Not re-entrant: never nest two in one process."""
    from filelock import FileLock

    db = sqlite_path(tracking_uri())
    if db is None:
        if not (project_root() / ".dvc").is_dir():
            return contextlib.nullcontext()  # not a DVC project: one process at a time anyway
        lock = project_root() / ".dvc" / "tmp" / "mlflow-server.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(lock))
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(db) + ".lock")


def _create_sqlite_store(db: Path) -> None:
    """Create a new sqlite store whole or not at all (a migration killed midway leaves a file MLflow
    refuses): built beside ``db`` and renamed into place. Call under :func:`store_lock`."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for left in db.parent.glob(f".{db.name}.*.partial"):  # by a process killed here (we hold the lock)
        left.unlink(missing_ok=True)
    partial = db.with_name(f".{db.name}.{os.getpid()}.partial")
    try:
        store = SqlAlchemyStore(f"sqlite:///{partial}", (db.parent / "mlruns").as_uri())
        store.engine.dispose()
        os.replace(partial, db)
    finally:
        partial.unlink(missing_ok=True)


def client() -> Any:
    """An ``MlflowClient`` on :func:`tracking_uri`; a new sqlite store is created whole under the lock."""
    configure_environment()
    from mlflow.tracking import MlflowClient

    uri = tracking_uri()
    db = sqlite_path(uri)
    with store_lock():  # the constructor opens the store
        if db is not None and not db.exists():
            _create_sqlite_store(db)
        return MlflowClient(tracking_uri=uri)


def ensure_experiment(name: str, mlflow_client: Any | None = None) -> str:
    """Create the store (if new) and the experiment (if missing) once; return its id."""
    from mlflow.exceptions import MlflowException

    mlflow_client = mlflow_client or client()
    db = sqlite_path(tracking_uri())
    with store_lock():
        experiment = mlflow_client.get_experiment_by_name(name)
        if experiment is None:
            location = (db.parent / "mlruns" / name).as_uri() if db is not None else None
            try:
                return mlflow_client.create_experiment(
                    name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
                )
            except MlflowException as exc:  # created meanwhile by a process without our lock (a server)
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                experiment = mlflow_client.get_experiment_by_name(name)
        if experiment.lifecycle_stage == "deleted":
            mlflow_client.restore_experiment(experiment.experiment_id)
        if experiment.tags.get(EXPERIMENT_KIND_TAG) not in (EXPERIMENT_KIND, "genai_development"):
            # a store made by older code, or a kind the UI only inferred; an explicit choice stays
            mlflow_client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return experiment.experiment_id


def supersede(mlflow_client: Any, runs: list[Any], run_id: str) -> None:
    """Tag each of ``runs`` but ``run_id`` ``superseded_by`` it and move it to MLflow's trash."""
    for old in runs:
        if old.info.run_id != run_id:
            mlflow_client.set_tag(old.info.run_id, "superseded_by", run_id)
            mlflow_client.delete_run(old.info.run_id)


@lru_cache(maxsize=1)
def git_state() -> tuple[str, bool]:
    """(commit sha or "unknown", whether code or params differ from it)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=project_root(), capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        return commit, bool(git("status", "--porcelain", "--", "src", "stages", "params.yaml", "dvc.yaml").strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
