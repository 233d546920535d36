"""Create ``.venv`` with the pinned dependencies (``make setup``; every make target runs it first).

Installs with uv (https://docs.astral.sh/uv/, pinned below): on a 2-core machine it installs the
~6.5 GB of torch's CUDA wheels and the rest in about 30 s, where pip takes about 2.5 minutes.
uv does not read pip's configuration, so the index, extra indexes, find-links, constraint
files, trusted hosts and certificate bundle that ``pip config list`` shows (files and ``PIP_*``
variables) are passed on to it. If uv cannot be installed or fails, pip does the job as before.

Then the modules a pipeline run imports are byte-compiled once, by importing them with byte-code
writing on: with ``PYTHONDONTWRITEBYTECODE`` set (as on some machines) every stage would
otherwise re-compile torch, mlflow and DVC in memory; compiling all of site-packages
(``compileall``) takes ~50 s on 2 cores, this ~15 s.

    python tools/setup_venv.py --venv .venv --extras cpu,test

The CUDA build of torch (``--torch-backend``, ``make setup TORCH_BACKEND=...``; docs/gpu.md
says which fits which GPU generation and driver): by default the locked build, PyPI's torch
2.14.1, CUDA 13.0 on Linux, installed exactly as locked. ``cu126`` installs the same torch and
torchvision versions from the PyTorch index for CUDA 12.6 (the only 2.14 build with Pascal and
Volta, sm_60/sm_70, and the one for drivers 525-579), without the lock's CUDA 13 packages;
``cpu`` the CPU-only build. One CUDA stack per environment: the ``gpu`` extra's faiss-gpu is a
CUDA 12 wheel, so it is installed with ``cu126`` only; with a CUDA 13 or CPU build, ``gpu`` gives
faiss-cpu, and torch's exact kNN on CUDA is the GPU neighbour search
(:func:`dmlbench.evaluate.knn.faiss_gpus`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

UV = "uv==0.13.9"
ROOT = Path(__file__).resolve().parents[1]
LOCK = "requirements.lock"
# --torch-backend: "" = the locked build (PyPI: CUDA 13.0 on Linux); the others come from the
# PyTorch index (https://download.pytorch.org/whl/<backend>), torch 2.14's builds (PyTorch's
# RELEASE.md support matrix, pytorch/pytorch#190355)
DEFAULT_BACKEND = "cu130"
BACKENDS = {"cu130": "the locked build (default)", "cu126": "CUDA 12.6", "cpu": "CPU only"}
TORCH_INDEX = "https://download.pytorch.org/whl/"
MARKER = ".torch-backend"  # in the venv: the backend it was set up with (absent: the default)
CUDA13_STACK = ("nvidia-", "cuda-")  # the lock's CUDA 13 packages, left out for another backend

# pip option -> uv option, for options taking values (lists are space separated in pip's config)
VALUE_OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
# third-party modules the stages import inside functions, in two groups compiled side by side
# (the second imports no torch); dmlbench's own modules are walked afterwards
WARM_MODULES = [
    [
        "torch._dynamo",
        "torchvision",
        "pytorch_metric_learning.losses",
        "pytorch_metric_learning.miners",
        "pytorch_metric_learning.samplers",
        "pytorch_metric_learning.utils.accuracy_calculator",
        "faiss",
        "scipy.io",
        "scipy.stats",
        "optuna.samplers",
    ],
    [
        "mlflow",
        "mlflow.store.tracking.sqlalchemy_store",
        "mlflow.system_metrics.system_metrics_monitor",
        "pandas",
        "matplotlib.pyplot",
        "seaborn",
        "dvc.cli",
        "dvc.repo",
        "dvc.repo.reproduce",
        "dvc.commands.repro",
        "dvc.commands.status",
        "dvc.commands.commit",
    ],
]
IMPORT_SCRIPT = """
import importlib, pkgutil, sys
names = sys.argv[1:]
if not names:
    import dmlbench
    names = [module.name for module in pkgutil.walk_packages(dmlbench.__path__, "dmlbench.")]
failed = []
for name in names:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed.append(f"{name} ({type(error).__name__})")
if failed:
    print("not pre-compiled (they compile when first imported):", ", ".join(failed))
