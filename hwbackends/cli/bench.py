"""``hwb bench MODEL``: compile on every allowed target × precision, measure each variant in
the chosen scenarios, write the results JSON (and optionally the HTML report)."""
from __future__ import annotations

import argparse
import sys

from . import emit, stderr_progress


def _csv(items: list[str] | None) -> list[str]:
    return [s.strip() for item in items or [] for s in item.split(",") if s.strip()]


def parse_pin(spec: str | None) -> list[int] | None:
    from ..errors import ConfigError

    if not spec:
        return None
    cpus: list[int] = []
    try:
        for part in spec.split(","):
            a, _, b = part.partition("-")
            cpus += list(range(int(a), int(b) + 1)) if b else [int(a)]
    except ValueError:
        raise ConfigError(f"--pin {spec!r}: expected CPU numbers like 0 or 0,1 or 2-3") from None
    return cpus


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure a model's variants: single-stream, server, burst, batch")
    p.add_argument("model", help="model file (.keras .onnx .pt2 …) or zoo:NAME")
    p.add_argument("--targets", "-t", action="append", default=None, metavar="GLOB[,GLOB]",
                   help="targets to measure (globs, e.g. 'cpu.*'); default: all registered")
    p.add_argument("--precisions", "-p", action="append", default=None, metavar="P[,P]",
                   help="precisions (default: every precision each target offers)")
    p.add_argument("--scenario", "-s", action="append", default=None, metavar="SPEC",
                   help="single-stream | server[:rate_hz=R,n=N] | burst[:trace=FILE,unit=ms] | "
                        "batch[:sizes=1/8/32]; repeatable (default: single-stream)")
    p.add_argument("--n", type=int, default=None, help="timed calls per single-stream/server/batch run")
    p.add_argument("--pin", default=None, metavar="CPUS", help="pin the measuring thread, e.g. 1 or 0-1")
    p.add_argument("--output", "-o", default="hwb-results.json", help="results JSON (default %(default)s)")
    p.add_argument("--report", nargs="?", const="hwb-report.html", default=None, metavar="HTML",
                   help="also write the HTML report (default name hwb-report.html)")
    p.add_argument("--route", default=None, metavar="STRATEGIES_TOML",
                   help="also compute the routing decisions of this strategies file into the results")
    p.add_argument("--use-cache", action="store_true",
                   help="reuse cached profiles for the same artifact, machine and scenario")
    p.add_argument("--cache-dir", default=None, help="artifact store root (default HWB_CACHE_DIR)")
    p.add_argument("--json", action="store_true", help="print the results JSON instead of the table")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..bench import ProfileCache, bench_model, parse

    scenarios = [parse(s) for s in (args.scenario or ["single-stream"])]
    if args.n:
        scenarios = [replace(s, n=args.n) if hasattr(s, "n") else s for s in scenarios]
    quiet = args.quiet or args.json
    res = bench_model(args.model, _csv(args.targets) or ["*"], _csv(args.precisions) or None,
                      scenarios, store=args.cache_dir, pin=parse_pin(args.pin),
                      progress=not quiet, cache=ProfileCache(), use_cache=args.use_cache,
                      say=(lambda m: None) if quiet else stderr_progress)
    if args.route and not res.interrupted:
        from ..router import Router
        router = Router.from_config(args.route, store=args.cache_dir, strict=False,
                                    progress=None if quiet else stderr_progress)
        res.routing = [d.to_dict() for d in router.decisions.values()]
    res.command = "hwb " + " ".join(sys.argv[1:])
    path = res.save(args.output)
    human = res.table() + f"\n\nresults: {path}"
    if args.report:
        from ..report import write_report
        out = write_report(res, args.report)
        human += f"\nreport:  {out}"
    emit(args, res.to_dict(), human)
    return 130 if res.interrupted else 0
