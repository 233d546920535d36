"""One worker of a study as its own process (a Slurm array task of ``tune@``): recover trials whose
worker stopped beating, then run trials until ``tuning.trials`` finished."""

from __future__ import annotations

import argparse
import os

from dmlbench.tune.stage import worker_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("params", "dataset", "backbone", "loss", "study", "parent_run"):
        parser.add_argument(f"--{name.replace('_', '-')}", required=True)
    parser.add_argument("--worker", type=int, required=True)
    args = parser.parse_args(argv)
    threads = int(os.environ.get("SLURM_CPUS_PER_TASK") or os.cpu_count() or 1)
    worker_main(args.params, args.dataset, args.backbone, args.loss, args.study, args.parent_run, args.worker, threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
