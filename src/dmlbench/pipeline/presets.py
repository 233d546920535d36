"""A preset run in its own workspace (:mod:`dmlbench.pipeline.workspace`): the main checkout's
params.yaml and dvc.lock stay as they are."""

from __future__ import annotations

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
    code = run_to_the_end([sys.executable, "-m", "dmlbench.pipeline", *forwarded], workspace.root, env)
    print(
        f"\npreset {preset.name!r} {'finished' if code == 0 else f'stopped (exit {code})'}.\n"
        f"Workspace: {workspace.root}\nReport:    {workspace.report}\nLogs:      {workspace.logs}/\n"
        f"MLflow:    experiment {preset.params.tracking.experiment!r} in {env['MLFLOW_TRACKING_URI']} (make ui)"
    )
    return code


def run_to_the_end(argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> int:
    """Run the workspace's runner and wait for it, also when this process is interrupted: Ctrl-C or
    SIGTERM here is passed on to it once, as SIGINT, and it is left to stop its stages at their
    checkpoints, record the finished ones in dvc.lock and stop what it started (an MPS daemon), then
    the interrupt is re-raised; a second Ctrl-C kills it. (``subprocess.run`` kills the child
    0.25 s after an interrupt, before any of that.) The runner has a session of its own, so a
    terminal's Ctrl-C reaches it only through here, once."""
    process = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), start_new_session=True)
    previous = signal.getsignal(signal.SIGTERM)
    main_thread = threading.current_thread() is threading.main_thread()

    def terminate(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    if main_thread:
        signal.signal(signal.SIGTERM, terminate)
    try:
        return process.wait()
    except KeyboardInterrupt:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait()
        except KeyboardInterrupt:
            process.kill()
            process.wait()
        raise
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
