"""Slurm's generic resources (GRES) as its tools print them, for a GPU shared by several jobs.

One reading serves both ends of a share (``cluster.gpu_slots`` > 1): the executor asks for
``shares_per_gpu // gpu_slots`` of a GPU's shards or MPS units, the count per GPU read from
``sinfo --format=%G`` (:func:`dmlbench.pipeline.slurm_queries.gres_per_gpu`), and the job reads back
the share it got from its node's count (``scontrol show node``) and its own
``SLURM_SHARDS_ON_NODE`` (:func:`dmlbench.devices.gpu_share`). The text is Slurm's GRES list:
``gpu:h100:4(S:0-1),shard:h100:32(S:0-1)`` (https://slurm.schedmd.com/gres.html).
"""

from __future__ import annotations

import re


def gres_counts(listed: str) -> dict[str, int]:
    """Count per GRES name in ``listed`` (``name[:type]:count[(socket binding)]``, comma-separated),
    summed over types: ``gpu:h100:4(S:0-1),shard:h100:32(S:0-1)`` -> ``{"gpu": 4, "shard": 32}``;
    entries without a count (``(null)``) are skipped."""
    counts: dict[str, int] = {}
    for entry in re.sub(r"\([^)]*\)", "", listed.strip()).split(","):
        fields = entry.split(":")
        if len(fields) >= 2 and fields[0] and fields[-1].isdigit():
            counts[fields[0]] = counts.get(fields[0], 0) + int(fields[-1])
    return counts


def per_gpu(counts: dict[str, int], name: str) -> int | None:
    """How many of GRES ``name`` (``shard``, ``mps``) a node has per GPU (floor), or None when it
    lists no GPU or none of ``name``."""
    return counts[name] // counts["gpu"] if counts.get("gpu") and counts.get(name) else None