"""


def pip_settings(python: str) -> dict[str, list[str]]:
    """pip's effective settings (``pip config list``): per option, the values of the scope that
    wins (environment over ``install`` over ``global`` sections)."""
    listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False).stdout
    rank = {":env:": 2, "install": 1, "global": 0}
    chosen: dict[str, tuple[int, list[str]]] = {}
    for line in listed.splitlines():
        key, sep, value = line.partition("=")
        if not sep or "." not in key:
            continue
        scope, option = key.rsplit(".", 1)
        if scope not in rank:
            continue
        values = value.strip().strip("'\"").split()
        if option not in chosen or rank[scope] >= chosen[option][0]:
            chosen[option] = (rank[scope], values)
    return {option: values for option, (_, values) in chosen.items()}


def uv_arguments(settings: dict[str, list[str]]) -> tuple[list[str], dict[str, str]]:
    """uv command-line options and environment equivalent to pip's ``settings``."""
    arguments = ["--index-strategy", "unsafe-best-match"]  # pip's rule: the best version over all indexes
    for option, flag in VALUE_OPTIONS.items():
        for value in settings.get(option, []):
            arguments += [flag, value]
    if settings.get("no-index", ["false"])[0].lower() in ("1", "true", "yes", "on"):
        arguments.append("--no-index")
    environment = {}
    if settings.get("cert"):
        environment["SSL_CERT_FILE"] = settings["cert"][0]
    return arguments, environment


def run_logged(command: list[str], log: Path, shown: tuple[str, ...], env: dict[str, str] | None = None) -> int:
    """Run ``command`` with its output in ``log``, printing the lines that start with ``shown``
    (and the last 25 lines when it fails); its exit status."""
    tail: list[str] = []
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in process.stdout:
            out.write(line)
            tail = (tail + [line])[-25:]
            if line.startswith(shown):
                print(line.rstrip(), flush=True)
    if process.wait() != 0:
        sys.stdout.writelines(tail)
    return process.returncode


class Backend(NamedTuple):
    """How one torch build is installed: the extras (``gpu`` only where faiss-gpu's CUDA 12 fits),
    the constraints file, and the options uv and pip take for it."""

    name: str  # "" for the locked build
    extras: str
    constraints: str
    uv_options: tuple[str, ...]
    pip_options: tuple[str, ...]
    note: str | None


def backend_plan(backend: str, extras: str, venv: Path) -> Backend:
    """The install of ``backend`` (``""``/``cu130``: exactly the locked install) with ``extras``;
    one line naming the allowed values when ``backend`` is not a torch 2.14 build."""
    backend = backend.strip().lower()
    if backend and backend not in BACKENDS:
        allowed = ", ".join(f"{name} ({what})" for name, what in BACKENDS.items())
        raise SystemExit(f"error: TORCH_BACKEND={backend}: torch 2.14.1 has no such build here; allowed: {allowed}")
    name = "" if backend == DEFAULT_BACKEND else backend
    parts = [part for part in extras.split(",") if part]
    note = None
    if "gpu" in parts and name != "cu126":
        build = "CPU-only" if name == "cpu" else "CUDA 13"
        parts = ["cpu" if part == "gpu" else part for part in parts]
        note = (
            f"extras: faiss-cpu instead of faiss-gpu (a CUDA 12 wheel; torch here is the {build} build, and one "
            "CUDA stack per environment): the GPU neighbour search is torch's exact kNN (docs/gpu.md)"
        )
    if not name:
        return Backend("", ",".join(parts), LOCK, (), (), note)
    index = TORCH_INDEX + name
    return Backend(
        name,
        ",".join(parts),
        str(venv.resolve() / f"requirements-{name}.lock"),
        ("--torch-backend", name),
        ("--extra-index-url", index),
        note,
    )


def filtered_lock(lock_text: str) -> str:
    """The lock without its CUDA 13 packages (``nvidia-*``, ``cuda-*``): another torch build brings
    its own."""
    return "".join(line for line in lock_text.splitlines(keepends=True) if not line.startswith(CUDA13_STACK))


def switching(venv: Path, backend: Backend) -> bool:
    """Whether the venv holds another torch build than ``backend`` (torch==2.14.1 is satisfied by
    any build of it, so a switch must reinstall torch and torchvision)."""
    marker = venv / MARKER
    return (marker.read_text().strip() if marker.exists() else "") != backend.name


