"""Send the tracking records that trainings left in their spools: ``python -m dmlbench.tracking.replay``.

What a training's bounded flush left in ``artifacts/runlog/spool/`` is sent by the first of: its
cell's ``evaluate``, the next ``make repro``, or this command (a spool held by a running process is
left to it). Exit status: 0 all sent, 1 records left (no answer within ``--timeout``), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from dmlbench import paths
from dmlbench.tracking.spool import RECORDS, replay

REPLAY_SECONDS = 30.0  # how long a stage or the runner waits for an unreachable store before going on


def pending_spools(root: Path = Path(".")) -> list[Path]:
    """The spool folders under ``root`` that hold records not yet sent (or not known to be)."""
    base = root / paths.SPOOLS
    return sorted(path.parent for path in base.rglob(RECORDS)) if base.is_dir() else []


def replay_spools(directories: Iterable[Path], timeout: float = REPLAY_SECONDS, quiet: bool = False) -> int:
    """Send what each of ``directories`` holds (one that waits ``timeout`` s in vain ends the replay);
    how many records are left, said in one line unless nothing was pending."""
    sent_spools, left, busy = 0, 0, 0
    for directory in directories:
        if not (directory / RECORDS).exists():
            continue
        remaining = replay(directory, timeout)
        if remaining is None:
            busy += 1
        elif remaining:
            left += remaining
            timeout = 0.0  # the store does not answer: the other spools wait too, without another wait
        else:
            sent_spools += 1
    if not quiet and (sent_spools or left or busy):
        parts = [f"records of {sent_spools} training(s) sent to the tracking store"] if sent_spools else []
        if left:
            parts.append(f"{left} record(s) still wait (the store does not answer; python -m dmlbench.tracking.replay)")
        if busy:
            parts.append(f"{busy} spool(s) in use by a running training")
        print("tracking: " + "; ".join(parts), file=sys.stderr, flush=True)
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spools", nargs="*", type=Path, help="spool folders (default: every one under artifacts/)")
    parser.add_argument("--timeout", type=float, default=REPLAY_SECONDS,
                        help="seconds to wait for an unreachable store before giving up")  # fmt: skip
    args = parser.parse_args(argv)
    directories = args.spools or pending_spools()
    if not directories:
        print("tracking: no record waits in a spool")
        return 0
    return 1 if replay_spools(directories, args.timeout) else 0


if __name__ == "__main__":
    sys.exit(main())
