"""CUDA MPS for the local executor (``--mps``): the daemon's lifecycle against a stand-in for
``nvidia-cuda-mps-control`` that records how it was called (the real one was run by hand on an
H100: docs/gpu.md), and the one-line refusals."""

from __future__ import annotations

import os
import shutil
import stat
import textwrap
from pathlib import Path

import pytest

from dmlbench.errors import DmlbenchError
from dmlbench.pipeline import mps
from dmlbench.pipeline.__main__ import main
from dmlbench.pipeline.mps import LOG_VARIABLE, MPS_CONTROL, PIPE_VARIABLE, mps_daemon

# What the real control program does, reduced to what the runner relies on: `-d` starts a daemon
# whose pipe appears in $CUDA_MPS_PIPE_DIRECTORY (exit 0), commands come on stdin (`quit` stops it).
FAKE = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import os, sys, time
    from pathlib import Path
    calls = Path(os.environ["FAKE_MPS_CALLS"])
    pipe, log = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "-"), os.environ.get("CUDA_MPS_LOG_DIRECTORY", "-")
    if sys.argv[1:] == ["-d"]:
        if os.environ.get("FAKE_MPS_FAIL"):
            print("An instance of this daemon is already running", file=sys.stderr)
            sys.exit(1)
        Path(pipe, "control").write_text("")
        with calls.open("a") as out:
            out.write(f"start {pipe} {log} gpus={os.environ.get('CUDA_VISIBLE_DEVICES', 'all')}\\n")
        if os.environ.get("FAKE_MPS_HANG"):
            time.sleep(30)
    else:
        command = sys.stdin.read().strip()
        with calls.open("a") as out:
            out.write(f"{command} {pipe} alive={Path(pipe, 'control').exists()}\\n")
        sys.exit(int(os.environ.get("FAKE_MPS_QUIT_EXIT", "0")))
    """
)


@pytest.fixture
def fake_control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / MPS_CONTROL
    program.write_text(FAKE)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_CALLS", str(calls))
    return calls


def test_the_daemon_runs_for_the_block_with_a_pipe_of_its_own_and_quits(fake_control, tmp_path, monkeypatch):
    log_dir = tmp_path / "artifacts/logs/mps"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # the daemon must not renumber the workers' GPUs
    with mps_daemon(log_dir) as variables:
        pipe = Path(variables[PIPE_VARIABLE])
        assert (pipe / "control").exists() and variables[LOG_VARIABLE] == str(log_dir.resolve())
        assert pipe != Path("/tmp/nvidia-mps")  # not the default one other users' processes find
        assert fake_control.read_text().splitlines() == [f"start {pipe} {log_dir.resolve()} gpus=all"]
    assert fake_control.read_text().splitlines()[1] == f"quit {pipe} alive=True"
    assert not pipe.exists() and log_dir.is_dir()


def test_the_daemon_quits_when_the_run_fails_or_is_interrupted(fake_control, tmp_path):
    for failure in (RuntimeError("a stage failed"), KeyboardInterrupt()):
        with pytest.raises(type(failure)), mps_daemon(tmp_path / "logs") as variables:
            raise failure
        assert fake_control.read_text().splitlines()[-1] == f"quit {variables[PIPE_VARIABLE]} alive=True"
    assert [line.split()[0] for line in fake_control.read_text().splitlines()] == ["start", "quit"] * 2


def test_a_daemon_that_does_not_quit_keeps_its_pipe_and_says_how_to_stop_it(
    fake_control, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("FAKE_MPS_QUIT_EXIT", "1")
    with mps_daemon(tmp_path / "logs") as variables:
        pipe = Path(variables[PIPE_VARIABLE])
    assert (pipe / "control").exists()  # still reachable: nothing removed under a live daemon
    warning = capsys.readouterr().err.strip()
    assert warning == (
        f"warning: the MPS daemon did not quit (exit 1); stop it with: echo quit | {PIPE_VARIABLE}={pipe} "
        f"{MPS_CONTROL} (its logs: {(tmp_path / 'logs').resolve()}/)"
    )
    shutil.rmtree(pipe)


def test_a_daemon_that_cannot_start_is_one_line_and_leaves_nothing(fake_control, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    before = set(Path("/tmp").glob("dmlbench-mps-*"))
    with pytest.raises(DmlbenchError) as raised, mps_daemon(tmp_path / "logs"):
        pytest.fail("the block must not run")
    message = str(raised.value)
    assert "\n" not in message and "exit 1: An instance of this daemon is already running" in message
    assert set(Path("/tmp").glob("dmlbench-mps-*")) == before and not fake_control.exists()


def test_no_control_program_is_one_line(tmp_path):
    with pytest.raises(DmlbenchError, match=f"--mps: {MPS_CONTROL} is not on PATH"):
        with mps_daemon(tmp_path / "logs", environ={"PATH": str(tmp_path)}):
            pytest.fail("the block must not run")


@pytest.mark.parametrize(
    "argv",
    [
        ["--mps"],
        ["--mps", "--gpus", "0"],
        ["--mps", "--gpu-slots", "4"],
        ["--mps", "--gpus", "0", "--gpu-slots", "4", "--jobs", "1"],
        ["--mps", "--gpus", "0", "--gpu-slots", "4", "--executor", "slurm"],
    ],
)
def test_mps_without_shared_gpus_is_refused_before_anything_runs(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no params.yaml here: the refusal comes before it is read
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert (
        error.startswith("error: --mps runs the trainings --gpu-slots puts on each GPU side by side")
        and "\n" not in error
    )


def test_mps_without_the_control_program_is_refused_before_anything_runs(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["--mps", "--gpus", "0", "--gpu-slots", "4"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --mps: {MPS_CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities); "
        "run without --mps (the GPU's trainings then take turns on it)"
    )


def test_a_start_that_does_not_answer_is_one_line_and_the_daemon_it_left_is_stopped(
    fake_control, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_MPS_HANG", "1")  # `-d` got as far as its pipe, then hung
    # the limit must pass after the stand-in made its pipe (its Python starting is not what is
    # tested): a loaded machine that did not start it in time gets a longer limit, up to 8 s
    for seconds in (0.5, 2.0, 8.0):
        fake_control.unlink(missing_ok=True)
        monkeypatch.setattr(mps, "START_SECONDS", seconds)
        with pytest.raises(DmlbenchError) as raised:
            with mps_daemon(tmp_path / "logs"):
                pytest.fail("the block must not run")
        calls = fake_control.read_text().splitlines() if fake_control.exists() else []
        if any(line.startswith("start ") for line in calls):
            break
    else:
        pytest.fail("the stand-in never got as far as its pipe within 8 s")
    assert str(raised.value).startswith(f"--mps: '{MPS_CONTROL} -d' failed (no answer in {seconds:g} s)")
    start, stop = calls
    pipe = start.split()[1]
    assert stop == f"quit {pipe} alive=True" and not Path(pipe).exists()
