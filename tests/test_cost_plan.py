"""The price of a grid (src/dmlbench/cost): stage counts from DVC's own expansion of dvc.yaml, estimates
from a fabricated throughput table reproduced by hand, the wall-time schedule, the runner's ETA,
and one-line errors for plans the runner would refuse."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from dmlbench.cost.model import Eta, StageEstimate, makespan, wall_seconds
from dmlbench.cost.plan import RunnerEta, grid_estimates, run_shape
from dmlbench.cost.stages import expand_stages
from dmlbench.errors import ConfigError
from dmlbench.params.complete import complete_params
from dmlbench.params.load import parse_params
from dmlbench.params.presets import available, load_preset, params_text

ROOT = Path(__file__).resolve().parents[1]


def expected_counts(params) -> Counter:
    """Stages per kind, from the grid's lists (what dvc.yaml's matrices multiply)."""
    d, b, losses, dims, seeds = (len(params.datasets), len(params.backbones), len(params.losses),
                                 len(params.dims), len(params.seeds))  # fmt: skip
    baselines = len(dict(params.tuning).get("baselines", ["published"]))
    counts = Counter(validate=1, download=d, prepare=d, tune=d * b * losses, train=d * b * losses * dims * seeds,
                     evaluate=d * b * losses * dims, baseline=d * b * losses * baselines, embed_pretrained=d * b,
                     evaluate_pretrained=d * b, report=1)  # fmt: skip
    return +counts  # kinds with no stage dropped


def test_the_demo_stages_are_the_ones_dvc_lists():
    """params.yaml's grid: the expansion is DVC's own stage list, name for name."""
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    stages = expand_stages(ROOT)
    with Repo(str(ROOT)) as repo:
        listed = {s.addressing for s in repo.index.stages if isinstance(s, PipelineStage)}
    assert {s.name for s in stages} == listed
    params = complete_params(parse_params(yaml.safe_load((ROOT / "params.yaml").read_text())))
    assert Counter(s.kind for s in stages) == expected_counts(params)


@pytest.mark.parametrize("name", available(ROOT / "presets"))
def test_every_preset_counts_its_grid_exactly(name):
    preset = load_preset(name, ROOT / "params.yaml")
    stages = expand_stages(ROOT, params_text(preset))
    assert Counter(s.kind for s in stages) == expected_counts(preset.params)
    if name == "reality_check":
        assert len(stages) == 518  # 14 losses x 3 datasets x 10 seeds + search, evaluation, baselines


def fabricated_grid(tmp_path: Path):
    """A glyphs grid of known sizes: 40 classes x 10 images (train 200, test 200), 2 folds (100 / 100),
    4 epochs of 5 batches of 20 (one pass over 100 images), validation every 2 epochs with test feedback,
    losses contrastive + triplet, dim 32, seeds 0 and 1, 3 tuning trials, published baselines; and a
    throughput table measuring the demo protocol on tiny_cnn at 500 img/s and 300 MiB."""
    raw = copy.deepcopy(yaml.safe_load((ROOT / "params.yaml").read_text()))
    raw["datasets"]["glyphs"]["source"].update(num_classes=40, images_per_class=10)
    raw["datasets"]["glyphs"]["split"] = {"scheme": "rc_cv", "num_folds": 2}
    raw["losses"] = {"contrastive": {}, "triplet": {}}
    raw["dims"], raw["seeds"] = [32], [0, 1]
    demo = raw["protocols"]["demo"]
    demo.update(epochs=4, batch_size=20, iterations_per_epoch=None, test_feedback=True)
    demo["early_stopping"]["validate_every"] = 2
    raw["tuning"].update(trials=3, baselines=["published"])
    params = complete_params(parse_params(raw))
    table = tmp_path / "gpu_check.json"
    row = {"setting": {"name": "demo", "backbone": "tiny_cnn", "batch": 20}, "device": "Fabricated GPU",
           "full_images_per_s": 500.0, "peak_flops": 1e12, "peak_memory_mib": 300.0}  # fmt: skip
    table.write_text(json.dumps({"environment": {"date": "2026-01-01"}, "throughput": [row]}))
    return params, yaml.safe_dump(raw), table


def test_estimates_from_a_fabricated_throughput_table_match_the_hand_calculation(tmp_path):
    params, text, table = fabricated_grid(tmp_path)
    shape = run_shape(params, gpus=["0"], cpu_count=2, stages=1)
    estimates, notes = grid_estimates(ROOT, params, shape, text, table)
    by_kind: dict[str, list[StageEstimate]] = {}
    for e in estimates:
        by_kind.setdefault(e.kind, []).append(e)
    # one model: 4 epochs x 5 batches x 20 = 400 images at 500/s = 0.8 s; embedded: 2 validations x
    # (100 validation + 200 test) + the final 100 + 200 = 900 at 3 x 500/s = 0.6 s; 2 folds
    per_model = 400 / 500 + 900 / 1500
    train = 2 * per_model
    assert [e.seconds for e in by_kind["train"]] == pytest.approx([train] * 4)  # 2 losses x 2 seeds
    assert [e.seconds for e in by_kind["tune"]] == pytest.approx([3 * train] * 2)  # 3 trials each
    assert [e.seconds for e in by_kind["baseline"]] == pytest.approx([2 * train] * 2)  # every seed
    assert by_kind["embed_pretrained"][0].seconds == pytest.approx((200 + 100) / 1500)
    gpu_seconds = 4 * train + 2 * 3 * train + 2 * 2 * train + 300 / 1500
    assert sum(e.seconds for e in estimates if e.gpu) == pytest.approx(gpu_seconds)
    assert all(e.source == "measured" and e.gpu_bytes == 300 * 2**20 for e in by_kind["train"])
    # models: 2 folds x (parameters x 4 bytes + float32 32-d embeddings of 100 validation + 200 test images)
    parameters = (by_kind["train"][0].cache_bytes / 2 - 300 * 32 * 4) / 4
    assert parameters == int(parameters) > 0
    assert any("measured: 500 img/s on Fabricated GPU, 2026-01-01" in note for note in notes)
    assert not any(e.gpu for e in by_kind["evaluate"] + by_kind["prepare"])


def test_without_a_measured_row_the_rate_is_flop_based_and_says_so(tmp_path):
    from dmlbench.cost.rates import model_size

    params, text, table = fabricated_grid(tmp_path)
    report = json.loads(table.read_text())
    report["throughput"][0]["setting"]["name"] = "another_protocol"
    table.write_text(json.dumps(report))
    shape = run_shape(params, gpus=["0"], cpu_count=2, stages=1, efficiency=0.1)
    estimates, notes = grid_estimates(ROOT, params, shape, text, table)
    train = next(e for e in estimates if e.kind == "train")
    flops, _ = model_size("tiny_cnn", params.backbones["tiny_cnn"], 32, "gap", params.protocol.augment.crop_size)
    rate = 1e12 * 0.1 / flops  # the table's measured peak at the stated 10 %
    assert train.source == "flops" and train.gpu_bytes is None
    assert train.seconds == pytest.approx(2 * (400 / rate + 900 / (3 * rate)))
    assert any("FLOP-based" in note and "10%" in note for note in notes)


def test_a_strict_fp32_protocol_priced_from_an_autocast_row_is_marked_optimistic(tmp_path):
    from dmlbench.cost.rates import measured_rate, read_table

    _, _, table = fabricated_grid(tmp_path)
    (unrecorded,) = read_table(table)  # a row written before gpu_check recorded its precision
    rate = measured_rate([unrecorded], "demo", "tiny_cnn", 20, amp="fp32")
    assert rate is not None and rate.note.endswith("the protocol trains in strict fp32: optimistic")
    assert "optimistic" not in measured_rate([unrecorded], "demo", "tiny_cnn", 20, amp="auto").note
    report = json.loads(table.read_text())
    report["throughput"][0]["precision"] = "fp32"
    table.write_text(json.dumps(report))
    assert "optimistic" not in measured_rate(read_table(table), "demo", "tiny_cnn", 20, amp="fp32").note
    report["throughput"][0]["precision"] = "bf16"
    table.write_text(json.dumps(report))
    assert "measured in bf16" in measured_rate(read_table(table), "demo", "tiny_cnn", 20, amp="fp32").note


def test_the_schedule_is_longest_first_phase_after_phase():
    assert makespan([5, 4, 3, 3, 3], 2) == 10  # 5+3 | 4+3+3 (LPT), where 9 | 9 exists: within 4/3
    assert makespan([5, 4, 3, 3, 3], 5) == 5
    stages = [
        StageEstimate("t1", "train", 6, True, "measured"),
        StageEstimate("t2", "train", 4, True, "measured"),
        StageEstimate("p", "prepare", 3, False, "assumed"),
        StageEstimate("e", "evaluate", 1, False, "assumed"),
    ]
    assert wall_seconds(stages, 2) == 3 + 6 + 1  # prepare, then both trainings side by side, then evaluate


def test_the_eta_is_corrected_by_the_stages_done():
    estimates = {n: StageEstimate(n, "train", s, True, "measured") for n, s in [("a", 10), ("b", 10), ("c", 20)]}
    eta = Eta(estimates, workers=1)
    assert eta.seconds_left() == 40 and eta.correction == 1.0
    eta.done("a", 20.0)  # twice the estimate: what is left takes twice as long
    assert eta.correction == 2.0 and eta.seconds_left() == (10 + 20) * 2
    eta.done("b", None)  # skipped: out of what is left, no evidence on the rate
    assert eta.correction == 2.0 and eta.seconds_left() == 40
    assert eta.line() == "ETA 40 s (model x 2.00 after 2 stage(s))"
    mixed = Eta({"p": StageEstimate("p", "prepare", 10, False, "assumed"), **estimates}, workers=1)
    mixed.done("p", 40.0)  # a slow preparation: 4 x, applied to the trainings while none is done
    assert mixed.seconds_left() == 4 * 40
    mixed.done("a", 5.0)  # the first training: half its estimate, applied to the other trainings
    assert mixed.kind_correction("train") == 0.5 and mixed.seconds_left() == (10 + 20) / 2


def test_a_plan_the_runner_would_refuse_fails_in_one_line():
    preset = load_preset("reality_check", ROOT / "params.yaml")
    with pytest.raises(ConfigError, match=r"trains on cuda: give the GPUs to plan for .*DEVICE=cpu$"):
        run_shape(preset.params)
    with pytest.raises(ConfigError, match="GPU_SLOTS 2: needs GPUS"):
        run_shape(preset.params, gpu_slots=2, device="cpu")
    assert run_shape(preset.params, device="cpu", cpu_count=4).workers == 4


def test_make_plan_on_an_unknown_preset_is_one_line():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    result = subprocess.run([sys.executable, "-m", "dmlbench.pipeline", "--plan", "--preset", "nope"], cwd=ROOT,
                            capture_output=True, text=True, env=env, check=False)  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "preset 'nope' is unknown; available presets:" in result.stderr


def test_the_runner_shows_the_eta_after_each_stage(tmp_path):
    """The local runner calls the ETA hook at the start and once per stage with its measured seconds."""
    from dmlbench.pipeline.local import run_parallel
    from dmlbench.pipeline.plan import make_plan

    root = tmp_path / "repo"
    root.mkdir()
    pipeline = {"stages": {"a": {"cmd": "echo a > a.txt", "outs": ["a.txt"]},
                           "b": {"cmd": "cat a.txt > b.txt", "deps": ["a.txt"], "outs": ["b.txt"]}}}  # fmt: skip
    (root / "dvc.yaml").write_text(yaml.safe_dump(pipeline))
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(command, cwd=root, check=True, env=env)
    estimates = {n: StageEstimate(n, "train", 100.0, True, "measured") for n in ("a", "b")}
    calls: list[tuple[str | None, float | None]] = []
    eta = RunnerEta(Eta(estimates, workers=1))

    def note(stage: str | None, seconds: float | None) -> str:
        calls.append((stage, seconds))
        return eta(stage, seconds)

    assert run_parallel(make_plan(root), 1, [], root=root, progress=False, progress_note=note) == []
    assert [c[0] for c in calls] == [None, "a", "b"] and all(s is not None and s > 0 for _, s in calls[1:])
    assert eta.eta.seconds_left() == 0 and eta.eta.correction < 1  # two echo commands beat 100 s each
