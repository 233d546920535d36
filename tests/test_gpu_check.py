"""``make gpu-check`` on a machine without a GPU: it refuses in one line, and its pieces run on
the CPU (throughput and FLOP counting, the real-size run, the JUnit rows, the table)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from dmlbench.cost.rates import forward_flops_per_image

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402  (benchmarks/: a developer tool, not the library)
from throughput_probe import ThroughputSetting, measure_throughput  # noqa: E402


def test_gpu_check_refuses_in_one_line_without_a_gpu(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT / "src"))
    out = tmp_path / "gpu_check.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA GPU visible to torch"), result.stderr
    assert not out.exists() and result.stdout == ""


def test_gpu_check_names_missing_packages(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(gpu_check.REQUIRED, "no_such_module_xyz", "no-such-dist")
    reason = gpu_check.cannot_run()
    assert reason == "gpu-check: missing Python packages: no-such-dist (README, 'GPU check', says how to add them)"


def test_make_gpu_check_uses_the_python_that_is_there_not_the_venv():
    # as under `make test` or an activated venv: the venv's bin/ first on PATH
    env = dict(os.environ, PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}")
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "gpu-check", "GPU_PYTHON=python3"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )  # under `make test` this make is a sub-make: no "Entering directory" lines
    assert dry.returncode == 0, dry.stderr
    [command] = [line for line in dry.stdout.splitlines() if "benchmarks/gpu_check.py" in line]
    assert "python3 benchmarks/gpu_check.py" in command and f'PYTHONPATH="{ROOT}/src' in command
    # neither this checkout's venv python nor its bin/ on PATH (another project's venv may be there)
    assert str(ROOT / ".venv") not in command
    assert "pip install" not in dry.stdout


def test_protocol_settings_are_the_protocols_in_params_yaml():
    protocols = yaml.safe_load((ROOT / "params.yaml").read_text())["protocols"]
    for setting in gpu_check.protocol_settings():
        protocol = protocols[setting.name]
        batch = protocol["batch_size"]
        for override in protocol.get("overrides", []):
            if setting.backbone in override.get("backbones", []) and "datasets" not in override:
                batch = override["set"].get("batch_size", batch)
        assert setting.backbone in protocol["backbones"]
        assert (setting.crop, setting.batch, setting.per_class) == (
            protocol["augment"]["crop_size"],
            batch,
            protocol["samples_per_class"],
        )
        assert list(setting.crop_scale) == protocol["augment"]["crop_scale"]
        assert setting.image_size == protocol["augment"]["eval_resize"] and setting.frozen_bn == protocol["frozen_bn"]
        assert setting.grad_clip == protocol["grad_clip"]


def test_forward_flops_count_convolutions_and_products_exactly():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 5))
    expected = 2 * (3 * 9 * 4 * 8 * 8) + 2 * (4 * 8 * 8 * 5)  # multiply-adds x 2, one image
    assert forward_flops_per_image(model, 8, torch.device("cpu")) == expected


def test_throughput_runs_on_the_cpu():
    setting = ThroughputSetting("demo", "tiny_cnn", 32, 16, 4, 16, image_size=36)
    result = measure_throughput(setting, torch.device("cpu"), steps=2, warmup=1, images=64, classes=8, peak_flops=1e12)
    assert result.full_images_per_s > 0 and result.model_only_images_per_s > 0
    assert result.ratio == result.full_images_per_s / result.model_only_images_per_s
    assert result.mfu == pytest.approx(result.full_images_per_s * result.train_flops_per_image / 1e12)
    assert result.placement == "cpu memory" and result.peak_memory_mib is None
    with pytest.raises(ValueError, match="not a multiple of 4 images per class"):
        measure_throughput(ThroughputSetting("x", "tiny_cnn", 32, 18, 4, 16), torch.device("cpu"))


def test_real_size_run_goes_through_the_training_loop_on_the_cpu(tmp_path):
    from real_size import RealSizeSetting, real_size_run

    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    setting = RealSizeSetting(
        backbone="tiny_cnn", dim=16, image_size=40, crop=32, batch=16, per_class=4, epochs=2, iterations=3,
        classes=16, images_per_class=6, lr=1e-3,
    )  # fmt: skip
    result = real_size_run(base, tmp_path, torch.device("cpu"), setting)
    assert result.steps == 6 and len(result.epoch_losses) == 2
    assert all(v == v for v in result.epoch_losses)  # finite numbers, not NaN
    assert {"map_at_r", "precision_at_1"} <= set(result.final_val)
    assert result.as_dict()["loss_decreased"] == (result.epoch_losses[1] < result.epoch_losses[0])
    assert (tmp_path / "prepared").is_dir()  # the real prepare stage's cache, at 40 px
    from dmlbench.data.cache import PreparedDataset

    assert PreparedDataset.load(tmp_path / "prepared").images.shape[1:] == (40, 40, 3)


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_gpu" name="test_a" time="1.5"/>
<testcase classname="tests.test_gpu" name="test_b[x]" time="0.2">
<failure message="assert 1 == 2&#10;more">tb</failure></testcase>
<testcase classname="tests.test_gpu" name="test_faiss_gpu_equals_faiss_cpu" time="0.0">
<skipped message="faiss has no GPU here">s</skipped></testcase>
</testsuite></testsuites>"""