def uv_command(
    uv: str, python: str, requirement: str, arguments: list[str], backend: Backend, switch: bool
) -> list[str]:
    """``uv pip install`` of ``requirement`` with pip's settings, the backend's constraints and options."""
    reinstall = ["--reinstall-package", "torch", "--reinstall-package", "torchvision"] if switch else []
    return [
        uv, "pip", "install", "--python", python, *arguments, *backend.uv_options, *reinstall,
        "-c", backend.constraints, "-e", requirement,
    ]  # fmt: skip


def pip_command(python: str, requirement: str, backend: Backend) -> list[str]:
    command = [python, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", "--no-compile"]
    return command + [*backend.pip_options, "-c", backend.constraints, "-e", requirement]


def install_with_uv(python: str, requirement: str, log: Path, backend: Backend, switch: bool) -> bool:
    """True when uv installed everything; False (with the reason printed) to fall back to pip."""
    quiet = [python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", UV]
    if subprocess.run(quiet, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False).returncode != 0:
        print(f"could not install {UV}; installing with pip instead (a few minutes)")
        return False
    arguments, environment = uv_arguments(pip_settings(python))
    uv = str(Path(python).with_name("uv"))
    command = uv_command(uv, python, requirement, arguments, backend, switch)
    shown = ("Resolved", "Prepared", "Installed", "Uninstalled")
    if (status := run_logged(command, log, shown, env={**os.environ, **environment})) != 0:
        print(f"uv failed (exit {status}; log: {log}); installing with pip instead (a few minutes)")
        return False
    return True


def install_with_pip(python: str, requirement: str, log: Path, backend: Backend, switch: bool) -> None:
    if switch:  # pip keeps an installed torch 2.14.1 of another build
        subprocess.run([python, "-m", "pip", "uninstall", "--yes", "--quiet", "torch", "torchvision"], check=False)
    command = pip_command(python, requirement, backend)
    if (status := run_logged(command, log, ("Collecting", "Successfully"))) != 0:
        raise SystemExit(f"error: pip install failed (exit {status}); full log: {log}")


def compile_used_modules(python: str) -> None:
    """Import ``WARM_MODULES`` (two processes at once), then every dmlbench module, with byte-code
    writing on."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    environment.update(MLFLOW_DISABLE_TELEMETRY="true", MPLBACKEND="Agg")
    groups = [
        subprocess.Popen([python, "-c", IMPORT_SCRIPT, *group], cwd=ROOT, env=environment) for group in WARM_MODULES
    ]
    for process in groups:
        process.wait()
    subprocess.run([python, "-c", IMPORT_SCRIPT], cwd=ROOT, env=environment, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path(".venv"))
    parser.add_argument("--extras", default="cpu,test", help="extras of pyproject.toml (cpu | gpu, test)")
    parser.add_argument("--pip", action="store_true", help="install with pip only (no uv)")
    parser.add_argument("--torch-backend", default="", help=f"torch's CUDA build: {', '.join(BACKENDS)} (docs/gpu.md)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    backend = backend_plan(args.torch_backend, args.extras, args.venv)  # a bad value: one line, nothing made
    python = str(args.venv.resolve() / "bin" / "python")
    if not Path(python).exists():
        subprocess.run([sys.executable, "-m", "venv", str(args.venv)], check=True)
    if backend.note:
        print(backend.note)
    if backend.name:
        Path(backend.constraints).write_text(filtered_lock((ROOT / LOCK).read_text()))
        print(f"torch {backend.name} build from {TORCH_INDEX}{backend.name} (the lock's CUDA 13 packages left out)")
    switch = switching(args.venv, backend)
    requirement = f".[{backend.extras}]"
    log = args.venv / "install.log"
    if args.pip or not install_with_uv(python, requirement, log, backend, switch):
        install_with_pip(python, requirement, log, backend, switch)
    marker = args.venv / MARKER
    if backend.name:
        marker.write_text(backend.name + "\n")
    else:
        marker.unlink(missing_ok=True)
    print("byte-compiling the modules a run imports ...", flush=True)
    compile_used_modules(python)
    print(f"{args.venv} ready in {time.monotonic() - start:.0f} s (log: {log})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
