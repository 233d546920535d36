"""The repository, a throwaway git + DVC copy of its pipeline, and a reduced params.yaml."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def run_checked(args: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    """Run a command; with ``check``, fail the test with the tail of its output when it fails."""
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def dvc_project(root: Path, raw_params: dict, mlflow_db: Path) -> dict[str, str]:
    """A committed git + DVC copy of the repository's pipeline at ``root`` with ``raw_params`` as
    params.yaml; returns the environment to run ``dvc``/``dmlbench.pipeline`` in it (own MLflow store)."""
    root.mkdir(parents=True)
    for name in ("dvc.yaml", ".dvcignore", "data.dvc", "weights.lock"):
        shutil.copy(ROOT / name, root / name)
    for name in ("stages", "src"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (root / "params.yaml").write_text(yaml.safe_dump(raw_params, sort_keys=False))
    env = dict(os.environ)
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        MLFLOW_TRACKING_URI=f"sqlite:///{mlflow_db}",
        DVC_NO_ANALYTICS="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
    )
    env.pop("DVC_ROOT", None)
    run_checked(["git", "init", "-q"], root, env)
    run_checked([sys.executable, "-m", "dvc", "init", "-q"], root, env)
    shutil.copytree(ROOT / ".dvc" / "plots", root / ".dvc" / "plots")  # the by_loss template of `dvc plots`
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-q", "-m", "test project"], root, env)
    return env


def small_params_dict(base: dict, **overrides) -> dict:
    """A reduced copy of params.yaml: 40 glyph classes x 16 images (fixed_val, 10 validation
    classes), 2 epochs of batch 16, the published hyperparameters."""
    raw = copy.deepcopy(base)
    raw["datasets"]["glyphs"]["source"].update(num_classes=40, images_per_class=16)
    raw["datasets"]["glyphs"]["split"] = {"scheme": "fixed_val", "val_fraction": 0.25, "seed": 0}
    # published values unless a test tunes (tuned: 2 trials per loss, the first one random)
    raw["protocols"][raw["protocol"]].update(epochs=2, batch_size=16, samples_per_class=4, hyperparameters="published")
    raw["tuning"].update(trials=2, startup_trials=1, baselines=[])
    for key, value in overrides.items():
        raw[key] = value
    return raw
