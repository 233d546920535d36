"""Publish a grid to a DVC remote and pull it elsewhere: ``make publish REMOTE=...`` and ``make pull``.

Thin over DVC: ``push`` names the remote (one of ``.dvc/config``, or a folder or URL, then added
as the default remote ``published`` so that a clone finds it) and runs ``dvc push`` on the
pipeline's stages; ``pull`` runs ``dvc pull --allow-missing``. Every stage's DVC outputs travel
but the prepared caches of datasets whose terms forbid it
(:attr:`~dmlbench.data.base.DatasetSpec.redistributable`); never ``data.dvc``'s archives, the
scratch extractions, checkpoints or run logs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

from dmlbench.data import DATASETS
from dmlbench.pipeline.manifests import resolved_stages

DEFAULT_NAME = "published"
DROPBOX_FILE = "data.dvc"  # the archives' drop-box


def _dvc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dvc", *args], check=True, text=True, stdout=subprocess.PIPE)


def remote_name(remote: str, root: Path = Path(".")) -> str:
    """``remote`` if it names a configured DVC remote; else it is a folder or URL, configured here
    as the default remote :data:`DEFAULT_NAME` (a local folder by its absolute path)."""
    configured = {line.split()[0] for line in _dvc("remote", "list").stdout.splitlines() if line.strip()}
    if remote in configured:
        return remote
    url = remote if "://" in remote else str((root / remote).resolve())
    _dvc("remote", "add", "--default", "--force", DEFAULT_NAME, url)
    return DEFAULT_NAME


def publish_targets(root: Path = Path(".")) -> tuple[list[str], list[str]]:
    """The stages whose outputs ``push`` uploads, and those it leaves out (a prepared cache of a
    dataset whose terms do not allow redistribution); ``data.dvc`` only while it tracks no archive
    (the demo's empty drop-box, so that a pulled clone's ``dvc status`` is clean)."""
    pushed: list[str] = []
    withheld: list[str] = []
    dropbox = root / DROPBOX_FILE
    if dropbox.is_file():
        outs = (yaml.safe_load(dropbox.read_text()) or {}).get("outs") or []
        (pushed if all(not out.get("nfiles") for out in outs) else withheld).append(DROPBOX_FILE)
    for name in resolved_stages(root):
        group, _, dataset = name.partition("@")
        spec = DATASETS.get(dataset) if group == "prepare" else None
        (withheld if spec is not None and not spec.redistributable else pushed).append(name)
    return pushed, withheld


def push(remote: str) -> None:
    """``dvc push`` the grid's outputs to ``remote`` (see the module docstring)."""
    name = remote_name(remote)
    pushed, withheld = publish_targets()
    for stage in withheld:
        what = "the dataset archives in data/" if stage == DROPBOX_FILE else "its prepared cache"
        print(f"{stage}: {what} stay here (the datasets' terms: docs/datasets.md)")
    subprocess.run([sys.executable, "-m", "dvc", "push", "-r", name, *pushed], check=True)
    print(f"published to the DVC remote {name!r}; commit dvc.lock and .dvc/config (git add dvc.lock .dvc/config)")


def pull(remote: str | None) -> None:
    """``dvc pull`` the published outputs (from ``remote``, else the default remote); outputs the
    remote does not hold (a withheld prepared cache) are left for their stages to re-create."""
    chosen = ["-r", remote_name(remote)] if remote else []
    subprocess.run([sys.executable, "-m", "dvc", "pull", "--allow-missing", *chosen], check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dmlbench.pipeline.publish", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["push", "pull"])
    parser.add_argument("remote", nargs="?", help="a configured DVC remote's name, or a folder or URL")
    args = parser.parse_args(argv)
    if args.action == "push":
        if not args.remote:
            parser.error(
                "push needs REMOTE: a configured DVC remote's name, a folder or a URL (make publish REMOTE=...)"
            )
        push(args.remote)
    else:
        pull(args.remote)


if __name__ == "__main__":
    main()
