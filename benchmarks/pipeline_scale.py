"""Orchestration overhead at real grid sizes: fabricated grids of ~50, ~500 and ~2,000 DVC stages.

Each grid is this checkout's ``dvc.yaml`` and ``params.yaml`` (protocol ``reality_check``, the
largest protocol section) with a grid of the given size, in a fresh git + DVC repository, every
stage's command replaced by placeholder work (one Python start writing the stage's outputs; the
validate stage also writes the real inputs manifests, :mod:`dmlbench.pipeline.manifests`). Per
grid it prints:

* after: the runner (``make_plan`` + :func:`dmlbench.pipeline.local.run_parallel`, ``--jobs``
  workers) from nothing to a recorded grid: wall, the runner's own CPU time, its peak RSS, the
  number of ``dvc.lock`` writes; the wall per stage (placeholder work included); ``dvc status`` on
  the finished grid; a re-run (plan + run: nothing to do) and whether it left ``dvc.lock``
  untouched;
* before (the old runner: one ``dvc --wait-for-lock repro --single-item`` per stage, each
  rewriting ``dvc.lock`` in full): the cost of one such call on an up-to-date stage and of one
  lock write by DVC (``dvc commit --force <stage>``) at this size, and the projected total
  ``stages x (call + write)`` (the old runner's overhead, serialised by DVC's lock whatever the
  number of workers).

    python benchmarks/pipeline_scale.py                        # the three sizes, 2 workers
    python benchmarks/pipeline_scale.py --grids 50 --jobs 4    # one size

Targets: at 2,074 stages, total overhead < 10 min on 2 cores, per-stage cost
within 2x of the 50-stage grid's, ``dvc status`` < 20 s, a re-run writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# datasets x backbones x losses x dims x seeds
GRIDS = {"50": (1, 1, 6, 2, 2), "500": (2, 2, 8, 4, 3), "2000": (4, 3, 10, 4, 3)}
DATASETS = ["cub200", "cars196", "sop", "inshop"]
BACKBONES = ["resnet50", "bn_inception", "googlenet"]
LOSSES = ["contrastive", "triplet", "multi_similarity", "proxy_anchor", "proxy_nca", "arcface", "cosface",
          "circle", "margin", "normalized_softmax"]  # fmt: skip
MANIFESTS = "artifacts/inputs"
WRITE_MANIFESTS = "PYTHONPATH=src python -c 'from dmlbench.pipeline.manifests import write_manifests as w; w()'"
PLACEHOLDER = """import os, sys
from pathlib import Path
for out in map(Path, sys.argv[1:]):
    if out.suffix:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text('{"value": 1}' if out.suffix == ".json" else "x\\n")
    else:
        out.mkdir(parents=True, exist_ok=True)
        (out / "part").write_text(os.environ.get("DVC_STAGE", "") + "\\n")
"""
RUNNER = """import json, resource, sys, time
sys.path.insert(0, {src!r})
from pathlib import Path
from dmlbench.pipeline.local import run_parallel
from dmlbench.pipeline.plan import make_plan
started = time.perf_counter()
plan = make_plan(Path("."))
planned = time.perf_counter()
failed = run_parallel(plan, {jobs}, [], progress=False) if plan.order else []
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"stages": len(plan.order), "plan_s": planned - started, "wall_s": time.perf_counter() - started,
                   "cpu_s": time.process_time(), "peak_rss_mb": peak, "failed": len(failed)}}))