def _report(tests, ratio=0.9, total=0.9, decreased=True):
    setting = {"name": "thesis", "backbone": "resnet50", "crop": 224, "batch": 100}
    return {
        "environment": {"gpu": "G", "gpu_memory_gib": 80, "packages": {"torch": "2"}, "cuda": "13", "date": "d"},
        "tests": tests,
        "throughput": [
            {"setting": setting, "full_images_per_s": 900 * ratio, "model_only_images_per_s": 900, "ratio": ratio,
             "mfu": 0.31, "peak_memory_mib": 2048}
        ],  # fmt: skip
        "eval_speed": {"phases": [{"phase": "ranking metrics", "wall_s": 0.5}, {"phase": "total", "wall_s": total}]},
        "real_size": {"setting": setting, "steps": 300, "epoch_losses": [0.9, 0.5 if decreased else 1.0],
                      "train_seconds": 20, "peak_memory_mib": 9000, "loss_decreased": decreased},
    }  # fmt: skip


def test_junit_rows_verdicts_and_the_table(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text(JUNIT)
    rows = gpu_check.junit_rows(xml)
    assert [(r["name"], r["outcome"]) for r in rows] == [
        ("test_gpu::test_a", "passed"),
        ("test_gpu::test_b[x]", "failed"),
        ("test_gpu::test_faiss_gpu_equals_faiss_cpu", "skipped"),
    ]
    assert rows[1]["detail"] == "assert 1 == 2" and rows[2]["detail"] == "faiss has no GPU here"
    good = [r for r in rows if r["outcome"] != "failed"]
    assert gpu_check.verdicts(_report(good)) == dict.fromkeys(("tests", "throughput", "eval_speed", "real_size"), True)
    assert not gpu_check.verdicts(_report([{**r, "outcome": "skipped"} for r in good]))["tests"]  # nothing ran
    unknown_skip = [
        {"name": "test_gpu::test_a", "outcome": "passed"},
        {"name": "test_gpu::test_x", "outcome": "skipped"},
    ]
    assert not gpu_check.verdicts(_report(unknown_skip))["tests"]
    bad = gpu_check.verdicts(_report(rows, ratio=0.59, total=1.0, decreased=False))
    assert bad == dict.fromkeys(("tests", "throughput", "eval_speed", "real_size"), False)
    table = gpu_check.format_table(_report(rows, ratio=0.5))
    lines = table.splitlines()
    assert lines[0].startswith("gpu-check: G (80 GiB), torch 2, CUDA 13")
    assert any("test_gpu::test_b[x]" in line and "FAIL" in line for line in lines)
    assert any("train thesis resnet50 224 px b100" in line and "50%" in line and "FAIL" in line for line in lines)
    assert any("real-size run" in line and "loss 0.900 -> 0.500" in line and "| ok" in line for line in lines)


def test_gpu_test_files_are_found_by_their_marker():
    names = {p.name for p in gpu_check.gpu_test_files()}
    assert "test_gpu.py" in names and "test_gpu_check.py" not in names


def test_throughput_rows_eager_then_compiled_with_errors_and_the_budget(monkeypatch):
    from throughput_probe import Throughput

    settings = [ThroughputSetting("demo", "tiny_cnn", 32, 16, 4, 16, image_size=36), ThroughputSetting(
        "thesis", "tiny_cnn", 32, 20, 5, 16, image_size=36)]  # fmt: skip
    plan = gpu_check.throughput_plan(settings, ["reduce-overhead", "default"])
    assert [(s.name, mode) for s, mode in plan] == [
        ("demo", None),
        ("thesis", None),
        ("demo", "reduce-overhead"),
        ("thesis", "reduce-overhead"),
        ("demo", "default"),
        ("thesis", "default"),
    ]  # fmt: skip  (eager first, then mode by mode: a budget cuts the extra modes first)
    monkeypatch.setattr(gpu_check, "protocol_settings", lambda: settings)
    monkeypatch.setattr("throughput_probe.matmul_peak_flops", lambda device: 1e12)
    rates = {None: 100.0, "reduce-overhead": 300.0}

    def fake_measure(setting, device, steps, warmup, peak_flops, compile_mode):
        if compile_mode == "default":
            raise RuntimeError("inductor failed\nlong traceback")
        rate = rates[compile_mode]
        return Throughput(setting, "cpu", "cpu memory", rate, rate * 1.1, 1e9, peak_flops, 1024.0, compile_mode,
                          12.0 if compile_mode else 0.1, 2 if compile_mode else None)  # fmt: skip

    monkeypatch.setattr("throughput_probe.measure_throughput", fake_measure)
    rows = gpu_check.run_throughput(2, 1, ["reduce-overhead", "default"], device_name="cpu")
    assert [r.get("compile_mode") for r in rows] == [
        None,
        None,
        "reduce-overhead",
        "reduce-overhead",
        "default",
        "default",
    ]
    assert rows[2]["speedup"] == pytest.approx(3.0) and "speedup" not in rows[0]
    assert rows[4]["error"] == "RuntimeError: inductor failed"  # one line; the other rows went on
    table = [gpu_check.throughput_row(r) for r in rows]
    assert table[2] == (
        "train demo tiny_cnn 32 px b16, compiled reduce-overhead",
        "300 img/s full / 330 synthetic = 91%, MFU 30%, 1.0 GiB; x3.00 eager's full step, first step 12 s, 2 graph(s)",
        ">= 60%",
        "ok",
    )
    assert table[4][1:] == ("RuntimeError: inductor failed", ">= 60%", "FAIL")
    assert not gpu_check.verdicts({"throughput": rows})["throughput"]
    # a deadline already past: the eager rows are measured, every compiled row says it was skipped
    rows = gpu_check.run_throughput(2, 1, ["reduce-overhead"], deadline=0.0, device_name="cpu")
    assert [("skipped" in r, r["compile_mode"]) for r in rows] == [
        (False, None), (False, None), (True, "reduce-overhead"), (True, "reduce-overhead")
    ]  # fmt: skip
    assert rows[2]["skipped"] == "time budget (a compiled row takes ~90 s)"
    assert gpu_check.throughput_row(rows[2])[1:] == (
        "skipped: time budget (a compiled row takes ~90 s)",
        ">= 60%",
        "skip",
    )
    assert gpu_check.verdicts({"throughput": rows})["throughput"]  # skipped rows neither pass nor fail


def test_throughput_of_a_compiled_step_on_the_cpu(monkeypatch):
    # the real measurement with the model compiled (dynamo's aot_eager backend on the CPU): one
    # graph, made during the first step, and the same images/s bookkeeping as eager
    from dmlbench.train import compiling

    monkeypatch.setattr(compiling, "COMPILE_BACKEND", "aot_eager")
    setting = ThroughputSetting("demo", "tiny_cnn", 32, 16, 4, 16, image_size=36)
    result = measure_throughput(
        setting, torch.device("cpu"), steps=2, warmup=1, images=64, classes=8, compile_mode="default"
    )
    torch._dynamo.reset()
    assert result.compile_mode == "default" and result.compiled_graphs == 1 and result.graph_breaks == 0
    assert result.first_step_seconds > 0 and result.full_images_per_s > 0
    assert result.as_dict()["compile_mode"] == "default"
