"""A preset run in its own workspace (:mod:`dmlbench.pipeline.workspace`): the main checkout's
params.yaml and dvc.lock stay as they are."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from dmlbench.params.presets import Preset, params_text
from dmlbench.pipeline.workspace import environment, prepare_workspace, uncommitted_code


def run_preset(preset: Preset, params_file: Path, forwarded: list[str]) -> int:
    """Run the pipeline (``forwarded``: every runner option, ``--executor``, ``--jobs``, ``--gpus``,
    ``--fetch-only``) in the preset's own workspace."""
    main_root = params_file.resolve().parent
    changed = uncommitted_code(main_root)
    workspace = prepare_workspace(main_root, preset.name, params_text(preset))
    print(f"preset {preset.name!r}: {preset.description}")
    print(f"workspace: {workspace.root} (git worktree at {workspace.commit[:12]}; own params.yaml and dvc.lock)")
    if changed:
        print(f"note: the preset runs the committed code; uncommitted changes to {', '.join(changed)} are not in it")
    sys.stdout.flush()
    env = environment(workspace, main_root)
    try:
        code = run_to_the_end([sys.executable, "-m", "dmlbench.pipeline", *forwarded], workspace.root, env)
    except KeyboardInterrupt:
        code = 130  # the runner stopped its stages and recorded the finished ones; the summary still helps
    print(
        f"\npreset {preset.name!r} {'finished' if code == 0 else f'stopped (exit {code})'}.\n"
        f"Workspace: {workspace.root}\nReport:    {workspace.report}\nLogs:      {workspace.logs}/\n"
        f"MLflow:    experiment {preset.params.tracking.experiment!r} in {env['MLFLOW_TRACKING_URI']} (make ui)"
    )
    return code


INTERRUPTS = (signal.SIGTERM, signal.SIGHUP)  # handled like Ctrl-C while the runner runs


def run_to_the_end(argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> int:
    """Run the workspace's runner and wait for it, also when this process is interrupted: Ctrl-C,
    SIGTERM or SIGHUP here is passed on once, as SIGINT to the runner's process group (the runner,
    and under ``--jobs 1`` its ``dvc repro`` and the stage that runs: the local executor's stages
    have sessions of their own and get it from the runner), and the runner is left to stop its
    stages at their checkpoints, record the finished ones in dvc.lock and stop what it started (an
    MPS daemon); then the interrupt is re-raised. A second interrupt kills the runner.
    (``subprocess.run`` kills the child 0.25 s after an interrupt, before any of that.) The runner
    has a session of its own, so a terminal's Ctrl-C reaches it only through here, once; it starts
    with SIGINT handled even where this process ignores it (a background job of a script). Only
    the main thread can be interrupted (elsewhere it just waits)."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, *INTERRUPTS)} if main_thread else {}

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
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
            print("\ninterrupted: the run stops its stages at their checkpoints (again: kill it)", flush=True)
            try:
                os.killpg(process.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        try:
            process.wait()
        except KeyboardInterrupt:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # the runner and, under --jobs 1, dvc and its stage
            except ProcessLookupError:
                pass
            process.wait()
            print("killed: stages or an MPS daemon may be left running (ps -u $USER)", file=sys.stderr)
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
