"""Whether a stage made progress: a fingerprint of what it resumes from, read from its job spec.

A job that ended before its stage did is worth starting again only if its checkpoint moved. A
stage resumes from its persistent outputs (a tune stage's study, a baseline's seed checkpoints)
and, for ``train@``, from ``artifacts/checkpoints/<run>/`` (found from its command's arguments).
:func:`progress` is None for a stage that keeps nothing (only ``cluster.max_retries`` bounds it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from dmlbench import paths
from dmlbench.grid import RunSpec

_RUN = re.compile(r"--dataset (\S+) --backbone (\S+) --loss (\S+) --dim (\d+) --seed (\d+)")


def checkpoint_paths(spec: dict[str, Any]) -> list[Path]:
    """Where the stage of a job spec (:meth:`StageBook.job_spec
    <dmlbench.pipeline.record.StageBook.job_spec>`) keeps what it resumes from."""
    found = [Path(path) for path in spec.get("keep", [])]
    for line in spec.get("lines", []):
        match = _RUN.search(" ".join(line.split()))
        if match and spec.get("stage", "").startswith("train@"):
            dataset, backbone, loss, dim, seed = match.groups()
            run = RunSpec(dataset, backbone, loss, int(dim), int(seed))
            found.append(Path(spec["cwd"]) / paths.checkpoint_dir(run))
    return found


def progress(spec: dict[str, Any]) -> str | None:
    """A fingerprint of the stage's checkpoints (files, bytes, newest modification), None when it
    keeps none (:func:`checkpoint_paths`); it changes whenever a checkpoint is written."""
    paths = checkpoint_paths(spec)
    if not paths:
        return None
    count = size = newest = 0
    for root in paths:
        files = [root] if root.is_file() else (p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
        for file in files:
            try:
                stat = os.stat(file)
            except OSError:  # removed meanwhile
                continue
            count, size, newest = count + 1, size + stat.st_size, max(newest, stat.st_mtime_ns)
    return f"{count}:{size}:{newest}"
