"""One file name per stage (src/dmlbench/pipeline/guard.py: stage_filename) for its local log, its
Slurm job spec, its Slurm log and its note: a name from a ``dvc.yaml`` in a subfolder, a matrix stage
and a matrix value with a colon or a space all map to the same safe name everywhere."""

from __future__ import annotations

from pathlib import Path

from dmlbench.params.cluster import ClusterConfig
from dmlbench.pipeline import guard
from dmlbench.pipeline.job import spec_path
from dmlbench.pipeline.local import log_path
from dmlbench.pipeline.slurm_submission import Submission

NAMES = {
    "prepare": "prepare",
    "train@cub-resnet50-arcface-512-0": "train@cub-resnet50-arcface-512-0",
    "sub/dvc.yaml:train@a": "sub_dvc.yaml_train@a",
    "tune@cub 1.5/x": "tune@cub_1.5_x",
}


def test_every_per_stage_file_uses_one_safe_name(tmp_path: Path):
    submission = Submission([], {}, ClusterConfig.model_validate({}), tmp_path, tmp_path / "logs")
    for stage, safe in NAMES.items():
        assert guard.stage_filename(stage) == safe
        assert log_path(stage).name == f"{safe}.log"
        assert spec_path(stage, tmp_path).name == f"{safe}.json"
        assert submission._log(stage).name == f"{safe}.log"
        assert guard.note_path(stage, tmp_path).name == f"{safe}.json"
        assert "/" not in guard.stage_filename(stage, ".log")
