"""``python -m dmlbench.results merge A.csv B.csv ... [-o OUT]``: merge results indexes of several labs
(:mod:`dmlbench.results.merge`); ``python -m dmlbench.results report MERGED.csv [-o OUT.md]``: the
report a merged index supports (:mod:`dmlbench.results.report`). A refusal prints one line and exits 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dmlbench.errors import DmlbenchError
from dmlbench.io import atomic_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dmlbench.results", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    merge = commands.add_parser("merge", help="merge results indexes whose protocols match")
    merge.add_argument("indexes", nargs="+", type=Path, help="results.csv files (reports/results.csv of each lab)")
    merge.add_argument("-o", "--output", type=Path, default=Path("reports/merged-results.csv"))
    report = commands.add_parser("report", help="the report of a merged index (tables, ranking, Friedman)")
    report.add_argument("index", type=Path)
    report.add_argument("-o", "--output", type=Path, default=Path("reports/merged-report.md"))
    report.add_argument("--metric", default="map_at_r")
    report.add_argument("--confidence", type=float, default=0.95)
    report.add_argument("--alpha", type=float, default=0.05)
    report.add_argument("--rope", type=float, default=0.01)
    args = parser.parse_args(argv)
    from dmlbench.results.merge import merge_indexes, read_index

    try:
        if args.command == "merge":
            if len(args.indexes) < 2:
                raise DmlbenchError("merge needs at least two results indexes")
            merged = merge_indexes([read_index(path) for path in args.indexes])
            with atomic_path(args.output, suffix=".csv") as tmp:
                merged.to_csv(tmp, index=False)
            runs = int((merged["level"] == "run").sum())
            print(f"wrote {args.output}: {runs} run rows from {len(args.indexes)} indexes")
        else:
            from dmlbench.results.report import merged_report

            text = merged_report(read_index(args.index), args.metric, args.confidence, args.alpha, args.rope)
            with atomic_path(args.output, suffix=".md") as tmp:
                tmp.write_text(text)
            print(f"wrote {args.output}")
    except DmlbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
