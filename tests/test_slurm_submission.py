"""The Slurm executor's submission (a stand-in Slurm, :mod:`helpers.fake_slurm`): tune@ stages of a protocol
that trains published values (which they are, that they only write a record) run by the executor
itself, no job, with the trainings waiting for them submitted once they completed; and a stage
that is only downstream of a re-run one is not run when its inputs came out the same."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers.fake_slurm import install, submitted
from helpers.project import run_checked

from dmlbench.launch import write_job_environment
from dmlbench.params.cluster import ClusterConfig
from dmlbench.params.complete import parse_complete as parse_params
from dmlbench.pipeline.record import StageBook
from dmlbench.pipeline.record_only import here_environment, record_only_stages
from dmlbench.pipeline.slurm import Submission, failure_report, job_environment


def _with(raw: dict, hyperparameters: str) -> dict:
    raw = copy.deepcopy(raw)
    raw["protocols"][raw["protocol"]]["hyperparameters"] = hyperparameters
    if hyperparameters == "published":
        raw["tuning"]["baselines"] = []
    return raw


def test_the_record_only_stages_are_the_tune_cells_of_a_published_protocol(default_raw_params, tmp_path, monkeypatch):
    from dmlbench.tune.stage import tune_stage

    raw = _with(default_raw_params, "published")
    raw["backbones"]["tiny_vit"] = {}
    params = parse_params(raw)
    tunes = [f"tune@glyphs-{b}-{loss}" for b in ("tiny_cnn", "tiny_vit") for loss in raw["losses"]]
    planned = [*tunes, "train@glyphs-tiny_cnn-contrastive-32-0", "tune@other-tiny_cnn-contrastive"]
    assert record_only_stages(params, planned) == frozenset(tunes)  # only stages of the grid and the plan
    assert record_only_stages(params, tunes[:3]) == frozenset(tunes[:3])
    assert record_only_stages(parse_params(_with(default_raw_params, "tuned")), tunes) == frozenset()
    # each is what the stage itself does: a record, no search, no data read (none prepared here)
    monkeypatch.chdir(tmp_path)
    record = tune_stage(params, "glyphs", "tiny_vit", "triplet")
    assert record["hyperparameters"] == "published" and record["values"] == {}
    best = yaml.safe_load(Path("artifacts/tuning/glyphs/tiny_vit/triplet/best.yaml").read_text())
    assert best["hyperparameters"] == "published"


def _project(tmp_path: Path, tune: str, items: tuple[str, ...] = ("a",)) -> tuple[Path, dict[str, str]]:
    """A DVC project: ``prep`` (a job), ``tune@<item>`` running ``tune`` after it, ``train@<item>``
    reading what its tune wrote (a job)."""
    root = tmp_path / "repo"
    root.mkdir()
    env = dict(os.environ, DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")  # fmt: skip
    env.pop("DVC_ROOT", None)
    run_checked(["git", "init", "-q"], root, env)
    run_checked([sys.executable, "-m", "dvc", "init", "-q"], root, env)
    pipeline = {
        "stages": {
            "prep": {"cmd": "python -c \"open('prepared', 'w').write('prepared')\"", "outs": ["prepared"]},
            "tune": {"foreach": list(items), "do": {"cmd": tune, "deps": ["prepared"], "outs": ["best-${item}"]}},
            "train": {
                "foreach": list(items),
                "do": {"cmd": "python -c \"open('model-${item}', 'w').write(open('best-${item}').read())\"",
                       "deps": ["best-${item}"], "outs": ["model-${item}"]},
            },
        }
    }  # fmt: skip
    (root / "dvc.yaml").write_text(yaml.safe_dump(pipeline))
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-q", "-m", "project"], root, env)
    env.update(install(tmp_path / "bin", tmp_path / "slurm"))
    return root, env


ORDER = ["prep", "tune@a", "train@a"]
CONFIG = ClusterConfig.model_validate({"poll_seconds": [0.2, 0.5], "default": {"cpus": 1, "mem": "1G", "time": "10"}})


def _alarm(_signum, _frame):
    raise TimeoutError("the submission did not end in 120 s")


def _submit(root: Path, env: dict[str, str], monkeypatch, stale: frozenset[str] | None = None,
            order: list[str] = ORDER, progress_note=None) -> tuple[dict[str, str], Submission, str]:  # fmt: skip
    """Run ``order`` (``tune@*`` run here) with a stand-in Slurm: the final states, the submission and
    the stages dvc.lock records. Stopped after 120 s (a regression that waits forever fails)."""
    monkeypatch.chdir(root)
    for key in ("PATH", "FAKE_SLURM_DIR"):
        monkeypatch.setenv(key, env[key])
    env_file = (root / "artifacts" / "logs" / "slurm-job.env").resolve()
    env_file.parent.mkdir(parents=True, exist_ok=True)
    write_job_environment(env_file, job_environment(dict(os.environ), env_file))
    waits = {stage: {"prep"} if stage.startswith("tune@") else set() for stage in order}
    waits.update({stage: {stage.replace("train@", "tune@")} for stage in order if stage.startswith("train@")})
    here = frozenset(stage for stage in order if stage.startswith("tune@"))
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(120)
    try:
        with StageBook(".") as book:
            submission = Submission(order, waits, CONFIG, Path("."), Path("artifacts/logs"), env_file=env_file,
                                    book=book, here=here, here_env=here_environment({}), stale=stale)  # fmt: skip
            submission.progress_note = progress_note
            final = submission.run()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    lock = yaml.safe_load((root / "dvc.lock").read_text()) if (root / "dvc.lock").exists() else {"stages": {}}
    return final, submission, " ".join(sorted(lock["stages"]))


@pytest.mark.slow
def test_the_watchers_summary_line_carries_the_eta_of_the_cost_model(tmp_path, monkeypatch, capsys):
    """The local runner's ETA (:class:`dmlbench.cost.plan.RunnerEta`) on the Slurm watcher's lines: the
    model's wall time at the start (3 stages of 1 h on 1 slot), then corrected by the stages done."""
    from dmlbench.cost.model import Eta, StageEstimate
    from dmlbench.cost.plan import RunnerEta

    root, env = _project(tmp_path, WRITE_HERE)
    estimates = {name: StageEstimate(name, name.split("@")[0], 3600.0, False, "assumed") for name in ORDER}
    final, _, _ = _submit(root, env, monkeypatch, progress_note=RunnerEta(Eta(estimates, workers=1)))
    assert final == dict.fromkeys(ORDER, "COMPLETED")
    out = capsys.readouterr().out.splitlines()
    assert "0/3 ended; ETA 3 h 0 min (model)" in out
    ended = [line for line in out if line.startswith("done")]
    assert [line.split()[1] for line in ended] == ORDER
    # prep ran in seconds, not its hour: the rest is corrected by that ratio (the same for every kind)
    assert "[1/3 ended; ETA " in ended[0] and "(model x 0.00 after 1 stage(s))]" in ended[0]
    assert ended[-1].endswith("[3/3 ended; ETA 0 s (model x 0.00 after 3 stage(s))]")


