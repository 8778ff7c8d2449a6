"""``hwb compare BASE.json NEW.json``: per-variant deltas of two results files (p50, p99,
fidelity), exiting non-zero when a move breaks a ``--max-*`` threshold: a CI job's check
that a change did not slow a variant down or make it drift from the reference."""
from __future__ import annotations

import argparse

from . import EXIT_REGRESSION, emit


def non_negative(text: str) -> float:
    from ..errors import ConfigError

    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not 0 <= x < float("inf"):
        raise ConfigError(f"{text!r}: expected a number ≥ 0, e.g. 10")
    return x


def add(sub: argparse._SubParsersAction) -> None:
    from . import usage_type

    p = sub.add_parser("compare", help="per-variant deltas of two results files; non-zero exit "
                                       "past the thresholds (for CI)")
    p.add_argument("base", help="results JSON of the baseline (hwb bench / demo / fleet)")
    p.add_argument("new", help="results JSON to judge against it")
    num = usage_type(non_negative, "threshold")
    p.add_argument("--max-p50", type=num, default=None, metavar="PCT",
                   help="fail when a row's p50 rose by more than PCT percent (default: not checked)")
    p.add_argument("--max-p99", type=num, default=None, metavar="PCT",
                   help="fail when a row's p99 rose by more than PCT percent (default: not checked)")
    p.add_argument("--max-corr-drop", type=num, default=None, metavar="D",
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
    return EXIT_REGRESSION if c.failed else 0
