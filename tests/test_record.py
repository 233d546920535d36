"""Batched recording in DVC (src/dmlbench/pipeline/record.py, local.py): the lock DVC would write,
in fewer writes, consistent after a kill; stale entries pruned; per-GPU slots."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from dmlbench.pipeline.local import run_parallel, worker_gpus
from dmlbench.pipeline.lockfile import prune_lock, splice_lock
from dmlbench.pipeline.plan import make_plan
from dmlbench.pipeline.record import RecordError, StageBook, run_job_spec

ROOT = Path(__file__).resolve().parents[1]
DVC = [sys.executable, "-m", "dvc"]

# A tiny pipeline: prep -> two trains (a matrix) -> report; placeholder commands that write what
# they were run with. slow@ waits for a file to exist (or forever), so a test can kill the run then.
PIPELINE = {
    "stages": {
        "prep": {"cmd": "python work.py prep out/prep.txt", "deps": ["work.py", "input.txt"],
                 "params": ["size"], "outs": ["out/prep.txt"]},
        "train": {"matrix": {"seed": "${seeds}"}, "cmd": "python work.py train-${item.seed} out/train-${item.seed}",
                  "deps": ["work.py", "out/prep.txt"], "params": ["size"], "outs": ["out/train-${item.seed}"]},
        "report": {"cmd": "python work.py report out/report.txt",
                   "deps": ["work.py", "out/train-0", "out/train-1"], "outs": ["out/report.txt"]},
    }
}  # fmt: skip
WORK = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    name, out = sys.argv[1], Path(sys.argv[2])
    Path("started").mkdir(exist_ok=True)
    Path("started", name).write_text(str(os.getpid()))
    if name == "train-1" and Path("slow").exists():
        while not Path("release").exists():
            time.sleep(0.05)
    if name == "prep" and Path("touch_dep").exists():
        Path("input.txt").write_text("changed while running\\n")
    text = f"{name} {os.environ.get('CUDA_VISIBLE_DEVICES', '-')} {os.environ.get('DMLBENCH_GPU_SHARE', '-')}"
    text += f" {os.environ['CUDA_MPS_PIPE_DIRECTORY']}\\n" if "CUDA_MPS_PIPE_DIRECTORY" in os.environ else "\\n"
    if out.suffix:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    else:
        out.mkdir(parents=True, exist_ok=True)
        (out / "part").write_text(text)
    time.sleep(float(os.environ.get("WORK_SECONDS", "0")))
    Path("started", name).unlink()
    """
)


def env() -> dict[str, str]:
    return dict(os.environ, DVC_NO_ANALYTICS="1")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump(PIPELINE, sort_keys=False))
    (root / "params.yaml").write_text("size: 3\nseeds: [0, 1]\n")
    (root / "work.py").write_text(WORK)
    (root / "input.txt").write_text("input\n")
    (root / ".gitignore").write_text("/out\n/started\n/artifacts\n")
    for command in (["git", "init", "-q"], [*DVC, "init", "-q"]):
        subprocess.run(command, cwd=root, check=True, env=env())
    return root


def dvc_status(root: Path) -> str:
    result = subprocess.run([*DVC, "status"], cwd=root, capture_output=True, text=True, env=env(), check=True)
    return result.stdout


def lock_entries(root: Path) -> dict:
    path = root / "dvc.lock"
    return (yaml.safe_load(path.read_text()) or {}).get("stages", {}) if path.exists() else {}


def test_splice_equals_dvcs_own_rewrite_of_the_committed_lock():
    """Replacing and adding entries by splicing gives byte for byte what DVC's full rewrite gives."""
    from dvc.utils.serialize import dumps_yaml, parse_yaml

    text = (ROOT / "dvc.lock").read_text()
    data = parse_yaml(text, "dvc.lock")
    names = list(data["stages"])
    changed = {name: {**data["stages"][name], "cmd": f"python changed.py {i}"} for i, name in enumerate(names[::7])}
    changed["train@new-stage: quoted"] = {"cmd": "python x.py", "outs": [{"path": "a b", "md5": "0" * 32}]}
    expected = dumps_yaml({**data, "stages": {**data["stages"], **changed}})
    assert splice_lock(text, changed) == expected
    assert splice_lock(text, {}) == text
    assert splice_lock("", changed) == dumps_yaml({"schema": "2.0", "stages": changed})


