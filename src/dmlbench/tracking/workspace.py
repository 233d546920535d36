"""Which runs this workspace trained: a workspace identity, kept in the run logs.

A workspace (one checkout with its ``artifacts/``) is named once by a random id in
``artifacts/runlog/workspace.json`` (git-ignored and no DVC output: a ``git clone`` or a ``dvc
pull`` never copies it, so every clone gets its own). Each training writes the id, beside its
host, into its run log (:mod:`dmlbench.tracking.runlog`), which stays out of DVC's outputs: the
DVC outputs of two clones stay byte-identical. A run of the grid is

* ``trained here`` when its run log exists, belongs to that training (same config hash) and names
  this workspace (a run log written before the id existed names none: it was written here);
* ``pulled`` otherwise: its outputs were restored from a DVC cache or remote (``dvc pull``,
  ``dvc checkout``) without the run log of the machine that trained them. Where from: the run
  records its device (``run.json``); the DVC remote it came from is the repository's default
  remote (:func:`default_remote`), the only place ``dvc pull`` reads without naming one.
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
    """This workspace's id (16 hex digits), created on first use and kept in :data:`WORKSPACE_FILE`.

    Created whole and at most once: the file is written under a temporary name and hard-linked
    into place, which fails when it exists, so trainings that start together (a Slurm array) all
    read the one id that won."""
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
    """``<name> (<url>)`` of the repository's default DVC remote (``core.remote`` of ``.dvc/config``
    and ``.dvc/config.local``, the files ``dvc remote default`` writes), or ``""`` when none is set."""
    config = configparser.ConfigParser()
    config.read([root / ".dvc" / "config", root / ".dvc" / "config.local"])
    name = config.get("core", "remote", fallback="")
    if not name:
        return ""
    url = config.get(f"'remote \"{name}\"'", "url", fallback="")
    return f"{name} ({url})" if url else name
