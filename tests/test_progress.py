"""What a person following a run reads: one line per training epoch, and the closing summary of
``make repro``."""

from __future__ import annotations

from dmlbench.pipeline.plan import Plan
from dmlbench.pipeline.summary import closing_summary
from dmlbench.train.progress import EpochLine


def _epoch(loss: float, val: float | None, seconds: float = 2.0) -> dict[str, float]:
    metrics = {"train/loss": loss, "train/images_per_second": 1512.4, "train/epoch_seconds": seconds, "train/lr": 1e-3}
    if val is not None:
        metrics["val/map_at_r"] = val
        metrics["test_feedback/map_at_r"] = 0.9  # measured for the report, never shown while training
    return metrics


def test_one_line_per_epoch_marks_each_new_best_validation_score():
    lines: list[str] = []
    log = EpochLine("glyphs-tiny_cnn-contrastive-32-0", 4, "map_at_r", out=lines.append)
    for epoch, (loss, val) in enumerate([(0.9, 0.21), (0.7, 0.25), (0.6, 0.24), (0.5, None)], 1):
        log(epoch, _epoch(loss, val))
    assert lines == [
        "glyphs-tiny_cnn-contrastive-32-0 epoch 1/4: loss 0.9000, val map_at_r 0.2100 (best), 1,512 img/s, 2.0 s",
        "glyphs-tiny_cnn-contrastive-32-0 epoch 2/4: loss 0.7000, val map_at_r 0.2500 (best), 1,512 img/s, 2.0 s",
        "glyphs-tiny_cnn-contrastive-32-0 epoch 3/4: loss 0.6000, val map_at_r 0.2400, 1,512 img/s, 2.0 s",
        "glyphs-tiny_cnn-contrastive-32-0 epoch 4/4: loss 0.5000, 1,512 img/s, 2.0 s",  # not validated
    ]


def test_a_resumed_run_compares_with_the_best_before_the_interruption():
    lines: list[str] = []
    history = [{"epoch": 1, "val/map_at_r": 0.30}, {"epoch": 2, "val/map_at_r": 0.28}]
    log = EpochLine("run", 4, "map_at_r", history=history, out=lines.append)
    log(3, _epoch(0.5, 0.29))
    log(4, _epoch(0.4, 0.31))
    assert "(best)" not in lines[0] and lines[1].endswith("val map_at_r 0.3100 (best), 1,512 img/s, 2.0 s")


def test_closing_summary_counts_stages_and_shows_the_tournament(tmp_path):
    report = tmp_path / "report.md"
    report.write_text(
        "# title\n\n## Tournament of losses\n\nLosses ranked ...\n\n| loss | total rank |\n| :--- | ---: |\n"
        "| Contrastive | 3 |\n\n## Statistical tests\n\n| other | table |\n"
    )
    plan = Plan(order=["train@a", "report"], waits_for={}, total=62)
    text = closing_summary(plan, 997.2, report)
    assert text.splitlines() == [
        "2 of 62 stages run, 60 up to date, in 16 min 37 s; logs in artifacts/logs/.",
        "",
        "Tournament of losses (from the report):",
        "| loss | total rank |",
        "| :--- | ---: |",
        "| Contrastive | 3 |",
        "",
        f"Report: {report}",
        "Runs: make ui (the MLflow UI on this project's tracking store)",
    ]
    nothing = closing_summary(Plan([], {}, 62), 41.0, tmp_path / "missing.md")
    assert nothing == "0 of 62 stages run, 62 up to date, in 41 s."
    assert closing_summary(None, 65, tmp_path / "missing.md") == "dvc repro finished in 1 min 5 s."