# the record says where it was written: SLURM_JOB_ID is set in every (stand-in) Slurm job
WRITE_HERE = (
    "python -c \"import os; open('best-${item}', 'w').write("
    "'job ' + os.environ.get('SLURM_JOB_ID', 'none') + ' ' + open('prepared').read())\""
)


@pytest.mark.slow
def test_slurm_runs_a_record_only_stage_itself_and_submits_what_waits_for_it_after(tmp_path, monkeypatch, capsys):
    root, env = _project(tmp_path, WRITE_HERE)
    final, submission, recorded = _submit(root, env, monkeypatch)
    assert final == dict.fromkeys(ORDER, "COMPLETED")
    calls = submitted(tmp_path / "slurm")
    assert [next(a for a in call["args"] if a.startswith("--job-name=")) for call in calls] == [
        "--job-name=prep",
        "--job-name=train@a",
    ]  # no job for tune@a
    train = calls[1]["args"]
    assert not any(a.startswith("--dependency") for a in train)  # submitted once tune@a had completed
    assert (root / "model-a").read_text() == "job none prepared"  # train read what tune@a wrote here, not in a job
    assert recorded == "prep train@a tune@a"
    assert "up to date" in run_checked([sys.executable, "-m", "dvc", "status"], root, env).stdout
    assert "done      tune@a (run here: no job)" in capsys.readouterr().out


