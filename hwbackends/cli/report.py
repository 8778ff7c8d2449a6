"""``hwb report RESULTS.json -o report.html``: the self-contained hardware-evaluation report."""
from __future__ import annotations

import argparse


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="render a bench results file as one self-contained HTML report")
    p.add_argument("results", help="results JSON written by hwb bench / hwb demo")
    p.add_argument("--output", "-o", default="hwb-report.html", help="HTML file (default %(default)s)")
    p.add_argument("--csv", action="store_true",
                   help="print the latency table as CSV (p50/p90/p95/p99/p99.9 per profile) "
                        "instead of writing the HTML (default: the HTML)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench import BenchResults
    from ..registry import get_registry
    from ..report import write_report

    if args.csv:
        print(BenchResults.load(args.results).table_csv(), end="")
        return 0
    out = write_report(args.results, args.output, registry=get_registry())
    print(f"report: {out}")
    return 0
