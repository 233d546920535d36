"""``make gpu-check`` / ``python3 benchmarks/gpu_check.py``: the GPU path, checked and measured.

Run from the repository root on a machine with a CUDA GPU (any torch/CUDA build; no venv
needed). In a few minutes it prints one table,
also written to ``reports/gpu_check.json``:

1. the CUDA tests (``pytest -m gpu``: every test file that carries the ``gpu`` marker);
2. training throughput at the protocols' settings (:func:`protocol_settings`): the full step
   vs the same model on synthetic on-device input (target: >= 60 %), and the model FLOP
   utilisation (``benchmarks/throughput_probe.py``); each setting eager and with the model
   compiled as ``compile: on`` does (:mod:`dmlbench.train.compiling`), in the same process, and
   the speed-up; ``--compile-modes`` adds other ``torch.compile`` modes after those rows, and
   ``--budget-s`` skips compiled rows that would no longer fit (each says so);
3. ``benchmarks/eval_speed.py --device cuda`` at SOP size (target: every metric, intervals
   included, in < 1 s);
4. a short real-size run through the real training loop (``benchmarks/real_size.py``): the
   loss must go down; its peak GPU memory.

Exit status: 0 when every check meets its target, 1 when one does not, 2 when it cannot run (no
CUDA GPU, a missing package, not in a checkout), with one line saying why.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import importlib.util
import json
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing
REPORT = Path("reports") / "gpu_check.json"
RATIO_TARGET = 0.6  # full step / synthetic-input step
EVAL_TARGET_S = 1.0  # SOP-size evaluation, every metric and the intervals
AFTER_THROUGHPUT_S = {"eval_speed": 30.0, "real_size": 60.0}  # what the sections after the throughput rows take
FIRST_COMPILE_S = 90.0  # the time a compiled row needs before one has been measured
SKIPPABLE = {"test_gpu::test_faiss_gpu_equals_faiss_cpu"}  # skips where faiss-gpu is not installed

# import name -> distribution to install (the packages the checks import besides torch)
REQUIRED = {
    "numpy": "numpy",
    "scipy": "scipy",
    "sklearn": "scikit-learn",
    "pandas": "pandas",
    "yaml": "pyyaml",
    "pydantic": "pydantic",
    "pytorch_metric_learning": "pytorch-metric-learning",
    "torchvision": "torchvision",
    "timm": "timm",
    "PIL": "pillow",
    "tqdm": "tqdm",
    "filelock": "filelock",
    "pytest": "pytest",
}
OPTIONAL = {"faiss": "faiss-gpu (or faiss-cpu: then the torch kNN and k-means are the GPU path)"}


def protocol_settings():
    """The protocols' training settings (params.yaml ``reality_check`` and ``thesis``)."""
    from throughput_probe import ThroughputSetting

    return (
        ThroughputSetting("reality_check", "bn_inception", 227, 32, 4, 128, crop_scale=(0.16, 1.0)),
        ThroughputSetting("thesis", "resnet50", 224, 100, 5, 512, grad_clip=10.0),
        ThroughputSetting("thesis", "bn_inception", 224, 180, 5, 512, grad_clip=10.0),
        ThroughputSetting("thesis", "googlenet", 224, 180, 5, 512, grad_clip=10.0),
    )


def cannot_run() -> str | None:
    """Why the check cannot run here (one line), or None."""
    try:
        import torch
    except ImportError:
        return "gpu-check: torch is not installed in this Python (" + sys.executable + ")"
    if not torch.cuda.is_available():
        build = torch.version.cuda or "none (CPU-only build)"
        return (
            f"gpu-check: no CUDA GPU visible to torch {torch.__version__} (CUDA build: {build}); "
            "run it on a machine with an NVIDIA GPU and a CUDA build of torch"
        )
    missing = [dist for module, dist in REQUIRED.items() if importlib.util.find_spec(module) is None]
    if missing:
        return f"gpu-check: missing Python packages: {', '.join(missing)} (README, 'GPU check', says how to add them)"
    if not (ROOT / "tests").is_dir() or not (ROOT / "benchmarks" / "eval_speed.py").exists():
        return f"gpu-check: run it from a dmlbench checkout (no tests/ or benchmarks/ under {ROOT})"
    return None


