"""The device pre-flight: a grid that needs a GPU refuses in one line, before any stage, when torch
sees none, its build has no code for the GPU, or the driver is too old for the build; the
``--device cpu`` override runs it on the CPU knowingly; stages follow ``DMLBENCH_DEVICE``. The
device query is faked (no GPU here)."""

from __future__ import annotations

import copy
import subprocess

import pytest
import torch
import yaml

from dmlbench import devices
from dmlbench.devices import DEVICE_ENV, CudaFacts, DeviceError, Gpu, build_for, cuda_problem, default_device, runs_on
from dmlbench.errors import DmlbenchError
from dmlbench.params.load import parse_params
from dmlbench.pipeline import __main__ as pipeline
from dmlbench.pipeline.device_check import device_problem, export_device

CU130_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")  # torch 2.14.1+cu130's list
NO_CUDA = CudaFacts("2.14.1+cu130", "13.0", False, (), (), None)
V100_ON_CU130 = CudaFacts(
    "2.14.1+cu130", "13.0", True, CU130_ARCHS, (Gpu("Tesla V100-SXM2-32GB", (7, 0)),), "580.82.07"
)
H100_OK = CudaFacts("2.14.1+cu130", "13.0", True, CU130_ARCHS, (Gpu("NVIDIA H100 80GB HBM3", (9, 0)),), "580.95.05")
OLD_DRIVER = CudaFacts("2.14.1+cu130", "13.0", False, (), (Gpu("NVIDIA A100-SXM4-40GB", (8, 0)),), "550.54.15")


@pytest.fixture
def device_env(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)  # restored (removed) after the test
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_no_cuda_is_refused_naming_the_build_and_both_fixes(device_env):
    problem = cuda_problem(NO_CUDA)
    assert problem.startswith("torch 2.14.1+cu130 (CUDA 13.0 build) sees no CUDA GPU; ")
    assert "TORCH_BACKEND" in problem and "make repro DEVICE=cpu" in problem and "\n" not in problem


def test_a_capability_missing_from_the_builds_arch_list_names_gpu_build_and_knob():
    problem = cuda_problem(V100_ON_CU130)
    assert problem.startswith(
        "GPU 0 (Tesla V100-SXM2-32GB) has compute capability 7.0, which torch 2.14.1+cu130's CUDA 13.0 build has "
        "no code for (its arch list: sm_75, sm_80, sm_86, sm_90, sm_100, sm_120; driver 580.82.07); "
        "install the build that has it: make setup TORCH_BACKEND=cu126"
    )
    assert problem.endswith("make repro DEVICE=cpu (python -m dmlbench.pipeline --device cpu)")


def test_a_driver_older_than_the_build_needs_is_named_with_the_older_build():
    problem = cuda_problem(OLD_DRIVER)
    assert problem.startswith(
        "NVIDIA driver 550.54.15 is older than the 580 that torch 2.14.1+cu130's CUDA 13.0 build needs"
    )
    assert "make setup TORCH_BACKEND=cu126" in problem  # 550 >= 525.60.13: CUDA 12.x runs on it
    cu126_on_old = CudaFacts("2.14.1+cu126", "12.6", False, (), (), "470.256.02")
    assert "older than the 525.60.13" in cuda_problem(cu126_on_old)
    assert "TORCH_BACKEND=" not in cuda_problem(cu126_on_old).split("update the driver")[1]  # no build fits 470


def test_a_fitting_gpu_driver_and_build_pass_and_a_cpu_build_does_not():
    assert cuda_problem(H100_OK) is None
    assert cuda_problem(CudaFacts("2.14.1+cu126", "12.6", True, ("sm_70",), (Gpu("V100", (7, 0)),), "535.1")) is None
    cpu_build = cuda_problem(CudaFacts("2.14.1+cpu", None, False, (), (), None))
    assert cpu_build.startswith("torch 2.14.1+cpu is a CPU-only build (no CUDA); ")