"""


def dvc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    command = [sys.executable, "-m", "dvc", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def fabricate(root: Path, datasets: int, backbones: int, losses: int, dims: int, seeds: int) -> None:
    """A git + DVC repository at ``root``: this checkout's pipeline over the given grid, placeholder commands."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for folder in ("src", "stages"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    dataset = params["datasets"]["glyphs"]
    params["datasets"] = {name: dict(dataset) for name in DATASETS[:datasets]}
    params["backbones"] = {name: {} for name in BACKBONES[:backbones]}
    params["losses"] = {name: {} for name in LOSSES[:losses]}
    params["dims"] = [64, 128, 256, 512][:dims]
    params["seeds"] = list(range(seeds))
    params["protocol"] = "reality_check"
    params["tuning"]["baselines"] = []
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    pipeline = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    for name, stage in pipeline["stages"].items():
        body = stage.get("do", stage)
        declared = [o for key in ("outs", "metrics") for o in body.get(key) or []]
        outs = [o if isinstance(o, str) else next(iter(o)) for o in declared]
        body["cmd"] = "python placeholder.py " + " ".join(o for o in outs if o != MANIFESTS)
        if name == "validate":  # the real manifests: every other stage depends on its own
            body["cmd"] = WRITE_MANIFESTS + " && " + body["cmd"]
    pipeline.pop("plots", None)
    (root / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    (root / "placeholder.py").write_text(PLACEHOLDER)
    (root / ".gitignore").write_text("/artifacts\n/reports\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    dvc("init", "-q", cwd=root).check_returncode()
    shutil.copy(ROOT / ".dvc" / "config", root / ".dvc" / "config")
    commit = "git add -A && git -c user.name=bench -c user.email=bench@localhost commit -qm grid"
    subprocess.run(commit, shell=True, cwd=root, check=True)


def timed(function, *args, **kwargs) -> tuple[float, object]:
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return time.perf_counter() - started, result


def run_runner(root: Path, jobs: int) -> dict:
    code = RUNNER.format(src=str(ROOT / "src"), jobs=jobs)
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"runner failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(name: str, grid: tuple[int, ...], jobs: int, workdir: Path) -> dict:
    root = workdir / f"grid-{name}"
    fabricate(root, *grid)
    after = run_runner(root, jobs)
    lock = root / "dvc.lock"
    status_s, status = timed(dvc, "status", cwd=root)
    if "up to date" not in status.stdout:
        raise RuntimeError(f"dvc status after the run:\n{status.stdout[-2000:]}{status.stderr[-2000:]}")
    before_bytes, before_mtime = lock.read_bytes(), lock.stat().st_mtime_ns
    rerun = run_runner(root, jobs)
    untouched = lock.read_bytes() == before_bytes and lock.stat().st_mtime_ns == before_mtime
    stages = after["stages"]
    sample = next(s for s in yaml.safe_load(lock.read_text())["stages"] if s.startswith("train@"))
    single_s, _ = timed(dvc, "--wait-for-lock", "repro", "--single-item", sample, cwd=root)
    write_s, _ = timed(dvc, "commit", "--force", sample, cwd=root)
    return {
        "grid": name, "stages": stages, "jobs": jobs, "lock_mb": round(lock.stat().st_size / 2**20, 1),
        "after_wall_s": round(after["wall_s"], 1), "after_plan_s": round(after["plan_s"], 1),
        "after_cpu_s": round(after["cpu_s"], 1), "after_peak_rss_mb": round(after["peak_rss_mb"]),
        "after_per_stage_s": round(after["wall_s"] / stages, 3), "dvc_status_s": round(status_s, 1),
        "rerun_s": round(rerun["wall_s"], 1), "rerun_lock_untouched": untouched,
        "before_single_item_s": round(single_s, 2), "before_lock_write_s": round(write_s, 2),
        "before_projected_s": round(stages * (single_s + write_s)),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grids", default="50,500,2000", help=f"comma-separated, of {', '.join(GRIDS)}")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="where the grids go (kept; default: a temporary dir)")
    args = parser.parse_args()
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="pipeline-scale-"))
    rows = []
    for name in args.grids.split(","):
        row = measure(name, GRIDS[name], args.jobs, workdir)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\n| stages | after: wall (CPU) | per stage | dvc status | re-run, lock untouched | before: per stage "
          "(call + lock write) | before: projected |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        after = f"{r['after_wall_s']:.0f} s ({r['after_cpu_s']:.0f} s)"
        print(f"| {r['stages']:,} | {after} | {r['after_per_stage_s']:.2f} s "
              f"| {r['dvc_status_s']:.1f} s | {r['rerun_s']:.0f} s, {'yes' if r['rerun_lock_untouched'] else 'NO'} "
              f"| {r['before_single_item_s']:.1f} + {r['before_lock_write_s']:.1f} s "
              f"| {r['before_projected_s'] / 3600:.1f} h |")  # fmt: skip


if __name__ == "__main__":
    main()
