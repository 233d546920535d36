"""Divergence: a training whose loss, batch embeddings or weights went non-finite, found on the device.

The loss alone does not show it (reducers drop NaN terms; BatchNorm statistics overflow unseen). Each
step records finiteness on the device (:meth:`FiniteWatch.record`, no sync); every
:func:`finite_check_interval` batches :meth:`FiniteWatch.check` adds the weights and syncs once.
Finiteness is read from one sum per tensor; a sum that overflowed from finite values is told apart."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from dmlbench.errors import TrainingDiverged

GPU_FINITE_CHECK_EVERY = 25  # batches between finiteness checks off the CPU (each syncs the device)
NAMED_SHOWN = 3  # non-finite weights named in a message

NamedTensors = Callable[[], Iterable[tuple[str, torch.Tensor]]]


def finite_check_interval(device: torch.device) -> int:
    """Batches between finiteness checks: every batch on the CPU, every
    ``GPU_FINITE_CHECK_EVERY`` elsewhere (a check waits for the device)."""
    return 1 if device.type == "cpu" else GPU_FINITE_CHECK_EVERY


def to_host(flags: torch.Tensor) -> list[bool]:
    """The one device sync of a check: ``flags`` (bool, 1-D) read back to the host."""
    return flags.cpu().tolist()


@dataclass(frozen=True)
class Divergence:
    """What went non-finite first: ``cause`` (loss, embeddings or weights), at ``batch`` (from 1)."""

    cause: str
    batch: int
    detail: str  # e.g. "loss is nan", "embeddings are not finite while the loss is 0.0 (...)"


class FiniteWatch:
    """One epoch's per-batch finiteness of loss and embeddings, on the device until checked;
    ``named_state``: the named parameters and buffers a check adds; ``losses``: each batch's loss."""

    def __init__(self, named_state: NamedTensors):
        self.named_state = named_state
        self.losses: list[torch.Tensor] = []
        self.flags: list[torch.Tensor] = []  # per batch: [loss finite, every embedding finite]
        self.checked = 0  # batches already checked

    def record(self, loss: torch.Tensor, embeddings: torch.Tensor) -> None:
        """Keep the batch's loss and its finiteness flags on the device (no host sync)."""
        self.losses.append(loss)
        self.flags.append(torch.stack([torch.isfinite(loss), torch.isfinite(embeddings).all()]))

    def check(self) -> Divergence | None:
        """What went non-finite among the batches recorded since the last check, or in the weights
        now; None when everything is finite. One device sync."""
        recent = self.flags[self.checked :]
        named = [(name, t) for name, t in self.named_state() if t.is_floating_point()]
        parts = [torch.stack(recent).flatten()] if recent else []
        if named:
            parts.append(torch.isfinite(torch.stack([t.sum().float() for _, t in named])))
        flags = to_host(torch.cat(parts))
        start, self.checked = self.checked, len(self.flags)
        for offset in range(len(recent)):
            loss_finite, embeddings_finite = flags[2 * offset], flags[2 * offset + 1]
            if not (loss_finite and embeddings_finite):
                return self._batch(start + offset, bool(loss_finite), bool(embeddings_finite))
        summed = zip(named, flags[2 * len(recent) :], strict=True)
        bad = [name for (name, tensor), ok in summed if not ok and not bool(torch.isfinite(tensor).all())]
        if not bad:
            return None
        shown = ", ".join(bad[:NAMED_SHOWN]) + (f" and {len(bad) - NAMED_SHOWN} more" if len(bad) > NAMED_SHOWN else "")
        return Divergence("weights", self.checked, f"weights are not finite ({shown})")

    def _batch(self, index: int, loss_finite: bool, embeddings_finite: bool) -> Divergence:
        loss = self.losses[index].item()
        if embeddings_finite:
            return Divergence("loss", index + 1, f"loss is {loss}")
        if loss_finite:
            detail = f"embeddings are not finite while the loss is {loss:g} (its reducer or miner hid it)"
        else:
            detail = f"embeddings are not finite (loss {loss})"
        return Divergence("embeddings", index + 1, detail)


def diverged(where: str, epoch: int, found: Divergence, lr: float, grad_clip: float | None) -> TrainingDiverged:
    """The one-line error for ``found`` in run ``where`` (``<run key>`` or ``<run key> fold f``):
    what went non-finite, when, and what to try."""
    clip = "clip gradients (protocol key grad_clip)"
    if grad_clip:
        clip = f"clip gradients harder (grad_clip, now {grad_clip:g})"
    return TrainingDiverged(
        f"{where}: {found.detail} at epoch {epoch}, batch {found.batch}; lower the learning rate "
        f"(optimizer.lr, now {lr:g}), {clip} or check the loss hyperparameters",
        cause=found.cause,
        epoch=epoch,
        batch=found.batch,
    )