@pytest.mark.parametrize(
    ("capability", "archs", "fits"),
    [
        ((8, 6), ("sm_80",), True),  # a cubin runs on the same major, equal or newer minor
        ((8, 0), ("sm_86",), False),  # never on an older minor
        ((9, 0), ("sm_80", "sm_86"), False),  # nor another major
        ((10, 0), ("sm_90", "compute_90"), True),  # PTX: JIT-compiled for newer GPUs
        ((7, 5), ("compute_80",), False),  # PTX never for older ones
        ((9, 0), ("sm_90a",), True),
        ((10, 0), ("sm_90a",), False),
        ((12, 1), CU130_ARCHS, True),
        ((7, 0), CU130_ARCHS, False),
        ((6, 1), devices.TORCH_BUILDS["cu126"], True),  # P40 / GTX 10xx on sm_60
    ],
)
def test_arch_rules(capability, archs, fits):
    assert runs_on(capability, archs) is fits


def test_the_suggested_build_per_gpu_generation():
    assert [build_for(c) for c in [(6, 0), (7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (12, 0)]] == [
        "cu126", "cu126", "cu126", "cu126", "cu126", "cu126", "cu130", "cu130",
    ]  # fmt: skip
    assert build_for((3, 7)) is None  # K80: no torch 2.14 build


def _params(default_raw_params, device: str):
    raw = copy.deepcopy(default_raw_params)
    raw["protocols"][raw["protocol"]]["device"] = device
    return raw


def test_device_problem_follows_protocol_gpus_and_override(default_raw_params, device_env, monkeypatch):
    monkeypatch.setattr(devices, "cuda_facts", lambda: NO_CUDA)
    gpu_grid = parse_params(_params(default_raw_params, "cuda"))
    assert device_problem(gpu_grid).startswith("protocol 'demo' needs a CUDA GPU (device: cuda), but torch 2.14.1")
    assert device_problem(gpu_grid, device="cpu") is None  # the CPU, knowingly: nothing checked
    demo = parse_params(_params(default_raw_params, "auto"))
    assert device_problem(demo) is None
    assert device_problem(demo, gpus=["0", "1"]).startswith("--gpus 0,1 asks for CUDA GPUs, but torch")
    assert device_problem(demo, device="cuda").startswith("--device cuda, but torch")
    monkeypatch.setattr(devices, "cuda_facts", lambda: H100_OK)
    assert device_problem(gpu_grid) is None and device_problem(demo, gpus=["0"]) is None


@pytest.fixture
def gpu_grid_file(default_raw_params, tmp_path, monkeypatch, device_env):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(_params(default_raw_params, "cuda"), sort_keys=False))
    monkeypatch.chdir(tmp_path)  # no data.dvc here: the drop-box is left alone
    return tmp_path / "params.yaml"