def test_splice_writes_no_anchor_twice_when_entries_share_values(tmp_path):
    """Values DVC loaded once from params.yaml (here a YAML anchor) sit in several entries: the
    spliced lock must still parse (no duplicate ``&id001``) and hold every value."""
    from dvc.utils.serialize import parse_yaml

    shared = {"lr": 0.1, "steps": [1, 2]}
    entries = {f"train@{i}": {"cmd": "x", "params": {"params.yaml": {"a": shared, "b": shared}}} for i in range(3)}
    text = splice_lock(splice_lock("", {"train@0": entries["train@0"]}), entries)
    assert "&" not in text
    assert parse_yaml(text, "dvc.lock")["stages"] == entries


def test_a_lock_not_in_dvcs_layout_gets_dvcs_full_rewrite():
    """A key quoted differently from how DVC would write it now, or another section after
    ``stages``: no duplicate key, nothing dropped; the result is DVC's own rewrite."""
    from dvc.utils.serialize import parse_yaml

    quoted = "schema: '2.0'\nstages:\n  'a@x':\n    cmd: old\n  b:\n    cmd: keep\n"
    spliced = parse_yaml(splice_lock(quoted, {"a@x": {"cmd": "new"}}), "dvc.lock")
    assert spliced["stages"] == {"a@x": {"cmd": "new"}, "b": {"cmd": "keep"}}
    trailing = "schema: '2.0'\nstages:\n  a:\n    cmd: old\ndatasets:\n- name: d\n  url: x\n"
    spliced = parse_yaml(splice_lock(trailing, {"a": {"cmd": "new"}}), "dvc.lock")
    assert spliced == {"schema": "2.0", "stages": {"a": {"cmd": "new"}}, "datasets": [{"name": "d", "url": "x"}]}


def test_prune_drops_only_the_stages_not_in_the_pipeline(tmp_path):
    from dvc.utils.serialize import dumps_yaml, parse_yaml

    lock = tmp_path / "dvc.lock"
    lock.write_text((ROOT / "dvc.lock").read_text())
    data = parse_yaml(lock.read_text(), "dvc.lock")
    keep = [name for name in data["stages"] if not name.startswith("evaluate@")]
    removed = prune_lock(lock, keep + ["not-in-the-lock"])
    assert removed and all(name.startswith("evaluate@") for name in removed)
    assert lock.read_text() == dumps_yaml({**data, "stages": {k: data["stages"][k] for k in keep}})
    assert prune_lock(lock, keep) == []


def test_batched_run_records_what_dvc_repro_would_in_one_write(repo):
    """Every stage run and recorded; one lock write for all (a long interval); DVC then finds
    everything up to date, and a re-run does nothing and writes nothing."""
    plan = make_plan(repo)
    assert set(plan.order) == {"prep", "train@0", "train@1", "report"}
    assert run_parallel(plan, 2, [], root=repo, record_every=3600, progress=False) == []
    assert set(lock_entries(repo)) == {"prep", "train@0", "train@1", "report"}
    assert "up to date" in dvc_status(repo)
    before = (repo / "dvc.lock").read_bytes(), (repo / "dvc.lock").stat().st_mtime_ns
    assert make_plan(repo).order == []
    result = subprocess.run([*DVC, "repro"], cwd=repo, capture_output=True, text=True, env=env(), check=True)
    assert "Running stage" not in result.stdout
    assert ((repo / "dvc.lock").read_bytes(), (repo / "dvc.lock").stat().st_mtime_ns) == before
    # the same entries DVC writes itself: force DVC to re-record them and compare
    subprocess.run([*DVC, "commit", "--force", "prep"], cwd=repo, env=env(), check=True, capture_output=True)
    assert (repo / "dvc.lock").read_bytes() == before[0]


