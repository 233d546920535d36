"""A preset run in its own workspace (:mod:`dmlbench.pipeline.workspace`): the main checkout's
params.yaml and dvc.lock stay as they are."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from dmlbench.params.presets import Preset, params_text
from dmlbench.pipeline.interrupts import run_to_the_end
from dmlbench.pipeline.workspace import environment, prepare_workspace, uncommitted_code


def run_preset(preset: Preset, params_file: Path, forwarded: list[str], detach_on_hangup: bool = False) -> int:
    """Run the pipeline (``forwarded``: every runner option, ``--executor``, ``--jobs``, ``--gpus``,
    ``--fetch-only``) in the preset's own workspace. ``detach_on_hangup`` (a run on Slurm): SIGTERM and
    SIGHUP reach it as SIGTERM, which detaches it from its jobs, not as the Ctrl-C that cancels them."""
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
        code = run_to_the_end([sys.executable, "-m", "dmlbench.pipeline", *forwarded], workspace.root, env,
                              hangup_as=signal.SIGTERM if detach_on_hangup else signal.SIGINT)  # fmt: skip
    except KeyboardInterrupt:
        code = 130  # the runner stopped its stages and recorded the finished ones; the summary still helps
    print(
        f"\npreset {preset.name!r} {'finished' if code == 0 else f'stopped (exit {code})'}.\n"
        f"Workspace: {workspace.root}\nReport:    {workspace.report}\nLogs:      {workspace.logs}/\n"
        f"MLflow:    experiment {preset.params.tracking.experiment!r} in {env['MLFLOW_TRACKING_URI']} (make ui)"
    )
    return code
