"""Wall time of the validate stage's manifest writing, on the demo grid and on real-size grids.

Each grid is this checkout's ``dvc.yaml`` with ``params.yaml`` (the demo) or a fabricated grid of
:mod:`pipeline_scale` (``--grids 500,2000``, protocol ``reality_check``), in a fresh DVC repository.
Per grid it prints the number of manifests and, over ``--repeats`` fresh Python processes (the
median), the wall and CPU time of :func:`dmlbench.pipeline.manifests.write_manifests` with its imports, and
for the demo that of the whole ``python stages/validate.py`` (params checked, weights preflight,
manifests, marker).

    python benchmarks/validate_scale.py                    # demo, 500 and 2000 stages, 3 repeats
    python benchmarks/validate_scale.py --grids demo --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_scale import BACKBONES, DATASETS, GRIDS, LOSSES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WRITE = "from dmlbench.pipeline.manifests import write_manifests as w; print(w())"


def workspace(root: Path, grid: str) -> None:
    """A DVC repository at ``root`` with this checkout's pipeline over ``grid`` (demo: params.yaml)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for folder in ("src", "stages"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    if grid != "demo":
        datasets, backbones, losses, dims, seeds = GRIDS[grid]
        params["datasets"] = {name: dict(params["datasets"]["glyphs"]) for name in DATASETS[:datasets]}
        params["backbones"] = {name: {} for name in BACKBONES[:backbones]}
        params["losses"] = {name: {} for name in LOSSES[:losses]}
        params["dims"] = [64, 128, 256, 512][:dims]
        params["seeds"] = list(range(seeds))
        params["protocol"] = "reality_check"
        params["tuning"]["baselines"] = []
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=root, check=True)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], root: Path) -> tuple[float, float, str]:
    """Wall and CPU seconds of ``command`` in a fresh process, and its last line of output."""
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "DVC_NO_ANALYTICS": "1"}
    started, cpu = time.perf_counter(), _children_cpu()
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - started, _children_cpu() - cpu
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    return wall, cpu, result.stdout.strip().splitlines()[-1]


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grids", default="demo,500,2000", help="comma-separated, of demo, " + ", ".join(GRIDS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="validate-scale-"))
    rows = []
    for grid in args.grids.split(","):
        root = workdir / grid
        workspace(root, grid)
        runs = [timed([sys.executable, "-c", WRITE], root) for _ in range(args.repeats)]
        row = {"grid": grid, "manifests": int(runs[0][2]), "write_manifests_s": median([r[0] for r in runs]),
               "write_manifests_cpu_s": median([r[1] for r in runs])}  # fmt: skip
        if grid == "demo":
            full = [timed([sys.executable, "stages/validate.py"], root) for _ in range(args.repeats)]
            row.update(validate_s=median([r[0] for r in full]), validate_cpu_s=median([r[1] for r in full]))
        print(json.dumps(row), flush=True)
        rows.append(row)
    shutil.rmtree(workdir, ignore_errors=True)
    print("\n| grid | manifests | write_manifests: wall (CPU) | whole validate stage: wall (CPU) |")
    print("| --- | ---: | ---: | ---: |")
    for r in rows:
        whole = f"{r['validate_s']:.1f} s ({r['validate_cpu_s']:.1f} s)" if "validate_s" in r else ""
        print(
            f"| {r['grid']} | {r['manifests']:,} | {r['write_manifests_s']:.1f} s ({r['write_manifests_cpu_s']:.1f} s) "
            f"| {whole} |"
        )


if __name__ == "__main__":
    main()