@pytest.mark.slow
def test_a_failed_record_only_stage_is_not_recorded_and_nothing_after_it_is_submitted(tmp_path, monkeypatch):
    root, env = _project(tmp_path, "python -c \"import sys; print('no record'); sys.exit(3)\"")
    final, submission, recorded = _submit(root, env, monkeypatch)
    assert final == {"prep": "COMPLETED", "tune@a": "FAILED", "train@a": "CANCELLED"}
    assert len(submitted(tmp_path / "slurm")) == 1  # prep only
    assert recorded == "prep"
    report = failure_report(list(submission.jobs.values()), final)
    assert "stage tune@a FAILED (run here)" in report and "no record" in report
    status = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=root, env=env, capture_output=True,
                            text=True, check=False).stdout  # fmt: skip
    assert "tune@a" in status and "train@a" in status and "prep:" not in status


def test_the_slurm_executor_hands_the_record_only_stages_to_its_submission(default_raw_params, tmp_path, monkeypatch):
    """run_on_slurm picks them from params (not as tune worker-array waiters) and gives their
    processes the jobs' variables (offline, the tracking URI), one thread each."""
    from contextlib import nullcontext

    from dmlbench.pipeline import slurm
    from dmlbench.pipeline.plan import Plan

    raw = _with(default_raw_params, "published")
    raw["tuning"].update(workers=2, storage="postgresql://u@db/optuna")  # tune jobs as worker arrays
    params = parse_params(raw)
    order = ["tune@glyphs-tiny_cnn-contrastive", "tune@glyphs-tiny_cnn-triplet", "train@glyphs-tiny_cnn-triplet-32-0"]
    for name in ("require_slurm", "require_tracking_for_cluster", "require_reachable_stores", "require_fetched",
                 "ensure_experiment", "probe_grid"):  # fmt: skip
        monkeypatch.setattr(slurm, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(slurm, "plan_after_validate", lambda: Plan(order, {order[2]: {order[1]}}))
    monkeypatch.setattr(slurm, "StageBook", lambda root: nullcontext())
    seen: dict = {}

    class Recorded:
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)
            self.jobs: dict = {}

        def run(self, detach=False):
            return dict.fromkeys(order, "COMPLETED")

    monkeypatch.setattr(slurm, "Submission", Recorded)
    monkeypatch.chdir(tmp_path)
    assert slurm.run_on_slurm(params)[0] == 0
    assert seen["here"] == frozenset(order[:2]) and seen["array_waiters"] == frozenset()
    env = seen["here_env"]
    assert env["DMLBENCH_OFFLINE"] == "1" and env["OMP_NUM_THREADS"] == "1" and "MLFLOW_TRACKING_URI" in env


def _job_names(state: Path) -> list[str]:
    return [next(a for a in call["args"] if a.startswith("--job-name=")).split("=", 1)[1] for call in submitted(state)]


