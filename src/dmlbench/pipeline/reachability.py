"""What the compute nodes must reach, refused in one line before anything is submitted to Slurm.

On a compute node ``127.0.0.1``/``localhost``/``::1`` is the node itself and a local disk the
node's own. So a loopback MLflow server or a loopback (or UNIX-socket) Optuna database is refused,
and an MLflow SQLite or file store only suits a cluster whose every node is this machine (on a
network file system SQLite's locking is unsafe:
:func:`dmlbench.pipeline.cluster_checks.require_tracking_for_cluster`; on this machine's own disk
the other nodes see no such file). The nodes are those ``sinfo`` lists; the probe job
(:mod:`dmlbench.pipeline.probe`) then checks from a node that the store answers.
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlparse

from dmlbench.errors import DmlbenchError
from dmlbench.params.model import Params
from dmlbench.params.tuning import tuning_settings
from dmlbench.pipeline.cluster_checks import NETWORK_FILESYSTEMS, filesystem_type
from dmlbench.tracking.store import sqlite_path, tracking_uri

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def loopback(host: str | None) -> bool:
    """Whether ``host`` names this machine's loopback interface (``127.0.0.0/8``, ``::1``,
    ``localhost``)."""
    if not host:
        return False
    name = host.strip("[]").lower()
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def local_only_database(url: str) -> bool:
    """Whether a database URL reaches this machine only: a loopback host, or no host (libpq's
    UNIX socket; ``?host=/run/postgresql`` likewise)."""
    parsed = urlparse(url)
    if parsed.scheme.startswith("sqlite"):
        return False  # a file: judged as a file, not as an address
    if "host=/" in parsed.query or not parsed.hostname:
        return True
    return loopback(parsed.hostname)


def this_machine_names() -> set[str]:
    names = {"localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
    return names | {name.split(".")[0] for name in names}


def cluster_nodes() -> list[str]:
    """The host names of the cluster's nodes (``sinfo``'s ``%n``), or ``[]`` when sinfo says nothing."""
    try:
        listed = subprocess.run(["sinfo", "--noheader", "--format=%n"], capture_output=True, text=True, timeout=30,
                                check=False).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({line.strip() for line in listed.splitlines() if line.strip()})


def _named(nodes: list[str]) -> str:
    return ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "") if nodes else "unknown"


def reachability_problems(params: Params, nodes: list[str] | None = None) -> list[str]:
    """One line per store the compute nodes cannot reach (the module doc's rules); ``nodes``: the
    cluster's node host names (None: asked from ``sinfo`` when a store is this machine's alone)."""
    uri = tracking_uri()
    parsed = urlparse(uri)
    storage = tuning_settings(params).storage
    database = sqlite_path(uri)
    store = database if database is not None else Path(parsed.path or uri) if parsed.scheme in ("", "file") else None
    kind = filesystem_type(store.parent) if store is not None else None
    local_store = store is not None and kind not in NETWORK_FILESYSTEMS  # (SQLite on one: cluster_checks)
    suspects = (parsed.scheme in ("http", "https") and loopback(parsed.hostname)) or local_store
    if not suspects and not (storage and local_only_database(storage)):
        return []
    nodes = cluster_nodes() if nodes is None else nodes
    if nodes and {node.lower() for node in nodes} <= this_machine_names():
        return []  # a single-node cluster on this machine: its jobs see what this process sees
    where = f"the compute nodes ({_named(nodes)})"
    fix = "set MLFLOW_TRACKING_URI to a tracking server they reach (make server prints one; docs/cluster.md)"
    problems = []
    if parsed.scheme in ("http", "https") and loopback(parsed.hostname):
        public = f"{parsed.scheme}://{socket.getfqdn()}" + (f":{parsed.port}" if parsed.port else "")
        problems.append(
            f"--executor slurm: MLFLOW_TRACKING_URI={uri} is this machine's loopback address, which {where} cannot "
            f"reach; use an address they can, e.g. {public} (a server listening there: make server "
            f"DMLBENCH_MLFLOW_HOST=0.0.0.0; docs/cluster.md)"
        )
    elif local_store:
        problems.append(
            f"--executor slurm: MLflow's {'SQLite' if database is not None else 'file'} store {store} is on this "
            f"machine's own disk ({kind or 'local'}), which {where} do not see (each job would write a store of its "
            f"own there); {fix}"
        )
    if storage and local_only_database(storage):
        host = urlparse(storage).hostname or "a local socket"
        problems.append(
            f"--executor slurm: tuning.storage reaches the database at {host}, this machine's alone, which {where} "
            f"cannot reach; name the database server's host (e.g. postgresql://<user>@{socket.getfqdn()}/<db>)"
        )
    return problems


def require_reachable_stores(params: Params) -> None:
    """Refuse (one line per store, before anything is submitted) what the compute nodes cannot reach."""
    problems = reachability_problems(params)
    if problems:
        raise DmlbenchError("\n".join(problems))
