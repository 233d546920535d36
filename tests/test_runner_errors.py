"""Every user error of the runner (``python -m dmlbench.pipeline``) goes through one path: ``error:``
lines on stderr, status 2, no traceback, nothing run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dmlbench.params.cluster import ClusterConfig
from dmlbench.pipeline.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["--gpu-slots", "2"], "error: --gpu-slots 2: needs --gpus"),
        (["--gpus", "0", "--jobs", "3"], "error: --jobs 3 exceeds the 1 GPUs x 1 slots"),
        (["--jobs", "0"], "error: --jobs 0: must be a positive number"),
        (["--detach"], "error: --detach is for --executor slurm"),
    ],
)
def test_options_that_do_not_go_together_are_one_line_before_params_are_read(argv, start, tmp_path, monkeypatch,
                                                                             capsys):  # fmt: skip
    monkeypatch.chdir(tmp_path)  # no params.yaml here: refused before it is read
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(start) and "\n" not in err


def test_a_pydantic_error_escaping_a_check_is_one_line_naming_the_key(tmp_path, monkeypatch, capsys):
    import dmlbench.pipeline.__main__ as runner

    def bad_cluster(_path):
        return ClusterConfig.model_validate({"max_jobs": "many"})

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "load_complete", bad_cluster)
    assert main(["--plan"]) == 2
    said = "max_jobs: Input should be a valid integer, unable to parse string as an integer"
    assert capsys.readouterr().err == f"error: params.yaml: {said}\n"


def test_a_bad_params_value_from_the_command_line_is_one_line_without_a_traceback(tmp_path):
    params = (ROOT / "params.yaml").read_text()
    assert "\nprotocol: " in params
    (tmp_path / "params.yaml").write_text(params.replace("\nprotocol: ", "\nprotocol: no_such_protocol # ", 1))
    command = [sys.executable, "-m", "dmlbench.pipeline", "--plan", "--params", str(tmp_path / "params.yaml")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.strip().count("\n") == 0, done.stderr
    assert "no_such_protocol" in done.stderr