@pytest.mark.slow
def test_on_slurm_what_follows_a_stage_re_run_to_the_same_outputs_is_not_run(tmp_path, monkeypatch, capsys):
    """As dvc repro (and the local executor): prep's command edited, its output the same -> tune@a
    and train@a are held back until it ended, then not run; its output changed -> they run."""
    from dmlbench.pipeline.plan import make_plan

    root, env = _project(tmp_path, WRITE_HERE)
    assert _submit(root, env, monkeypatch)[0] == dict.fromkeys(ORDER, "COMPLETED")
    written = (root / "model-a").stat().st_mtime_ns  # a re-run of train@a would write it again
    dvc_yaml = root / "dvc.yaml"

    dvc_yaml.write_text(dvc_yaml.read_text().replace("write('prepared')", "write('prep' + 'ared')"))
    plan = make_plan(root)
    assert plan.order == ORDER and plan.stale == frozenset({"prep"})  # the others only follow prep
    final, _, _ = _submit(root, env, monkeypatch, plan.stale, plan.order)
    assert final == {"prep": "COMPLETED", "tune@a": "UNCHANGED", "train@a": "UNCHANGED"}
    assert _job_names(tmp_path / "slurm") == ["prep", "train@a", "prep"]  # one job more: prep
    assert "same      train@a (its inputs came out the same: not run)" in capsys.readouterr().out
    assert (root / "model-a").stat().st_mtime_ns == written
    assert "up to date" in run_checked([sys.executable, "-m", "dvc", "status"], root, env).stdout

    dvc_yaml.write_text(dvc_yaml.read_text().replace("write('prep' + 'ared')", "write('changed')"))
    plan = make_plan(root)
    final, _, _ = _submit(root, env, monkeypatch, plan.stale, plan.order)
    assert final == dict.fromkeys(ORDER, "COMPLETED")
    assert _job_names(tmp_path / "slurm")[3:] == ["prep", "train@a"]
    assert (root / "model-a").read_text() == "job none changed"
    assert "up to date" in run_checked([sys.executable, "-m", "dvc", "status"], root, env).stdout


@pytest.mark.slow
def test_at_most_two_stages_run_here_at_once(tmp_path, monkeypatch):
    timed = (
        'python -c "import time; s = time.time(); time.sleep(1); '
        "open('best-${item}', 'w').write(str(s)); open('end-${item}', 'w').write(str(time.time()))\""
    )
    items = ("a", "b", "c", "d")
    root, env = _project(tmp_path, timed, items)
    order = ["prep", *(f"tune@{i}" for i in items), *(f"train@{i}" for i in items)]
    final, _, recorded = _submit(root, env, monkeypatch, order=order)
    assert set(final.values()) == {"COMPLETED"} and len(recorded.split()) == len(order)
    spans = [(float((root / f"best-{i}").read_text()), float((root / f"end-{i}").read_text())) for i in items]
    for moment, _ in spans:  # at each start, how many were running
        assert sum(start <= moment < end for start, end in spans) <= 2
    assert len(submitted(tmp_path / "slurm")) == 1 + len(items)  # prep and the trainings only


@pytest.mark.slow
def test_a_stopped_submission_stops_the_stages_running_here_and_records_none(tmp_path, monkeypatch):
    """Ctrl-C (here: the KeyboardInterrupt it raises) reaches a stage running here, which is not
    recorded; what waits for it is never submitted."""
    slow = "python -c \"import os, time; open('pid', 'w').write(str(os.getpid())); time.sleep(60)\""
    root, env = _project(tmp_path, slow)

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    monkeypatch.setattr(signal, "alarm", lambda seconds: None)  # _submit's own guard: replaced by this one
    previous = signal.signal(signal.SIGUSR2, interrupt)

    def once_it_runs() -> None:  # the interrupt once the stage runs here (or after 120 s)
        deadline = time.monotonic() + 120
        while not (root / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGUSR2)

    try:
        threading.Thread(target=once_it_runs, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            _submit(root, env, monkeypatch)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    pid = int((root / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped (and reaped)
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    assert sorted(lock["stages"]) == ["prep"] and not (root / "best-a").exists()
    assert len(submitted(tmp_path / "slurm")) == 1
