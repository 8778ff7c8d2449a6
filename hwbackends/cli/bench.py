"""``hwb bench MODEL``: compile on every allowed target × precision, measure each variant in
the chosen scenarios, write the results JSON (and optionally the HTML report)."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import CACHE_DIR_HELP, emit, number, positive_int, split_list, stderr_progress, usage_type
from .compile import parse_option, parse_options
from .source import add_source_args, calibration_from_args, model_from_args

if TYPE_CHECKING:  # pragma: no cover
    from ..bench import BenchResults
    from ..config import StrategiesFile
    from ..registry import Registry


#: ``-t a,b -t c`` as one list (a comma inside ``<...>`` stays: ``-p 'ap_fixed<16,6>'``).
csv_list = split_list


#: The highest CPU number a pin names (Linux's default NR_CPUS ceiling).
MAX_CPU = 8191


def parse_pin(spec: str | None) -> list[int] | None:
    """``--pin``: CPU numbers 0..:data:`MAX_CPU`, ``0`` or ``0,1`` or ``2-3``
    (``None``/empty: not pinned)."""
    from ..errors import ConfigError
    from ..units import parse_count

    if not spec:
        return None
    cpus: list[int] = []
    try:
        for part in spec.split(","):
            a, dash, b = part.partition("-")
            lo = parse_count(a, 0, MAX_CPU, "a CPU number")
            hi = parse_count(b, 0, MAX_CPU, "a CPU number") if dash else lo
            if hi < lo:
                raise ValueError(part)
            cpus += list(range(lo, hi + 1))
    except ValueError:
        raise ConfigError(f"{spec[:40]!r}: expected CPU numbers like 0 or 0,1 or 2-3 (each "
                          f"0..{MAX_CPU})") from None
    return cpus


def check_scenario(spec: str) -> str:
    """``-s SPEC`` checked when parsed (a bad one is a usage error), kept as its text; a
    ``trace=FILE`` must be a regular file of bounded size (read here, never blocking)."""
    from ..bench import parse
    from ..bench.scenarios import read_trace

    s = parse(spec)
    if getattr(s, "trace", None):
        read_trace(s.trace)
    return spec


def add_measure_options(p: argparse.ArgumentParser, *, where: str, default_output: str,
                        targets_default: str) -> None:
    """The options ``hwb bench`` and ``hwb fleet`` share: what to measure, how, and where the
    results go. ``where`` says where the measuring happens ("" here, " on each node")."""
    p.add_argument("--targets", "-t", action="append", default=None, metavar="GLOB[,GLOB]",
                   help=f"targets to measure (globs, e.g. 'cpu.*'); default: {targets_default}")
    p.add_argument("--precisions", "-p", action="append", default=None, metavar="P[,P]",
                   help="precisions (default: every precision each target offers)")
    p.add_argument("--scenario", "-s", action="append", default=None, metavar="SPEC",
                   type=usage_type(check_scenario, "scenario"),
                   help="single-stream | server[:rate_hz=R,n=N] | burst[:trace=FILE,unit=ms] | "
                        "batch[:sizes=1/8/32] | sliding[:n=N,rounds=R,streams=1/2/4/8/24,"
                        "rate=R,budget_us=B] (a windowed model, one tick at a time: push, "
                        "prepare apart, the full window beside it; then per count of windows, "
                        "closed and Poisson open loops at offered tick rates and the knee); "
                        "repeatable (default: single-stream)")
    p.add_argument("--n", type=usage_type(positive_int, "count"), default=None,
                   help="timed calls per single-stream/server/batch run (default: each "
                        "scenario's own, 2000 for single-stream)")
    p.add_argument("--pin", default=None, metavar="CPUS", type=number(parse_pin, "pin"),
                   help=f"pin the measuring thread{where}, e.g. 1 or 0-1 (default: not pinned)")
    p.add_argument("--output", "-o", default=default_output, help="results JSON (default %(default)s)")
    p.add_argument("--report", nargs="?", const="hwb-report.html", default=None, metavar="HTML",
                   help="also write the HTML report (default: none; name without a value: "
                        "hwb-report.html)")
    p.add_argument("--use-cache", action="store_true",
                   help=f"reuse cached profiles{where} for the same artifact, machine and scenario "
                        f"(default: measure again)")


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure a model's variants: single-stream, server, burst, batch")
    p.add_argument("model", help="model file (.keras .onnx .pt2 …) or zoo:NAME")
    add_measure_options(p, where="", default_output="hwb-results.json",
                        targets_default="every registered target except slow builds "
                                        "(fpga.da4ml: minutes), which only a pattern naming "
                                        "them includes")
    p.add_argument("--route", default=None, metavar="STRATEGIES_TOML",
                   help="also route the strategies of this file from the variants and "
                        "profiles just measured (nothing is compiled or measured again) into "
                        "the results (default: none)")
    p.add_argument("--option", "-O", action="append", default=[], metavar="KEY=VALUE",
                   type=usage_type(parse_option, "option"),
                   help="target-specific compile option for every variant built, as hwb "
                        "compile's (e.g. -t cpu.native -p fp32 -O push_weights=int8: the row is "
                        "cpu.native:fp32+push=int8); a target that refuses it is a failed row "
                        "(default: none)")
    p.add_argument("--cache-dir", default=None, help=CACHE_DIR_HELP)
    p.add_argument("--json", action="store_true",
                   help="print the results JSON instead of the table (default: the table)")
    p.add_argument("--csv", action="store_true",
                   help="print the table as CSV (p50/p90/p95/p99/p99.9 per profile); the notes "
                        "go to stderr (default: the table)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress on stderr (default: progress)")
    add_source_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..bench import BenchResults, ProfileCache, bench_model, parse
    from ..context import RunContext
    from ..context import quiet as quiet_progress

    scenarios = [parse(s) for s in (args.scenario or ["single-stream"])]
    if args.n:
        scenarios = [replace(s, n=args.n) if hasattr(s, "n") else s for s in scenarios]
    quiet = args.quiet or args.json
    ctx = RunContext.at(args.cache_dir, progress=quiet_progress if quiet else stderr_progress,
                        profiles=ProfileCache())
    # Filled in place by bench_model: once the model is loaded (res.model set), the results
    # file is written however the run ends — done, Ctrl-C, or an error.
    res = BenchResults(model={}, machine={})
    res.command = "hwb " + " ".join(sys.argv[1:])
    cfg = None
    if args.route:  # a bad strategies file is refused before minutes of measuring
        from ..config import load_config
        cfg = load_config(args.route, ctx.registry)
    try:
        model = model_from_args(args)
        bench_model(model, csv_list(args.targets) or ["*"], csv_list(args.precisions) or None,
                    scenarios, context=ctx, pin=args.pin, bars=not quiet,
                    reuse_profiles=args.use_cache, results=res,
                    calibration_data=calibration_from_args(args, model),
                    options=parse_options(args.option) or None)
        if cfg is not None and not res.interrupted:
            res.routing = route_measured(res, cfg, ctx.registry)
    except BaseException:
        if res.model:
            res.interrupted = True
            path = save_uninterrupted(res, args.output)
            print(f"hwb bench: stopped early; partial results: {path}", file=sys.stderr)
        raise
    path = save_uninterrupted(res, args.output)
    human = f"results: {path}"
    if res.data:
        from ..samples import describe as describe_data
        human += f"\nfidelity {describe_data(res.data)}"
    flat = [v.variant for v in res.variants if v.fidelity and v.fidelity.degenerate]
    if flat:
        from ..fidelity import DEGENERATE_ADVICE
        human += f"\nWARNING: degenerate fidelity for {', '.join(flat)}: {DEGENERATE_ADVICE}"
    if args.report:
        from ..report import write_report
        out = write_report(res, args.report, registry=ctx.registry)
        human += f"\nreport:  {out}"
    if args.csv:
        print(res.table_csv(), end="")
        print(human, file=sys.stderr)
    else:
        emit(args, res.to_dict(), res.table() + "\n\n" + human)
    if res.interrupted:
        return 130
    if not res.profiles:  # nothing measurable: say why, and fail (a script must notice)
        print("hwb bench: nothing was measured: " + nothing_measured(res), file=sys.stderr)
        return 1
    return 0


def route_measured(res: "BenchResults", cfg: "StrategiesFile", reg: "Registry") -> list[dict[str, Any]]:
    """The routing of ``cfg``'s strategies from ``res`` itself: the router's policy on the
    variant records and single-stream profiles this run wrote, so the routing in the results
    file is the one its own profiles imply (a re-measure would disagree with them)."""
    from ..router.plan import decide_from_results

    return routing_rows(res, cfg, [decide_from_results(res, name, s, cfg, reg)
                                   for name, s in cfg.strategies.items()])


def routing_rows(res: "BenchResults", cfg: "StrategiesFile", decisions: list[Any]) -> list[dict[str, Any]]:
    """The decisions as the results file keeps them, each with its strategy's ``model`` and
    whether this run measured that model (``model_in_run``): the report counts a strategy of
    another model apart, not as one of this run's strategies over budget."""
    from ..router.plan import unmeasured_model

    rows = []
    for d in decisions:
        s = cfg.strategies[d.strategy]
        rows.append(d.to_dict() | {"model": s.model, "model_in_run": not unmeasured_model(s, res)})
    return rows


def nothing_measured(res: "BenchResults") -> str:
    """Why a run produced no profile: each target's reason (unavailable, skipped, failed)."""
    why = []
    for a in res.availability:
        if a.get("mode") == "unavailable":
            why.append(f"{a['target']} unavailable ({a.get('reason', '')})")
        elif a.get("skipped"):
            why.append(f"{a['target']} {a['skipped']}")
    why += [f"{v.variant} failed ({v.error})" for v in res.variants if v.error]
    return "; ".join(why) or "no variant matched the targets and precisions given"


def save_uninterrupted(res: "BenchResults", path: str) -> Path:
    """Write the results file with SIGINT held back, so a second Ctrl-C cannot cut it short
    (the file is replaced atomically either way; this makes sure it is written)."""
    block = threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask")
    if block:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return res.save(path)
    finally:
        if block:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
