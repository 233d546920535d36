"""Interrupts of the runner: a command run to the end through one (:func:`run_to_the_end`), SIGTERM
raised as Ctrl-C in the local executor (:func:`interrupts_raised`) and passed on to its stages'
process groups (:class:`InterruptibleCommands`). Not in :mod:`dmlbench.launch`: the tune stage
reads that module, so an edit there would make every ``tune@`` stage stale.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

INTERRUPTS = (signal.SIGTERM, signal.SIGHUP)  # handled like Ctrl-C while the command runs


def run_to_the_end(argv: Sequence[str], cwd: Path, env: Mapping[str, str],
                   hangup_as: signal.Signals = signal.SIGINT) -> int:  # fmt: skip
    """Run ``argv`` (a runner, or ``dvc repro``) in a session of its own and wait for it, also when
    this process is interrupted: Ctrl-C, SIGTERM or SIGHUP is passed on once, as SIGINT to its process
    group, so it can stop its stages at their checkpoints, record them in dvc.lock and stop what it
    started (an MPS daemon); then the interrupt is re-raised. A second interrupt kills the group.
    (``subprocess.run`` would kill the child 0.25 s after an interrupt.) The command starts with
    SIGINT handled even where this process ignores it; only the main thread is interrupted.
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


@contextlib.contextmanager
def interrupts_raised() -> Iterator[None]:
    """Inside: SIGTERM raises KeyboardInterrupt, as Ctrl-C does, and Ctrl-C does so also where this
    process inherited SIGINT ignored (started in a non-interactive shell's background; Python then
    installs no KeyboardInterrupt handler). A handled signal is reset to its default in child
    processes, so the commands started inside stop on the interrupt and checkpoint. Both handlers
    are restored on exit. Only the main thread can install handlers: elsewhere nothing changes."""

    def terminate(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous_terminate = signal.getsignal(signal.SIGTERM)
    previous_interrupt = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminate)
        if previous_interrupt == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous_terminate)
            signal.signal(signal.SIGINT, previous_interrupt)


class InterruptibleCommands:
    """The commands running (from several threads), so that an interrupt reaches them: each in a
    session of its own, sent SIGINT once by :meth:`interrupt`, which also stops new ones starting."""

    def __init__(self) -> None:
        self.processes: set[subprocess.Popen[bytes]] = set()
        self.stopping = False
        self.guard = threading.Lock()

    def run(self, argv: list[str], **kwargs: object) -> int:
        """Run ``argv`` (``kwargs``: :class:`subprocess.Popen`'s) and return its exit code;
        ``-SIGINT`` without starting it once :meth:`interrupt` was called."""
        with self.guard:
            if self.stopping:
                return -signal.SIGINT
            # a session of its own: the interrupt reaches the command's whole process group once
            # (from :meth:`interrupt`), not twice (also from the terminal) and not the shell alone
            process = subprocess.Popen(argv, start_new_session=True, **kwargs)  # type: ignore[call-overload]
            self.processes.add(process)
        try:
            return int(process.wait())
        finally:
            with self.guard:
                self.processes.discard(process)

    def interrupt(self) -> None:
        """SIGINT to every running command's process group (the stages stop at their last checkpoint)."""
        with self.guard:
            self.stopping = True
            for process in self.processes:
                if process.poll() is None:
                    try:
                        os.killpg(process.pid, signal.SIGINT)
                    except ProcessLookupError:
                        pass