def test_book_writes_once_per_flush_and_skips_unchanged_downstream(repo):
    run_parallel(make_plan(repo), 2, [], root=repo, record_every=3600, progress=False)
    (repo / "params.yaml").write_text("size: 4\nseeds: [0, 1]\n")  # prep and train re-run; outputs the same
    plan = make_plan(repo)
    assert set(plan.stale) == {"prep", "train@0", "train@1"} and "report" in plan.order
    for name in ("started",):
        (repo / name).mkdir(exist_ok=True)
    mtime = (repo / "out/report.txt").stat().st_mtime_ns
    assert run_parallel(plan, 1, [], root=repo, record_every=3600, progress=False) == []
    assert (repo / "out/report.txt").stat().st_mtime_ns == mtime  # report skipped: its inputs came out the same
    assert "up to date" in dvc_status(repo)
    with StageBook(repo) as book:
        assert not any(book.is_changed(name) for name in book.stages)
        assert book.flush() == 0 and book.writes == 0


def test_a_killed_run_leaves_finished_stages_recorded_and_the_unfinished_stale(repo):
    """SIGTERM while train@1 runs: prep and train@0 recorded, train@1 and report not (stale), the
    lock parses; the next run runs only those two."""
    (repo / "slow").write_text("")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT / "src")!r})
        from pathlib import Path
        from dmlbench.pipeline.local import run_parallel
        from dmlbench.pipeline.plan import make_plan
        try:
            run_parallel(make_plan(Path(".")), 2, [], record_every=3600, progress=False)
        except KeyboardInterrupt:
            sys.exit(130)
        """
    )
    runner = subprocess.Popen([sys.executable, "-c", code], cwd=repo, env=env())
    deadline = time.time() + 120
    while not ((repo / "started/train-1").exists() and (repo / "out/train-0/part").exists()):
        assert runner.poll() is None and time.time() < deadline, "the run ended or stalled before train@1 started"
        time.sleep(0.05)
    time.sleep(0.5)  # train@0's recording
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(60) == 130
    entries = lock_entries(repo)
    assert set(entries) == {"prep", "train@0"}  # finished: recorded (flushed on the way out)
    status = dvc_status(repo)
    assert "train@1" in status and "report" in status and "prep:" not in status and "train@0:" not in status
    (repo / "slow").unlink()
    plan = make_plan(repo)
    assert set(plan.order) == {"train@1", "report"}
    assert run_parallel(plan, 2, [], root=repo, progress=False) == []
    assert "up to date" in dvc_status(repo)


def test_a_dependency_changed_during_the_run_is_not_recorded(repo):
    (repo / "touch_dep").write_text("")
    plan = make_plan(repo)
    failed = run_parallel(plan, 1, [], root=repo, record_every=3600, progress=False)
    assert failed == ["prep"]  # its input.txt changed while it ran: not recorded, nothing after it started
    assert lock_entries(repo) == {} and not (repo / "out/train-0").exists()
    assert "prep:" in dvc_status(repo)


def test_job_spec_runs_without_dvc_and_is_recorded_by_the_book(repo):
    """The Slurm path: a job runs the stage from its spec (outputs removed first); the executor
    records it afterwards."""
    run_parallel(make_plan(repo), 1, [], root=repo, progress=False)
    (repo / "out/prep.txt").write_text("stale output the stage must not keep\n")
    (repo / "work.py").write_text(WORK + "\n# changed\n")
    with StageBook(repo) as book:
        spec = book.job_spec("prep")
        assert spec["remove"] == [str((repo / "out/prep.txt").resolve())]
        process = run_job_spec(spec, {k: v for k, v in os.environ.items() if k != "DVC_STAGE"})
        assert process.wait(60) == 0
        assert (repo / "out/prep.txt").read_text().startswith("prep ")
        book.finish("prep")
        assert book.flush() == 1
    status = dvc_status(repo)
    assert "prep:" not in status and "train@0:" in status  # work.py changed: the trains are stale


def test_a_job_spec_runs_each_line_in_its_own_shell_and_stops_at_the_first_failure(tmp_path):
    spec = {"lines": ["cd sub 2>/dev/null || true  # a comment", "pwd > where", "false", "touch never"],
            "cwd": str(tmp_path), "env": {}, "remove": []}  # fmt: skip
    (tmp_path / "sub").mkdir()
    assert run_job_spec(spec, dict(os.environ)).wait(30) != 0
    assert (tmp_path / "where").read_text().strip() == str(tmp_path)  # the cd did not carry over
    assert not (tmp_path / "never").exists()


def test_a_job_spec_unprotects_persistent_outputs_and_skips_those_not_made_yet(tmp_path):
    """A persistent cached output (a training's model folder) is a link into DVC's cache once
    recorded: the job replaces each link by a copy before the command runs, as ``dvc repro`` does;
    on a first run there is nothing to unprotect."""
    cache, model = tmp_path / "cache", tmp_path / "model"
    cache.mkdir()
    model.mkdir()
    (cache / "object").write_text("weights")
    os.link(cache / "object", model / "model.pt")
    spec = {"lines": ["true"], "cwd": str(tmp_path), "env": {}, "remove": [],
            "unprotect": [str(model), str(tmp_path / "not-yet")]}  # fmt: skip
    assert run_job_spec(spec, dict(os.environ)).wait(30) == 0
    assert (model / "model.pt").stat().st_nlink == 1 and (model / "model.pt").read_text() == "weights"
    assert (cache / "object").stat().st_nlink == 1  # the cache's file untouched, no longer shared


def test_slurm_records_nothing_whose_inputs_changed_before_its_job_completed(repo):
    run_parallel(make_plan(repo), 1, [], root=repo, progress=False)
    (repo / "work.py").write_text(WORK + "\n# v2\n")
    with StageBook(repo) as book:
        spec = book.job_spec("prep")  # submitted: work.py and params hashed now
        assert run_job_spec(spec, dict(os.environ)).wait(60) == 0
        (repo / "params.yaml").write_text("size: 5\nseeds: [0, 1]\n")  # edited while the job ran
        with pytest.raises(RecordError, match="size.*changed while the stage ran|params.yaml.*changed"):
            book.finish("prep")
    assert "prep:" in dvc_status(repo)


def test_gpu_slots_put_n_stages_on_each_gpu(repo):
    """Two GPUs x two slots: four workers, each stage told its GPU and the share."""
    assert worker_gpus(["0", "1"], 2) == ["0", "1", "0", "1"]
    (repo / "params.yaml").write_text("size: 3\nseeds: [0, 1, 2, 3, 4, 5]\n")
    pipeline = PIPELINE | {"stages": {k: v for k, v in PIPELINE["stages"].items() if k != "report"}}
    (repo / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    os.environ["WORK_SECONDS"] = "0.3"
    try:
        assert run_parallel(make_plan(repo), 4, worker_gpus(["0", "1"], 2), root=repo, progress=False) == []
    finally:
        del os.environ["WORK_SECONDS"]
    seen = [(repo / f"out/train-{seed}/part").read_text().split() for seed in range(6)]
    assert {gpu for _, gpu, _ in seen} == {"0", "1"} and {share for *_, share in seen} == {"2"}


def test_every_stage_gets_the_run_environment_next_to_its_gpu(repo):
    """``environment`` (e.g. an MPS daemon's pipe directory) reaches every stage; the GPU and its
    share stay per worker."""
    pipe = "/tmp/dmlbench-mps-test"
    assert run_parallel(make_plan(repo), 2, ["0", "0"], root=repo, progress=False,
                        environment={"CUDA_MPS_PIPE_DIRECTORY": pipe}) == []  # fmt: skip
    seen = [(repo / f"out/train-{seed}/part").read_text().split() for seed in range(2)]
    assert [fields[1:] for fields in seen] == [["0", "2", pipe]] * 2
    assert (repo / "out/prep.txt").read_text().split()[1:] == ["0", "2", pipe]


def test_slurm_asks_for_a_share_of_a_gpu_with_gpu_slots():
    from dmlbench.launch import resource_args
    from dmlbench.params.cluster import ClusterConfig

    one = ClusterConfig.model_validate({"default": {"gpus": 1}})
    assert "--gres=gpu:1" in resource_args(one, one.resources("train@x"))
    sharded = ClusterConfig.model_validate({"default": {"gpus": 1}, "gpu_slots": 4})
    assert "--gres=shard:1" in resource_args(sharded, sharded.resources("train@x"))
    mps = ClusterConfig.model_validate({"default": {"gpus": 1}, "gpu_slots": 4, "shared_gres": "mps"})
    assert "--gres=mps:25" in resource_args(mps, mps.resources("train@x"))
    two = ClusterConfig.model_validate({"default": {"gpus": 2}, "gpu_slots": 4})
    assert "--gres=gpu:2" in resource_args(two, two.resources("train@x"))  # whole GPUs stay whole
