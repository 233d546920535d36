"""``python -m dmlbench.tracking.ui --port 5000``: the MLflow UI, opened on the grid's runs.

The view is a *shared view state* (tag ``mlflow.sharedViewState.<key>``, as the UI's "Share" button
writes it: mlflow/server/js ``useSharedExperimentViewState``): runs newest first, test metrics as columns.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import webbrowser
from collections.abc import Sequence
from typing import Any

from dmlbench.tracking.store import client as make_client
from dmlbench.tracking.store import ensure_experiment, tracking_uri

SHARED_VIEW_TAG = "mlflow.sharedViewState."
SEARCH_FILTER = "tags.kind != 'report'"
ORDER_BY = "attributes.start_time"  # the runs table nests child runs only in this order
# metric columns, in this order where present: test metrics (cells and training runs), then the
# validation score the training selected its epoch on (training runs)
PREFERRED_METRICS = ("test/map_at_r", "test/precision_at_1", "test/r_precision", "test/recall_at_1", "test/nmi")
SELECTED_PREFIX = "selected/val_"
MAX_RUNS_SCANNED = 500
RUN_NAME = "attributes.`Run Name`"
DATASET = "attributes.`Dataset`"


def metric_columns(metric_keys: Sequence[str]) -> list[str]:
    """The metric columns to show, in the UI's column-id form ``metrics.`<key>```.

    >>> metric_columns(["train/loss", "test/map_at_r", "selected/val_map_at_r", "n_runs"])
    ['metrics.`test/map_at_r`', 'metrics.`selected/val_map_at_r`']
    """
    keys = set(metric_keys)
    chosen = [key for key in PREFERRED_METRICS if key in keys]
    chosen += sorted(key for key in keys if key.startswith(SELECTED_PREFIX))
    return [f"metrics.`{key}`" for key in chosen]


def view_state(metric_keys: Sequence[str]) -> dict[str, Any]:
    """The shared view state: search facets, the runs table's columns, their order and widths
    (ag-grid column ids; the table orders metrics alphabetically unless ``columnOrder`` says)."""
    metrics = metric_columns(metric_keys)
    return {
        "searchFilter": SEARCH_FILTER,
        "orderByKey": ORDER_BY,
        "orderByAsc": False,
        "selectedColumns": [*metrics, DATASET],
        "columnOrder": [RUN_NAME, *metrics, DATASET],
        "columnWidths": {RUN_NAME: 240, DATASET: 180},
        "runListHidden": False,
        "viewMaximized": False,
    }


def install_view(mlflow_client: Any, experiment_id: str) -> str:
    """Write the view for the experiment's current metrics as an experiment tag; return its key
    (a hash of the state, so a changed view gets a new key and no browser keeps an old one)."""
    runs = mlflow_client.search_runs([experiment_id], SEARCH_FILTER, max_results=MAX_RUNS_SCANNED)
    keys = sorted({key for run in runs for key in run.data.metrics})
    state = json.dumps(view_state(keys), sort_keys=True)
    key = "dmlbench-" + hashlib.sha256(state.encode()).hexdigest()[:12]
    mlflow_client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + key, state)
    return key


def experiment_url(base: str, experiment_id: str, share_key: str | None) -> str:
    """``<base>/#/experiments/<id>/runs?...``: the experiment's model-training runs table."""
    query = "workflowType=machine_learning&compareRunsMode=TABLE"  # the sidebar's "Model training" switch
    query += f"&viewStateShareKey={share_key}" if share_key else ""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def runs_url(base: str, experiment: str) -> str:
    """Install the view in ``experiment`` and return its URL (the experiments list while it has none)."""
    mlflow_client = make_client()
    found = mlflow_client.get_experiment_by_name(experiment)
    if found is None:
        return f"{base.rstrip('/')}/#/experiments"
    experiment_id = ensure_experiment(experiment, mlflow_client)  # also sets the training layout tag
    return experiment_url(base, experiment_id, install_view(mlflow_client, experiment_id))


def has_display() -> bool:
    """A browser can open a window: macOS and Windows always, elsewhere an X or Wayland display."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def server_command(uri: str, host: str, port: int, workers: int = 1) -> list[str]:
    """``mlflow ui`` (an alias of ``mlflow server``) over the store ``uri``."""
    return [
        sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
        "--host", host, "--port", str(port), "--workers", str(workers),
    ]  # fmt: skip


def default_experiment() -> str:
    """``tracking.experiment`` of ``params.yaml``, else ``dmlbench``."""
    try:
        from dmlbench.params.load import load_params

        return load_params().tracking.experiment
    except Exception:  # no or invalid params.yaml: the UI still opens
        return "dmlbench"


def wait_until_up(base: str, server: subprocess.Popen, timeout: float = 120.0) -> bool:
    """Poll ``<base>/health`` until it answers 200 (True), the server exits or ``timeout`` passes."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.5)
    return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dmlbench.tracking.ui", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--experiment", default=None, help="default: tracking.experiment of params.yaml")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser")
    parser.add_argument("--url-only", action="store_true", help="print the URL and exit (no server)")
    args = parser.parse_args(argv)
    uri, base = tracking_uri(), f"http://{args.host}:{args.port}"
    url = runs_url(base, args.experiment or default_experiment())
    print(f"MLflow UI over {uri}\nRuns of the grid: {url}", flush=True)
    if args.url_only:
        return 0
    server = subprocess.Popen(server_command(uri, args.host, args.port))
    try:
        if not args.no_browser and has_display() and wait_until_up(base, server):
            webbrowser.open(url)
        return server.wait()
    except KeyboardInterrupt:
        server.terminate()
        server.wait()
        return 0


if __name__ == "__main__":
    sys.exit(main())