def environment() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    versions = {}
    for dist in ("torch", "torchvision", "timm", "pytorch-metric-learning", "numpy", "faiss-gpu", "faiss-cpu"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": props.name,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "gpus": torch.cuda.device_count(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "packages": versions,
    }


def gpu_test_files(root: Path = ROOT) -> list[Path]:
    """Test files that carry the ``gpu`` marker."""
    return sorted(p for p in (root / "tests").glob("test_*.py") if "mark.gpu" in p.read_text())


def run_gpu_tests(root: Path, workdir: Path) -> list[dict[str, Any]]:
    """``pytest -m gpu`` over :func:`gpu_test_files`; one row per test (name, outcome, seconds)."""
    xml = workdir / "gpu_tests.xml"
    files = [str(p.relative_to(root)) for p in gpu_test_files(root)]
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
    result = subprocess.run(command + files, cwd=root, capture_output=True, text=True, check=False)
    if not xml.exists():
        tail = (result.stdout + result.stderr).strip().splitlines()[-5:]
        return [{"name": "pytest -m gpu", "outcome": "error", "seconds": 0.0, "detail": " / ".join(tail)}]
    return junit_rows(xml)


def junit_rows(xml: Path) -> list[dict[str, Any]]:
    """One row per ``testcase`` of a JUnit XML file: passed, failed, error or skipped (+ why)."""
    rows = []
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                detail = (found.get("message") or "").splitlines()[0][:160] if found.get("message") else ""
                break
        module = case.get("classname", "").rsplit(".", 1)[-1]
        rows.append(
            {"name": f"{module}::{case.get('name')}", "outcome": outcome, "seconds": float(case.get("time", 0))}
            | ({"detail": detail} if detail else {})
        )
    return rows


def throughput_plan(settings: list[Any], modes: list[str]) -> list[tuple[Any, str | None]]:
    """``(setting, compile mode)`` rows in the order measured: every setting eager, then compiled
    in each of ``modes`` (the first: what ``compile: on`` uses), mode by mode, so that a time
    budget cuts the extra modes first."""
    return [(setting, mode) for mode in (None, *modes) for setting in settings]


def run_throughput(
    steps: int, warmup: int, modes: list[str], deadline: float | None = None, device_name: str = "cuda"
) -> list[dict[str, Any]]:
    """Throughput rows of :func:`throughput_plan`; a row that fails carries its ``error`` (one
    line) and the others go on; a compiled row that would end past ``deadline`` (a
    ``time.monotonic()`` value) is ``skipped``."""
    import dataclasses

    import torch
    from throughput_probe import matmul_peak_flops, measure_throughput

    device = torch.device(device_name)
    peak = matmul_peak_flops(device)
    rows: list[dict[str, Any]] = []
    compiled_seconds: list[float] = []  # wall time of each compiled row measured so far
    for setting, mode in throughput_plan(list(protocol_settings()), modes):
        head = {"setting": dataclasses.asdict(setting), "compile_mode": mode}
        needed = 1.2 * max(compiled_seconds) if compiled_seconds else FIRST_COMPILE_S
        if mode is not None and deadline is not None and time.monotonic() + needed > deadline:
            rows.append({**head, "skipped": f"time budget (a compiled row takes ~{needed:.0f} s)"})
            continue
        started = time.monotonic()
        try:
            result = measure_throughput(
                setting, device, steps=steps, warmup=warmup, peak_flops=peak, compile_mode=mode
            ).as_dict()
        except Exception as exc:  # noqa: BLE001 - one row's failure (a compiler error) is its result
            rows.append({**head, "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"})
        else:
            eager = next((r for r in rows if r["setting"] == head["setting"] and r["compile_mode"] is None), None)
            if mode is not None and eager is not None and "full_images_per_s" in eager:
                result["speedup"] = result["full_images_per_s"] / eager["full_images_per_s"]
            rows.append(result)
        if mode is not None and "error" not in rows[-1]:
            compiled_seconds.append(time.monotonic() - started)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def run_eval_speed(root: Path, workdir: Path) -> dict[str, Any]:
    out = workdir / "eval_speed.json"
    command = [sys.executable, str(root / "benchmarks" / "eval_speed.py"), "--device", "cuda", "--json", str(out)]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not out.exists():
        return {"error": " / ".join((result.stdout + result.stderr).strip().splitlines()[-3:])}
    return json.loads(out.read_text())


