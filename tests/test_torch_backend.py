"""The CUDA build knob (``make setup TORCH_BACKEND=...``, tools/setup_venv.py): the default installs
exactly as locked; ``cu126`` takes torch from the PyTorch index without the lock's CUDA 13 packages;
faiss-gpu (a CUDA 12 wheel) only next to a CUDA 12 torch. Commands are built, nothing installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup_venv():
    spec = importlib.util.spec_from_file_location("setup_venv_knob", ROOT / "tools" / "setup_venv.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("backend", ["", "cu130", "CU130"])
def test_the_default_backend_installs_exactly_as_locked(setup_venv, tmp_path, backend):
    plan = setup_venv.backend_plan(backend, "cpu,test", tmp_path)
    assert plan == setup_venv.Backend("", "cpu,test", "requirements.lock", (), (), None)
    command = setup_venv.uv_command("uv", "py", ".[cpu,test]", ["--index-strategy", "unsafe-best-match"], plan, False)
    assert command == [
        "uv", "pip", "install", "--python", "py", "--index-strategy", "unsafe-best-match",
        "-c", "requirements.lock", "-e", ".[cpu,test]",
    ]  # fmt: skip
    pip = setup_venv.pip_command("py", ".[cpu,test]", plan)
    assert pip[-4:] == ["-c", "requirements.lock", "-e", ".[cpu,test]"] and "--extra-index-url" not in pip


def test_cu126_comes_from_the_pytorch_index_with_faiss_gpu(setup_venv, tmp_path):
    plan = setup_venv.backend_plan("cu126", "gpu,test", tmp_path)
    assert plan.extras == "gpu,test" and plan.note is None  # faiss-gpu 1.15.1 is CUDA 12: it fits
    assert plan.constraints == str(tmp_path.resolve() / "requirements-cu126.lock")
    command = setup_venv.uv_command("uv", "py", ".[gpu,test]", [], plan, True)
    assert command[command.index("--torch-backend") + 1] == "cu126"
    assert command.count("--reinstall-package") == 2 and "torch" in command and "torchvision" in command
    pip = setup_venv.pip_command("py", ".[gpu,test]", plan)
    assert pip[pip.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cu126"


def test_the_lock_for_another_build_drops_only_the_cuda13_stack(setup_venv):
    lock = (ROOT / "requirements.lock").read_text()
    kept = setup_venv.filtered_lock(lock).splitlines()
    assert "torch==2.14.1" in kept and "torchvision==0.29.1" in kept and "triton==3.8.0" in kept
    assert not any(line.startswith(("nvidia-", "cuda-")) for line in kept)
    dropped = set(lock.splitlines()) - set(kept)
    assert dropped and all(line.startswith(("nvidia-", "cuda-")) for line in dropped)


@pytest.mark.parametrize(("backend", "build"), [("", "CUDA 13"), ("cpu", "CPU-only")])
def test_faiss_gpu_is_not_installed_next_to_another_cuda(setup_venv, tmp_path, backend, build):
    plan = setup_venv.backend_plan(backend, "gpu,test", tmp_path)
    assert plan.extras == "cpu,test"
    assert plan.note.startswith("extras: faiss-cpu instead of faiss-gpu (a CUDA 12 wheel; torch here is the " + build)


def test_a_build_torch_214_does_not_have_is_refused_in_one_line(setup_venv, tmp_path):
    with pytest.raises(SystemExit) as refused:
        setup_venv.backend_plan("cu128", "cpu,test", tmp_path)
    assert str(refused.value) == (
        "error: TORCH_BACKEND=cu128: torch 2.14.1 has no such build here; allowed: cu130 (the locked build (default)), "
        "cu126 (CUDA 12.6), cpu (CPU only)"
    )


def test_a_switch_of_build_reinstalls_torch(setup_venv, tmp_path):
    default, cu126 = (setup_venv.backend_plan(b, "cpu", tmp_path) for b in ("", "cu126"))
    assert not setup_venv.switching(tmp_path, default)  # a venv set up as now: nothing extra
    assert setup_venv.switching(tmp_path, cu126)
    (tmp_path / setup_venv.MARKER).write_text("cu126\n")
    assert not setup_venv.switching(tmp_path, cu126) and setup_venv.switching(tmp_path, default)


def _make(*args: str, venv: Path) -> str:
    env = dict(os.environ, MAKEFLAGS="")
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", *args, f"VENV={venv}"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_passes_the_knob_and_the_venv_remembers_it(tmp_path):
    assert "--torch-backend" not in _make("setup", venv=tmp_path)  # the default: the command as before
    assert f"touch {tmp_path}/.installed-cpu-test" in _make("setup", venv=tmp_path)
    out = _make("setup", "TORCH_BACKEND=cu126", "EXTRAS=gpu,test", venv=tmp_path)
    assert "--extras gpu,test --torch-backend cu126" in out and f"{tmp_path}/.installed-gpu-test-cu126" in out
    (tmp_path / ".torch-backend").write_text("cu126\n")  # as setup_venv.py leaves it
    assert "--torch-backend cu126" in _make("setup", venv=tmp_path)  # later make calls keep the build
    assert f"touch {tmp_path}/.installed-cpu-test\n" in _make("setup", "TORCH_BACKEND=cu130", venv=tmp_path)


def test_make_repro_device_cpu_is_the_runner_override(tmp_path):
    [line] = [line for line in _make("repro", "DEVICE=cpu", venv=tmp_path).splitlines() if "dmlbench.pipeline" in line]
    assert line.split()[-2:] == ["--device", "cpu"]
