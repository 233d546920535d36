"""What the Slurm executor refuses before it submits anything, each in one line.

* :func:`require_slurm`: no Slurm client, or no controller answering ``sinfo``.
* :func:`require_tracking_for_cluster`: an MLflow SQLite store on a network file system. Jobs on
  several nodes would write one SQLite file over NFS, Lustre, GPFS, BeeGFS or CephFS, whose
  locking SQLite does not trust (https://www.sqlite.org/faq.html#q5, "file locking is buggy on
  many network filesystem implementations"); the fix is a tracking server
  (``MLFLOW_TRACKING_URI=http://...``: the site's, or ``make server`` on a PostgreSQL database).
  The file system is the ``/proc/mounts`` type of the mount that holds the store's directory.
* :func:`require_array_storage`: a tune stage's worker array (``tuning.workers`` > 1 with a
  ``tuning.storage``) on an SQLite study (tasks on several nodes, one SQLite file; the same FAQ), or
  on MySQL (not what the project's server runs): an Optuna journal or PostgreSQL only.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import urlparse

from dmlbench.errors import DmlbenchError
from dmlbench.params.tuning import TuningConfig

MOUNTS = Path("/proc/mounts")
# /proc/mounts types of network and cluster file systems (fuse.* for their FUSE clients)
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "ceph", "fuse.ceph", "fuse.ceph-fuse", "cifs", "smb3",
    "fuse.sshfs", "glusterfs", "fuse.glusterfs", "pvfs2", "orangefs", "afs", "panfs", "wekafs", "fuse.juicefs",
})  # fmt: skip


def require_slurm() -> None:
    """Refuse before submitting anything when this machine cannot reach a Slurm controller."""
    try:
        subprocess.run(["sinfo", "--noheader", "--format=%P"], check=True, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise DmlbenchError(
            "--executor slurm: sbatch/sinfo not found on PATH (install Slurm's client, or `make cluster-up`)"
        ) from None
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise DmlbenchError(f"--executor slurm: no Slurm controller answers sinfo ({detail.strip()})") from None


def _unescape(field: str) -> str:
    """A /proc/mounts field: spaces, tabs, newlines and backslashes are octal escapes there."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem_type(path: Path, mounts: Path = MOUNTS) -> str | None:
    """The file system type of the mount that holds ``path`` (the longest mount point above it),
    or None when the mounts table cannot be read."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def sqlite_path(uri: str) -> Path | None:
    """The database file of an SQLite tracking URI (``sqlite:///abs/path`` or ``sqlite:///rel``), else None."""
    parsed = urlparse(uri)
    if parsed.scheme != "sqlite":
        return None
    return Path(parsed.path[1:] or "mlflow.db")  # "//abs/x.db" -> /abs/x.db, "/rel.db" -> rel.db


def require_tracking_for_cluster(uri: str, mounts: Path = MOUNTS) -> None:
    """Refuse an SQLite tracking store on a network file system (see the module doc)."""
    database = sqlite_path(uri)
    if database is None:
        return
    kind = filesystem_type(database.parent, mounts)
    if kind in NETWORK_FILESYSTEMS:
        raise DmlbenchError(
            f"--executor slurm: MLflow's SQLite store {database} is on a {kind} file system, which jobs on "
            f"several nodes cannot share safely; set MLFLOW_TRACKING_URI to your site's MLflow server, or run "
            f"one with `make server DATABASE_URL=postgresql://<user>@<host>/<db>` (docs/cluster.md)"
        )


def require_array_storage(tuning: TuningConfig) -> None:
    """Refuse a tune worker array whose study is not PostgreSQL (see the module doc), in one line."""
    storage = tuning.storage or ""
    if tuning.workers > 1 and storage and not storage.startswith("postgresql"):
        scheme = storage.split(":", 1)[0]
        raise DmlbenchError(
            f"--executor slurm: tuning.storage is {scheme}, and tuning.workers: {tuning.workers} runs the workers "
            "as a Slurm array on several nodes; use PostgreSQL (postgresql://<user>@<host>/<db>), or storage: null "
            "(an Optuna journal; the workers then run in the tune job, on one node)"
        )
