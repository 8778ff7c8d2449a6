"""``hwb compare BASE.json NEW.json``: per-variant deltas of two results files (p50, p99,
fidelity), exiting non-zero when a move breaks a ``--max-*`` threshold: a CI job's check
that a change did not slow a variant down or make it drift from the reference. A figure a
threshold checks that is missing, NaN, infinite or out of range fails the gate too (exit 5)."""
from __future__ import annotations

import argparse

from ..units import parse_real
from . import EXIT_BROKEN, EXIT_REGRESSION, emit, number


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="per-variant deltas of two results files; non-zero exit "
                                       "past the thresholds (for CI)")
    p.add_argument("base", help="results JSON of the baseline (hwb bench / demo / fleet)")
    p.add_argument("new", help="results JSON to judge against it")
    num = number(parse_real, "threshold", lo=0.0, hi=1e6, what="a threshold", unit="percent",
                 example="10")
    drop = number(parse_real, "threshold", lo=0.0, hi=2.0, what="a correlation drop",
                  example="0.001")
    p.add_argument("--max-p50", type=num, default=None, metavar="PCT",
                   help="fail when a row's p50 rose by more than PCT percent (default: not checked)")
    p.add_argument("--max-p99", type=num, default=None, metavar="PCT",
                   help="fail when a row's p99 rose by more than PCT percent (default: not checked)")
    p.add_argument("--max-corr-drop", type=drop, default=None, metavar="D",
                   help="fail when a variant's fidelity correlation fell by more than D, e.g. "
                        "0.001 (default: not checked)")
    p.add_argument("--fail-missing", action="store_true",
                   help="fail when a row of BASE is not in NEW (default: listed only; a variant "
                        "that failed to compile in NEW always fails)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the rows as JSON (default: a table)")
    out.add_argument("--csv", action="store_true", help="the rows as CSV (default: a table)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench import BenchResults
    from ..bench.compare import Thresholds, compare, render, render_csv

    c = compare(BenchResults.load(args.base), BenchResults.load(args.new),
                Thresholds(p50_pct=args.max_p50, p99_pct=args.max_p99,
                           corr_drop=args.max_corr_drop, fail_missing=args.fail_missing))
    if args.csv:
        print(render_csv(c), end="")
    else:
        emit(args, c.to_dict(), render(c))
    return EXIT_BROKEN if c.broken else EXIT_REGRESSION if c.failed else 0
