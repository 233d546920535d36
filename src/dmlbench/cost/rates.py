"""The cost model's training rates: the throughput rows ``make gpu-check`` writes to
``reports/gpu_check.json``, else the backbone's FLOPs (``torch.utils.flop_counter``, training = 3 x
forward) at a stated model FLOP utilisation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dmlbench.cost.model import Rate, flop_rate
from dmlbench.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from dmlbench.models.base import BackboneParams

THROUGHPUT_TABLE = Path("reports") / "gpu_check.json"
# the dense bf16 matrix-product peak benchmarks/gpu_check.py measured on one H100 80GB HBM3 (7.98e14 FLOP/s,
# reports/gpu_check.json): the GPU peak of a FLOP-based rate when the table measured none
ASSUMED_GPU_PEAK_FLOPS = 7.98e14
# a CPU core's sustained float32 matrix-product rate, assumed (AVX2/AVX-512 cores reach 5e10-1e11)
ASSUMED_CPU_PEAK_FLOPS_PER_CORE = 5e10
DEFAULT_EFFICIENCY = 0.05  # model FLOP utilisation of a FLOP-based rate: the 1-7 % docs/gpu.md measures


@dataclass(frozen=True)
class MeasuredRow:
    """One throughput row: the protocol (the setting's name), backbone, batch and its figures."""

    protocol: str
    backbone: str
    batch: int
    images_per_s: float
    peak_flops: float | None
    peak_memory_mib: float | None
    device: str
    date: str
    precision: str | None  # the measured step's arithmetic; None in rows written before it was recorded


def read_table(path: Path) -> list[MeasuredRow]:
    """The eager, error-free throughput rows of a ``gpu_check.json`` (none when the file is absent).
    A file that is not such a report: a one-line :class:`ConfigError`."""
    if not path.exists():
        return []
    try:
        report = json.loads(path.read_text())
        date = str((report.get("environment") or {}).get("date", "undated"))
        rows = []
        for row in report.get("throughput") or []:
            if "error" in row or "skipped" in row or row.get("compile_mode") not in (None, "eager"):
                continue
            setting = row["setting"]
            rows.append(
                MeasuredRow(
                    str(setting["name"]), str(setting["backbone"]), int(setting["batch"]),
                    float(row["full_images_per_s"]), _number(row.get("peak_flops")),
                    _number(row.get("peak_memory_mib")), str(row.get("device", "unknown device")), date,
                    row.get("precision"),
                )
            )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{path}: not a gpu_check report with throughput rows ({type(exc).__name__}: {exc})"
        ) from None
    return rows


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def measured_rate(rows: list[MeasuredRow], protocol: str, backbone: str, batch: int, amp: str = "auto") -> Rate | None:
    """The measured rate of ``protocol`` x ``backbone`` (its batch's row if several), else None; an
    ``fp32`` protocol measured with autocast (or unknown precision) is noted as optimistic."""
    matches = [r for r in rows if r.protocol == protocol and r.backbone == backbone]
    if not matches:
        return None
    row = min(matches, key=lambda r: abs(r.batch - batch))
    batch_note = "" if row.batch == batch else f", at batch {row.batch} (the protocol's: {batch})"
    precision = row.precision or "an unrecorded precision (amp: auto: bf16 on the GPU)"
    precision_note = ""
    if amp == "fp32" and row.precision != "fp32":
        precision_note = f"; measured in {precision}, the protocol trains in strict fp32: optimistic"
    note = f"measured: {row.images_per_s:,.0f} img/s on {row.device}, {row.date}{batch_note}{precision_note}"
    return Rate(row.images_per_s, "measured", note, row.peak_memory_mib)


def gpu_peak_flops(rows: list[MeasuredRow]) -> tuple[float, str]:
    """The GPU peak a FLOP-based rate is relative to: the table's measured peak, else the assumed one."""
    peaks = [r.peak_flops for r in rows if r.peak_flops]
    if peaks:
        return max(peaks), f"measured peak {max(peaks):.3g} FLOP/s ({rows[0].device})"
    return ASSUMED_GPU_PEAK_FLOPS, f"assumed peak {ASSUMED_GPU_PEAK_FLOPS:.3g} FLOP/s (one H100, bf16)"


def flops_based_rate(train_flops: float, peak: float, peak_note: str, efficiency: float) -> Rate:
    """A rate from the FLOP count, marked as such."""
    rate = flop_rate(train_flops, peak, efficiency)
    note = f"FLOP-based: {train_flops:.3g} training FLOPs/img at {efficiency:.0%} of the {peak_note}"
    return Rate(rate, "flops", note)


_SIZES: dict[tuple[str, str, int, str, int], tuple[float, int]] = {}


def model_size(backbone: str, params: BackboneParams, dim: int, pooling: str, crop: int) -> tuple[float, int]:
    """(training FLOPs per ``crop`` x ``crop`` image = 3 x forward, parameters) of the bare architecture."""
    key = (backbone, params.model_dump_json(), dim, pooling, crop)
    if key not in _SIZES:
        import torch

        from dmlbench.models import build_model

        with torch.random.fork_rng():
            model = build_model(backbone, params, dim, pooling, pretrained=False)
        forward = forward_flops_per_image(model, crop, torch.device("cpu"))
        _SIZES[key] = (3 * forward, sum(p.numel() for p in model.parameters()))
    return _SIZES[key]


def forward_flops_per_image(model: torch.nn.Module, crop: int, device: torch.device) -> float:
    """FLOPs of one forward pass of one ``crop`` x ``crop`` image (multiply-add = 2)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(torch.rand(2, 3, crop, crop, device=device))
    model.train(was_training)
    return counter.get_total_flops() / 2
