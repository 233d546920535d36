"""A command run to the end through an interrupt: the runner's child processes (a preset's run in
its workspace, the sequential ``dvc repro``) get Ctrl-C, SIGTERM or SIGHUP once, as SIGINT, and
are waited for while their stages stop at their checkpoints (:func:`run_to_the_end`).

Kept in the runner's package, not in :mod:`dmlbench.launch`: the tune stage reads that module, so
an edit there would make every ``tune@`` stage stale.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

INTERRUPTS = (signal.SIGTERM, signal.SIGHUP)  # handled like Ctrl-C while the command runs


def run_to_the_end(argv: Sequence[str], cwd: Path, env: Mapping[str, str],
                   hangup_as: signal.Signals = signal.SIGINT) -> int:  # fmt: skip
    """Run ``argv`` (a runner, or ``dvc repro``) and wait for it, also when this process is
    interrupted: Ctrl-C, SIGTERM or SIGHUP here is passed on once, as SIGINT to the command's
    process group (e.g. a preset's runner, and under ``--jobs 1`` its ``dvc repro`` and the stage
    that runs; the local executor's stages have sessions of their own and get it from their runner),
    and the command is left to stop its stages at their checkpoints, record the finished ones in
    dvc.lock and stop what it started (an MPS daemon); then the interrupt is re-raised. A second
    interrupt kills the group. (``subprocess.run`` kills the child 0.25 s after an interrupt, before
    any of that.) The command has a session of its own, so a terminal's Ctrl-C reaches it only
    through here, once; it starts with SIGINT handled even where this process ignores it (a
    background job of a script). Only the main thread can be interrupted (elsewhere it just waits).
    ``hangup_as``: what SIGTERM and SIGHUP are passed on as (SIGTERM: a run on Slurm detaches from
    its jobs instead of cancelling them)."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, *INTERRUPTS)} if main_thread else {}

    received: list[int] = []

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    process: subprocess.Popen[bytes] | None = None
    try:
        if main_thread:
            for signum in INTERRUPTS:
                signal.signal(signum, interrupt)
            # an ignored SIGINT would be inherited, and the runner would never stop on the one passed on
            signal.signal(signal.SIGINT, signal.default_int_handler)
        process = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), start_new_session=True)
        return process.wait()
    except KeyboardInterrupt:
        if process is None:
            raise
        if process.poll() is None:
            passed = hangup_as if received and received[-1] in INTERRUPTS else signal.SIGINT
            if passed == signal.SIGINT:
                print("\ninterrupted: the stages stop at their checkpoints (interrupt again: kill them)", flush=True)
            try:
                os.killpg(process.pid, passed)
            except ProcessLookupError:
                pass
        try:
            process.wait()
        except KeyboardInterrupt:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # e.g. the runner and, under --jobs 1, dvc and its stage
            except ProcessLookupError:
                pass
            process.wait()
            print("killed: stages or an MPS daemon may be left running (ps -u $USER)", file=sys.stderr)
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
