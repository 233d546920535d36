"""The plan's text: stages by kind with their estimates, device-hours, wall time, memory, disk,
MLflow growth, and the legend of every estimate's source. Pure: estimates in, text out."""

from __future__ import annotations

from collections.abc import Sequence

from dmlbench.cost.model import PHASES, StageEstimate, device_hours, duration, wall_seconds

GIB = 2**30


def _size(size: float) -> str:
    """``812 MB``, ``13.4 GB``, ``1,234 GB`` (decimal units, as disks are sold)."""
    if size < 1e9:
        return f"{size / 1e6:.0f} MB"
    return f"{size / 1e9:,.1f} GB" if size < 1e11 else f"{size / 1e9:,.0f} GB"


def _hours(hours: float) -> str:
    return f"{hours:,.2f}" if hours < 10 else f"{hours:,.1f}"


SOURCES = {
    "measured": "measured: a row of the throughput table (protocol x backbone)",
    "flops": "FLOP-based: training FLOPs per image at the stated share of the peak (no row measured)",
    "flops (CPU, assumed)": "k-NN FLOPs at an assumed CPU rate",
    "assumed": "assumed rate or duration (dmlbench.cost.price), never measured",
}


def _kinds(estimates: Sequence[StageEstimate]) -> list[str]:
    order = [kind for kinds in PHASES for kind in kinds]
    present = {e.kind for e in estimates}
    return [k for k in order if k in present] + sorted(present - set(order))


def render_plan(estimates: Sequence[StageEstimate], workers: int, header: str, notes: Sequence[str] = ()) -> str:
    """The plan: ``header``, a table by kind, totals, and ``notes`` (the rates' sources, the caps)."""
    lines = [header, ""]
    columns = f"{'kind':20s} {'stages':>6s} {'device':6s} {'each (max)':>12s} {'device-h':>10s} " \
              f"{'RAM peak':>9s} {'GPU peak':>9s} {'cache':>9s}  source"  # fmt: skip
    lines += [columns, "-" * len(columns)]
    for kind in _kinds(estimates):
        group = [e for e in estimates if e.kind == kind]
        gpu = any(e.gpu for e in group)
        hours = sum(e.seconds for e in group if e.gpu) / 3600
        gpu_peak = [e.gpu_bytes for e in group if e.gpu_bytes is not None]
        sources = ", ".join(sorted({e.source for e in group}))
        lines.append(
            f"{kind:20s} {len(group):6d} {'GPU' if gpu else 'CPU':6s} {duration(max(e.seconds for e in group)):>12s} "
            f"{(_hours(hours) if gpu else '-'):>10s} {max(e.ram_bytes for e in group) / GIB:7.1f} Gi "
            f"{(f'{max(gpu_peak) / GIB:.1f} Gi' if gpu_peak else ('n/m' if gpu else '-')):>9s} "
            f"{_size(sum(e.cache_bytes for e in group)):>9s}  {sources}"
        )  # fmt: skip
    lines.append("-" * len(columns))
    total_cpu_hours = sum(e.seconds for e in estimates if not e.gpu) / 3600
    lines += [
        f"{len(estimates)} stages. Device time: {_hours(device_hours(estimates))} GPU-hours + "
        f"{_hours(total_cpu_hours)} CPU-stage-hours.",
        f"Wall time on {workers} parallel slot(s): {duration(wall_seconds(estimates, workers))} "
        "(phases by kind one after another, longest stage first within each).",
        f"Disk: DVC cache +{_size(sum(e.cache_bytes for e in estimates))} (archives, prepared images, "
        f"models, embeddings); MLflow store +{_size(sum(e.mlflow_bytes for e in estimates))}.",
        "RAM/GPU peak: the most one stage of the kind holds (n/m: not measured), RAM with its dataset's prepared"
        " cache, memory-mapped and shared by all stages of a box; each (max): the longest stage.",
    ]
    used = sorted({e.source for e in estimates})
    lines += ["", "Sources:"] + [f"  {SOURCES.get(s, s)}" for s in used] + [f"  {note}" for note in notes]
    return "\n".join(lines)
