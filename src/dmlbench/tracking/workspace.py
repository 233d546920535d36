"""Which runs this workspace trained: a workspace identity, kept in the run logs.

A random id in ``artifacts/runlog/workspace.json`` (copied by neither git nor DVC) goes into each run
log; a run is ``trained here`` when its run log matches and names this workspace, else ``pulled``.
"""

from __future__ import annotations

import configparser
import json
import os
import secrets
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench.errors import DmlbenchError
from dmlbench.io import read_json
from dmlbench.tracking.runlog import host

WORKSPACE_FILE = Path("artifacts") / "runlog" / "workspace.json"
TRAINED_HERE = "trained here"
PULLED = "pulled"


def workspace_id(root: Path = Path(".")) -> str:
    """This workspace's id (16 hex digits) in :data:`WORKSPACE_FILE`, created at most once (hard-linked
    into place, so trainings that start together all read the one id that won)."""
    file = root / WORKSPACE_FILE
    if not file.exists():
        file.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=file.parent, prefix=".workspace.", delete=False) as tmp:
            json.dump({"id": secrets.token_hex(8), "created_on": host()}, tmp)
        try:
            os.link(tmp.name, file)
        except FileExistsError:
            pass  # another process made it first: its id is the workspace's
        finally:
            os.unlink(tmp.name)
    found = read_json(file).get("id")
    if not isinstance(found, str) or not found:
        raise DmlbenchError(f"{file}: holds no workspace id; delete it (a new one is made)")
    return found


def provenance(runlog: Mapping[str, Any] | None, config_hash: str | None, here: str) -> str:
    """:data:`TRAINED_HERE` or :data:`PULLED` for a run whose run log is ``runlog`` (None: none)
    and whose ``run.json`` records ``config_hash``; ``here``: this workspace's id."""
    if runlog is None or runlog.get("config_hash") != config_hash:
        return PULLED
    return TRAINED_HERE if runlog.get("workspace", here) == here else PULLED


def default_remote(root: Path = Path(".")) -> str:
    """``<name> (<url>)`` of the default DVC remote (``core.remote`` of ``.dvc/config[.local]``), or ``""``."""
    config = configparser.ConfigParser()
    config.read([root / ".dvc" / "config", root / ".dvc" / "config.local"])
    name = config.get("core", "remote", fallback="")
    if not name:
        return ""
    url = config.get(f"'remote \"{name}\"'", "url", fallback="")
    return f"{name} ({url})" if url else name