@pytest.mark.parametrize(
    ("facts", "message"),
    [
        (NO_CUDA, "sees no CUDA GPU"),
        (V100_ON_CU130, "compute capability 7.0, which torch 2.14.1+cu130's CUDA 13.0 build has no code for"),
        (OLD_DRIVER, "NVIDIA driver 550.54.15 is older than the 580"),
    ],
)
def test_the_runner_refuses_in_one_line_before_any_stage(gpu_grid_file, monkeypatch, capsys, facts, message):
    def no_dvc(*args, **kwargs):
        raise AssertionError("a DVC stage or plan started before the device pre-flight failed")

    monkeypatch.setattr(pipeline, "plan_after_validate", no_dvc)
    monkeypatch.setattr(pipeline.subprocess, "run", no_dvc)
    monkeypatch.setattr(pipeline, "run_to_the_end", no_dvc)
    monkeypatch.setattr(devices, "cuda_facts", lambda: facts)
    assert pipeline.main(["--params", str(gpu_grid_file)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: protocol 'demo' needs a CUDA GPU (device: cuda), but ") and message in line
    assert "DEVICE=cpu" in line


@pytest.mark.parametrize(("argv", "facts", "device"), [(["--device", "cpu"], NO_CUDA, "cpu"), ([], H100_OK, "cuda")])
def test_the_stages_get_the_runs_device(gpu_grid_file, monkeypatch, argv, facts, device):
    """--device cpu (make repro DEVICE=cpu) runs past the check; every stage sees DMLBENCH_DEVICE."""
    seen = []

    def dvc_repro(command, cwd, env):
        seen.append(env.get(DEVICE_ENV))
        return 1  # stop: no closing summary

    monkeypatch.setattr(pipeline, "run_to_the_end", dvc_repro)
    monkeypatch.setattr(devices, "cuda_facts", lambda: facts)
    assert pipeline.main(["--params", str(gpu_grid_file), "--jobs", "1", *argv]) == 1
    assert seen == [device]


def test_a_stage_under_device_cuda_refuses_instead_of_falling_back_to_the_cpu(device_env, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device() == torch.device("cpu")  # auto (unset): the CPU where there is no GPU
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    for facts in (NO_CUDA, V100_ON_CU130, OLD_DRIVER):  # no GPU seen, a GPU the build lacks, a driver too old
        monkeypatch.setattr(devices, "cuda_facts", lambda facts=facts: facts)
        with pytest.raises(DeviceError) as refused:
            default_device()
        assert isinstance(refused.value, DmlbenchError) and "\n" not in str(refused.value)  # a stage prints one line
        assert str(refused.value) == (
            "Slurm job 42 on node gpu07 needs a CUDA GPU (DMLBENCH_DEVICE=cuda: the protocol's device, or a Slurm job "
            f"that asked for a GPU) but {cuda_problem(facts)}"
        )
    assert default_device("cpu") == torch.device("cpu")  # a device named by the caller wins
    monkeypatch.setattr(devices, "cuda_facts", lambda: H100_OK)
    assert default_device() == torch.device("cuda")
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert default_device() == torch.device("cpu")  # the CPU knowingly, though a GPU is there
    monkeypatch.setenv(DEVICE_ENV, "gpu")
    with pytest.raises(DeviceError, match=r"DMLBENCH_DEVICE='gpu' is not a device; allowed: cuda, cpu, auto"):
        default_device()


def test_export_device_prefers_the_override(default_raw_params, device_env):
    import os

    params = parse_params(_params(default_raw_params, "cuda"))
    assert export_device(params) == "cuda" and os.environ[DEVICE_ENV] == "cuda"
    assert export_device(params, "cpu") == "cpu" and os.environ[DEVICE_ENV] == "cpu"
    assert export_device(params, "auto") == "auto" and DEVICE_ENV not in os.environ  # unset means auto
    assert export_device(params, local=False) == "cuda" and DEVICE_ENV not in os.environ  # Slurm: per job
    assert export_device(params, "cpu", local=False) == "cpu" and os.environ[DEVICE_ENV] == "cpu"


def test_nvidia_smi_is_read_when_present(monkeypatch):
    out = "580.95.05, NVIDIA H100 80GB HBM3, 9.0\n580.95.05, Tesla V100-SXM2-32GB, 7.0\n"
    monkeypatch.setattr(devices.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(devices.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, out, ""))
    assert devices.nvidia_smi() == (
        "580.95.05",
        (Gpu("NVIDIA H100 80GB HBM3", (9, 0)), Gpu("Tesla V100-SXM2-32GB", (7, 0))),
    )

    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(devices.subprocess, "run", missing)
    assert devices.nvidia_smi() == (None, ())
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    assert devices.nvidia_smi() == (None, ())  # not installed: not run


def test_the_real_query_runs_here():
    facts = devices.cuda_facts()  # on a CPU-only machine: no CUDA, and nothing else is asked
    assert facts.torch_version == torch.__version__ and facts.build == torch.version.cuda
    assert facts.available == torch.cuda.is_available()
    assert (cuda_problem(facts) is None) == (
        facts.available and all(runs_on(g.capability, facts.arch_list) for g in facts.gpus)
    )
