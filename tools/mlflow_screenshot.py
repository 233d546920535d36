"""Check the MLflow UI in headless Chromium: ``python tools/mlflow_screenshot.py OUT_DIR`` (a developer's
tool, outside the library: no stage runs it).

Starts ``mlflow ui`` on a free port over the tracking store (``$MLFLOW_TRACKING_URI`` or the
project's), opens the runs view of :mod:`dmlbench.tracking.ui`, a grid cell's (summary) run and
one of its training runs in Chromium (``--headless --screenshot`` and ``--dump-dom``, see
https://developer.chrome.com/docs/chromium/headless), saves ``runs.png``, ``cell_run.png`` and
``training_run.png`` (+ the DOMs) in OUT_DIR, and checks the pages' text: the model-training
layout (not the GenAI one), the metric columns, the cells with their child runs, the cell's
params, and the training run's parent and dataset. Prints each failed check; exit status 1 if any.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlbench.tracking.runs import PARENT_TAG
from dmlbench.tracking.store import client as make_client
from dmlbench.tracking.store import tracking_uri
from dmlbench.tracking.ui import SHARED_VIEW_TAG, default_experiment, runs_url, server_command, wait_until_up

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
WINDOW = (1600, 1000)
RUN_PAGE_WINDOW = (1600, 2000)  # tall enough for a run page's metrics and params tables
EXPANDER = "runnamecellrenderer"  # the component id of the run-name cell's expand button (parents only)


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def page_text(dom: str) -> str:
    """The visible text of a dumped DOM, whitespace collapsed."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom))).strip()


def capture(browser: str, url: str, png: Path, window: tuple[int, int], budget_ms: int) -> str:
    """Screenshot ``url`` to ``png`` and return its DOM after ``budget_ms`` of virtual time."""
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
        f"--window-size={window[0]},{window[1]}", f"--virtual-time-budget={budget_ms}",
    ]  # fmt: skip
    run = dict(capture_output=True, text=True, timeout=300)
    subprocess.run([browser, *flags, f"--screenshot={png}", url], check=True, **run)
    dom = subprocess.run([browser, *flags, "--dump-dom", url], check=True, **run).stdout
    png.with_suffix(".html").write_text(dom)
    return dom


@dataclass
class Outcome:
    screenshots: list[Path] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.failures.append(message)


def _check_runs_page(outcome: Outcome, dom: str, columns: list[str], cells: list[Any]) -> None:
    text = page_text(dom)
    outcome.check("Model training" in text and "Judges" not in text, "runs page: not the model-training layout")
    outcome.check("Run Name" in text, "runs page: no runs table")
    for column in columns:
        if column.startswith("metrics."):
            outcome.check(f'col-id="{column}"' in dom, f"runs page: no column {column}")
    for cell in cells:
        outcome.check(cell.info.run_name in text, f"runs page: cell run {cell.info.run_name!r} not listed")
    expanders = dom.count(EXPANDER)
    outcome.check(expanders >= len(cells), f"runs page: {expanders} expandable parent runs, expected {len(cells)}")


def _check_cell_page(outcome: Outcome, dom: str, cell: Any, children: list[Any]) -> None:
    text = page_text(dom)
    after = text.split("Child runs", 1)[-1][:2000] if "Child runs" in text else ""
    for child in children:
        outcome.check(child.info.run_name in after, f"cell page: child run {child.info.run_name!r} not shown")
    for key, value in cell.data.params.items():
        outcome.check(f"{key} {value}" in text, f"cell page: param {key} = {value} not shown")
    for key in ("test/map_at_r", "n_runs"):
        if key in cell.data.metrics:
            outcome.check(key in text, f"cell page: metric {key} not shown")


def _check_training_page(outcome: Outcome, dom: str, cell: Any, run: Any) -> None:
    text = page_text(dom)
    outcome.check(cell.info.run_name in text.split("Parent run", 1)[-1][:500], "training page: parent run not shown")
    for dataset in run.inputs.dataset_inputs:
        outcome.check(dataset.dataset.name in text, f"training page: dataset {dataset.dataset.name} not shown")


def check_ui(out_dir: Path, experiment: str, browser: str, budget_ms: int = 20000) -> Outcome:
    """Start the UI over the current tracking store, capture and check its pages (see module doc)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    outcome = Outcome()
    mlflow_client = make_client()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(out_dir / "server.log", "w")
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    server = subprocess.Popen(server_command(tracking_uri(), "127.0.0.1", port), stdout=log, stderr=log, env=env)
    try:
        if not wait_until_up(base, server, timeout=240):
            outcome.failures.append(f"mlflow ui did not start (see {out_dir / 'server.log'})")
            return outcome
        url = runs_url(base, experiment)
        experiment_id = mlflow_client.get_experiment_by_name(experiment).experiment_id
        columns = _selected(mlflow_client, experiment_id, url.rsplit("viewStateShareKey=", 1)[-1])
        cells = mlflow_client.search_runs(
            [experiment_id], "tags.kind = 'summary'", order_by=["attributes.start_time DESC"]
        )
        parents = [c for c in cells if _children(mlflow_client, experiment_id, c)]
        dom = capture(browser, url, out_dir / "runs.png", WINDOW, budget_ms)
        outcome.screenshots.append(out_dir / "runs.png")
        _check_runs_page(outcome, dom, columns, parents)
        parent = parents[0] if parents else None
        outcome.check(parent is not None, "store: no cell run with child runs")
        if parent is None:
            return outcome
        children = _children(mlflow_client, experiment_id, parent)
        page = f"{base}/#/experiments/{experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning"
        dom = capture(browser, page, out_dir / "cell_run.png", RUN_PAGE_WINDOW, budget_ms)
        outcome.screenshots.append(out_dir / "cell_run.png")
        _check_cell_page(outcome, dom, parent, children)
        child = children[-1]
        page = f"{base}/#/experiments/{experiment_id}/runs/{child.info.run_id}?workflowType=machine_learning"
        dom = capture(browser, page, out_dir / "training_run.png", RUN_PAGE_WINDOW, budget_ms)
        outcome.screenshots.append(out_dir / "training_run.png")
        _check_training_page(outcome, dom, parent, child)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    return outcome


def _selected(mlflow_client: Any, experiment_id: str, key: str) -> list[str]:
    """The columns of the view ``key`` that :func:`runs_url` installed."""
    import json

    tags = mlflow_client.get_experiment(experiment_id).tags
    return json.loads(tags[SHARED_VIEW_TAG + key])["selectedColumns"]


def _children(mlflow_client: Any, experiment_id: str, run: Any) -> list[Any]:
    return mlflow_client.search_runs(
        [experiment_id], f"tags.`{PARENT_TAG}` = '{run.info.run_id}'", order_by=["attributes.start_time DESC"]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/mlflow_screenshot.py", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--experiment", default=None, help="default: tracking.experiment of params.yaml")
    args = parser.parse_args(argv)
    browser = find_browser()
    if browser is None:
        print("no Chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    outcome = check_ui(args.out_dir, args.experiment or default_experiment(), browser)
    for path in outcome.screenshots:
        print(f"screenshot: {path}")
    for failure in outcome.failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
