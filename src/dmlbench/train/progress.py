"""One log line per training epoch, for a person following a run:

``glyphs-tiny_cnn-contrastive-32-0 epoch 3/6: loss 0.4123, val map_at_r 0.3120 (best), 1,512 img/s, 4.1 s``

Test-feedback scores are never printed: they measure the optimism of test-set selection, not progress.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any


class EpochLine:
    """``on_epoch`` callback printing one line per epoch; ``(best)`` marks a new best validation score."""

    def __init__(
        self,
        name: str,
        epochs: int,
        metric: str,
        history: Iterable[Mapping[str, Any]] = (),
        out: Callable[[str], None] | None = None,
    ):
        self.name, self.epochs, self.key = name, epochs, f"val/{metric}"
        self.best = max((h[self.key] for h in history if self.key in h), default=-math.inf)  # a resumed run's
        self.out = out or (lambda line: print(line, flush=True))

    def __call__(self, epoch: int, metrics: Mapping[str, Any]) -> None:
        parts = [f"loss {metrics['train/loss']:.4f}"]
        if self.key in metrics:
            value = metrics[self.key]
            parts.append(f"val {self.key[4:]} {value:.4f}" + (" (best)" if value > self.best else ""))
            self.best = max(self.best, value)
        parts += [f"{metrics['train/images_per_second']:,.0f} img/s", f"{metrics['train/epoch_seconds']:.1f} s"]
        self.out(f"{self.name} epoch {epoch}/{self.epochs}: " + ", ".join(parts))