def run_real_size(root: Path, workdir: Path) -> dict[str, Any]:
    import torch
    import yaml
    from real_size import RealSizeSetting, real_size_run

    base = yaml.safe_load((root / "params.yaml").read_text())
    return real_size_run(base, workdir / "real_size", torch.device("cuda"), RealSizeSetting()).as_dict()


def verdicts(report: dict[str, Any]) -> dict[str, bool]:
    """Which checks met their targets."""
    tests = report.get("tests", [])
    phases = {p["phase"]: p for p in report.get("eval_speed", {}).get("phases", [])}
    return {
        "tests": any(t["outcome"] == "passed" for t in tests)
        and all(t["outcome"] == "passed" or (t["outcome"] == "skipped" and t["name"] in SKIPPABLE) for t in tests),
        "throughput": bool(report.get("throughput"))
        and all("skipped" in r or r.get("ratio", 0.0) >= RATIO_TARGET for r in report["throughput"]),
        "eval_speed": "total" in phases and phases["total"]["wall_s"] < EVAL_TARGET_S,
        "real_size": bool(report.get("real_size", {}).get("loss_decreased")),
    }


def format_table(report: dict[str, Any]) -> str:
    """The one table: ``check | result | target | ok``."""
    env, ok = report["environment"], verdicts(report)
    rows: list[tuple[str, str, str, str]] = []
    mark = {True: "ok", False: "FAIL"}
    for test in report.get("tests", []):
        status = {"passed": "ok", "skipped": "skip"}.get(test["outcome"], "FAIL")
        result = f"{test['outcome']} in {test['seconds']:.1f} s" + (
            f" ({test['detail']})" if test.get("detail") else ""
        )
        rows.append((f"test {test['name']}", result, "passes", status))
    for r in report.get("throughput", []):
        rows.append(throughput_row(r))
    speed = report.get("eval_speed", {})
    for phase in speed.get("phases", []):
        target = f"< {EVAL_TARGET_S:.0f} s" if phase["phase"] == "total" else ""
        status = mark[ok["eval_speed"]] if phase["phase"] == "total" else ""
        rows.append((f"eval SOP size: {phase['phase']}", f"{phase['wall_s']:.2f} s", target, status))
    if "error" in speed:
        rows.append(("eval SOP size", speed["error"], f"< {EVAL_TARGET_S:.0f} s", "FAIL"))
    real = report.get("real_size")
    if real:
        s = real["setting"]
        losses = real["epoch_losses"]
        result = (
            f"{real['steps']} steps, {s['backbone']} {s['crop']} px b{s['batch']}: loss {losses[0]:.3f} -> "
            f"{losses[-1]:.3f}, {real['train_seconds']:.0f} s, peak {real['peak_memory_mib'] / 1024:.1f} GiB"
        )
        rows.append(("real-size run", result, "loss goes down", mark[real["loss_decreased"]]))
    widths = [max(len(r[i]) for r in rows + [("check", "result", "target", "ok")]) for i in range(4)]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    torch_version = env["packages"].get("torch")
    header = (
        f"gpu-check: {env['gpu']} ({env['gpu_memory_gib']} GiB), torch {torch_version}, CUDA {env['cuda']}, "
        f"{env['date']}"
    )
    table = [line(("check", "result", "target", "ok")), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join([header, *table, *map(line, rows)])


def throughput_row(r: dict[str, Any]) -> tuple[str, str, str, str]:
    """One throughput row of the table: eager or compiled (its speed-up over eager, its first step)."""
    s = r["setting"]
    mode = r.get("compile_mode")
    name = f"train {s['name']} {s['backbone']} {s['crop']} px b{s['batch']}" + (f", compiled {mode}" if mode else "")
    target = f">= {RATIO_TARGET:.0%}"
    if "skipped" in r:
        return name, f"skipped: {r['skipped']}", target, "skip"
    if "error" in r:
        return name, r["error"], target, "FAIL"
    mfu = f", MFU {r['mfu']:.0%}" if r.get("mfu") is not None else ""
    memory = f", {r['peak_memory_mib'] / 1024:.1f} GiB" if r.get("peak_memory_mib") is not None else ""
    result = (
        f"{r['full_images_per_s']:.0f} img/s full / {r['model_only_images_per_s']:.0f} synthetic "
        f"= {r['ratio']:.0%}{mfu}{memory}"
    )
    if mode:
        speedup = f"x{r['speedup']:.2f} eager's full step, " if r.get("speedup") else ""
        result += f"; {speedup}first step {r['first_step_seconds']:.0f} s, {r.get('compiled_graphs')} graph(s)"
        if r.get("graph_breaks"):
            result += f", {r['graph_breaks']} graph break(s)"
        if r.get("cudagraph_skips"):
            result += f", ran without CUDA graphs {r['cudagraph_skips']} time(s)"
    return name, result, target, {True: "ok", False: "FAIL"}[r["ratio"] >= RATIO_TARGET]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPORT, help=f"JSON report (default {REPORT})")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per throughput setting")
    parser.add_argument("--skip", nargs="*", default=[], choices=["tests", "throughput", "eval_speed", "real_size"])
    parser.add_argument(
        "--compile-modes", nargs="*", default=None, metavar="MODE",
        help="torch.compile modes measured after eager (default: the one compile: on uses on CUDA; none: eager only)",
    )  # fmt: skip
    parser.add_argument(
        "--budget-s", type=float, default=None,
        help="wall-clock budget of the whole check: compiled throughput rows that would not fit are skipped",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_all = time.monotonic()
    later = sum(seconds for key, seconds in AFTER_THROUGHPUT_S.items() if key not in args.skip)
    deadline = None if args.budget_s is None else started_all + args.budget_s - later
    reason = cannot_run()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from dmlbench.io import write_json
    from dmlbench.train.compiling import CUDA_MODE

    modes = [CUDA_MODE] if args.compile_modes is None else args.compile_modes
    report: dict[str, Any] = {"environment": environment()}
    steps = [
        ("tests", "CUDA tests (pytest -m gpu)", lambda w: run_gpu_tests(ROOT, w)),
        (
            "throughput",
            "training throughput at the protocols' settings, eager and compiled",
            lambda w: run_throughput(args.steps, 5, modes, deadline),
        ),
        ("eval_speed", "SOP-size evaluation (benchmarks/eval_speed.py)", lambda w: run_eval_speed(ROOT, w)),
        ("real_size", "real-size training run", lambda w: run_real_size(ROOT, w)),
    ]
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for key, title, run in steps:
            if key in args.skip:
                continue
            started = time.perf_counter()
            print(f"gpu-check: {title} ...", file=sys.stderr, flush=True)
            report[key] = run(Path(tmp))
            print(f"gpu-check: {title}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
            write_json(args.out, report)  # what is done so far, should a later part not finish
    ok = {k: v for k, v in verdicts(report).items() if k not in args.skip}
    report["targets_met"] = ok
    write_json(args.out, report)
    print(format_table(report))
    print(
        f"written: {args.out}; "
        + (
            "every check met its target"
            if all(ok.values())
            else "FAILED: " + ", ".join(k for k, v in ok.items() if not v)
        )
    )
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
