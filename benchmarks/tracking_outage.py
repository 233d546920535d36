"""A tracking server down for minutes while a training logs through its spool: what is lost, what waits.

Starts ``mlflow server`` (SQLite store, 127.0.0.1, a free port), opens a training's cell and run
through a spool (:class:`dmlbench.tracking.spooled.StageTracking`, as a training stage does), then
logs one "epoch" (the metrics a real epoch logs) every ``--epoch-seconds`` for ``--epochs`` epochs,
stops the server (SIGTERM to its process group) after ``--down-after`` epochs and starts it again
``--outage`` seconds later, on the same port and store. The training loop is synthetic (a sleep per
epoch): what is measured is the tracking, not a model.

    python benchmarks/tracking_outage.py --outage 600 --epochs 450 --epoch-seconds 2   # a 10-minute outage
    python benchmarks/tracking_outage.py --outage 20 --epochs 30 --epoch-seconds 1     # quick look

Prints: epochs logged by the loop and held by the server (each exactly once?), the longest time one
epoch's logging call took (the training's wait), the outage's length, how long the backlog took to
reach the server after the restart; writes the same as JSON to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

KEYS = ("train/loss", "train/lr", "train/epoch_seconds", "train/images_per_second", "val/map_at_r")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    def __init__(self, directory: Path, port: int):
        self.directory, self.port, self.process = directory, port, None
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> float:
        """Start it; seconds until it answered."""
        started = time.monotonic()
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop("MLFLOW_TRACKING_URI", None)
        command = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port",
                   str(self.port), "--workers", "1", "--backend-store-uri", f"sqlite:///{self.directory / 'm.db'}",
                   "--default-artifact-root", str(self.directory / "artifacts")]  # fmt: skip
        with open(self.directory / "server.log", "a") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return time.monotonic() - started
            except OSError:
                time.sleep(0.2)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage", type=float, default=600.0, help="seconds the server is down")
    parser.add_argument("--epochs", type=int, default=450)
    parser.add_argument("--epoch-seconds", type=float, default=2.0)
    parser.add_argument("--down-after", type=int, default=10, help="epochs logged before the server stops")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tracking-outage-"))
    server = Server(work, free_port())
    first_start = server.start()
    os.environ.update(MLFLOW_TRACKING_URI=server.url, NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    from mlflow.tracking import MlflowClient

    from dmlbench.grid import RunSpec
    from dmlbench.tracking.spooled import StageTracking

    run = RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0)
    resolved = {"protocol": {"name": "bench", "epochs": args.epochs}, "loss": {"name": "contrastive"}, "seed": 0}
    waits: list[float] = []
    events: dict[str, float] = {}

    def restart_server() -> None:
        events["restart_seconds"] = server.start()
        events["up_at"] = time.monotonic()
        while tracking.spool.pending() > 0:  # the backlog goes out (the loop keeps adding an epoch now and then)
            time.sleep(0.05)
        events["caught_up_at"] = time.monotonic()

    restart = threading.Thread(target=restart_server)
    with StageTracking(work / "spool", wait_seconds=3600) as tracking:
        cell = tracking.cell_run("bench", run.combo, resolved)
        handle = tracking.training_run("run", run, resolved, "h", "bench", resume=False, parent=cell, code="c")
        for epoch in range(1, args.epochs + 1):
            time.sleep(args.epoch_seconds)  # the epoch's training
            started = time.monotonic()
            handle.log_metrics({key: 1.0 / epoch for key in KEYS}, step=epoch)
            waits.append(time.monotonic() - started)
            if epoch == args.down_after:
                server.stop()
                events["down_at"] = time.monotonic()
            down_for = time.monotonic() - events.get("down_at", time.monotonic())
            if "down_at" in events and "restarted" not in events and down_for >= args.outage:
                events["restarted"] = 1.0
                restart.start()
        handle.finish()
        restart.join()
        drained = tracking.flush()
        run_id = tracking.spool.runs["run"]
    client = MlflowClient(server.url)
    steps = {key: sorted(m.step for m in client.get_metric_history(run_id, key)) for key in KEYS}
    expected = list(range(1, args.epochs + 1))
    result = {
        "epochs_logged_by_the_loop": len(waits),
        "epochs_on_the_server_exactly_once": all(found == expected for found in steps.values()),
        "metric_rows_on_the_server": sum(len(found) for found in steps.values()),
        "run_status": client.get_run(run_id).info.status,
        "outage_seconds": round(events["up_at"] - events["down_at"], 1),
        "longest_logging_call_seconds": round(max(waits), 4),
        "backlog_sent_seconds_after_restart": round(events["caught_up_at"] - events["up_at"], 1),
        "all_sent": drained,
        "server_start_seconds": round(first_start, 1),
        "server_restart_seconds": round(events.get("restart_seconds", 0.0), 1),
    }
    server.stop()
    width = max(map(len, result))
    print("\n".join(f"{key:<{width}}  {value}" for key, value in result.items()))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0 if result["epochs_on_the_server_exactly_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
