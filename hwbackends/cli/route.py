"""``hwb route CONFIG [--explain] [--json]``: the routing table of a strategies file."""
from __future__ import annotations

import argparse

from . import CACHE_DIR_HELP, emit, stderr_progress
from .source import add_data_args


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("route", help="choose a variant per strategy and tier from a strategies.toml")
    p.add_argument("config", help="strategies TOML file (see examples/strategies.toml)")
    p.add_argument("--explain", action="store_true",
                   help="every candidate with its p99, fidelity, mode and why chosen or rejected "
                        "(default: one line per strategy)")
    p.add_argument("--strategy", action="append", default=None,
                   help="only this strategy (repeatable; default: every strategy)")
    p.add_argument("--refresh", action="store_true",
                   help="re-measure instead of cached profiles (default: reuse them)")
    p.add_argument("--check", action="store_true",
                   help="only validate the file, reporting every problem (no compile, no bench)")
    p.add_argument("--cache-dir", default=None, help=CACHE_DIR_HELP)
    p.add_argument("--fleet-results", default=None, metavar="RESULTS_JSON",
                   help="placement advice from a `hwb fleet` results file: per strategy, the "
                        "router's choice on each machine and the best machine (measures nothing; "
                        "default: route on this machine)")
    p.add_argument("--json", action="store_true", help="machine-readable output (default: text)")
    add_data_args(p, where="; replaces every strategy's own calibration_data/validation_data")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..config import load_config
    from ..context import RunContext
    from ..router import Router
    from ..router.plan import one_line

    ctx = RunContext.at(args.cache_dir, progress=None if args.json else stderr_progress)
    if args.fleet_results:
        from ..bench import BenchResults
        from ..fleet.placement import place, render
        advice = place(BenchResults.load(args.fleet_results), args.config, ctx.registry)
        emit(args, advice, render(advice))
        return 0 if all(r["best"] for r in advice) else 1
    if args.check:
        cfg = load_config(args.config, ctx.registry)
        emit(args, cfg.model_dump(), f"{args.config}: valid ({len(cfg.tiers)} tiers, "
                                     f"{len(cfg.strategies)} strategies)")
        return 0
    router = Router.from_config(args.config, context=ctx, reuse_profiles=not args.refresh,
                                strict=False, strategies=args.strategy,
                                calibration_data=args.calibration_data,
                                validation_data=args.validation_data)
    if args.explain:
        human = router.explain()
    else:
        rows = [f"{'STRATEGY':<18} {'TIER':<10} {'BUDGET':>10} {'CHOSEN':<30} {'MODE':<9} {'p99':>10}"]
        for d in router.decisions.values():
            c = d.chosen
            p99 = f"{c.p99_us:.2f} µs" if c and c.p99_us is not None else "—"
            rows.append(f"{d.strategy:<18} {d.tier:<10} {d.budget_us:>7g} µs "
                        f"{(c.variant if c else 'NONE'):<30} {(c.mode if c else ''):<9} {p99:>10}"
                        + ("" if d.meets_budget else "  ! over budget" if c else "  ! no variant")
                        + (f"  ({c.load.cores_used} core(s) at {c.load.offered_hz:,.0f} ticks/s)"
                           if c and c.load else ""))
            if d.note:
                rows.append(f"{'':<18} {one_line(d.note)}")
        human = "\n".join(rows)
    emit(args, router.to_dict(), human)
    return 0 if all(d.order for d in router.decisions.values()) else 1
