"""``hwb demo`` (what ``make demo`` runs): the main job on the bundled signal model.

every registered target × precision → compile (cached) → fidelity → bench (single-stream,
server, burst; batch sweep and offered-load sweep on the hardware fp32 variants) → routing
table for the example tiers (examples/strategies.toml) → results JSON + HTML report; and the
sliding window: the zoo LSTM on cpu.native, one tick in and the answer out, beside the full
window, then under load over 1 … 24 windows (a short bounded run, :func:`sliding_figure`, in
the results and the report as well).
Sized to finish in a few minutes on a 2-core machine (less once the artifacts are cached).
Slow builds (``Target.slow_compile``: ``fpga.da4ml``'s Verilator build and yosys synthesis
take minutes) are listed, not built, unless ``--targets`` names them (``--targets '*,fpga.*'``
or ``fpga.da4ml``); then the report's FPGA section shows its modelled cycles, ns and
resources. The routing never builds what its strategies could not choose (an emulated target
where emulated latencies are not ranked).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import CACHE_DIR_HELP, emit, positive_int, stderr_progress, usage_type
from .bench import routing_rows
from .source import add_data_args, calibration_from_args, model_from_args

if TYPE_CHECKING:  # pragma: no cover
    from ..context import RunContext

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "strategies.toml"


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the bundled signal model on every target: bench, fidelity, "
                                    "routing, report")
    p.add_argument("--model", default="zoo:signal", help="model (default: zoo:signal)")
    p.add_argument("--config", default=str(EXAMPLE), help="strategies file for the routing table "
                                                          "(default: examples/strategies.toml)")
    p.add_argument("--output-dir", "-o", "--out-dir", dest="out_dir", default="hwb-demo",
                   help="where results.json and report.html go (default: %(default)s)")
    p.add_argument("--n", type=usage_type(positive_int, "count"), default=2000,
                   help="timed calls per server run (default: %(default)s; single-stream uses the "
                        "strategies file's router.bench.n)")
    p.add_argument("--quick", action="store_true",
                   help="fewer calls, shorter trace, no sweeps (default: the full run)")
    p.add_argument("--targets", default="*",
                   help="target globs, comma-separated (default: every target except slow builds "
                        "such as fpga.da4ml, which a pattern naming them adds: '*,fpga.*')")
    p.add_argument("--cache-dir", default=None, help=CACHE_DIR_HELP)
    p.add_argument("--json", action="store_true",
                   help="print the routing decisions as JSON (default: text)")
    add_data_args(p, where="; used for the bench and replaces every strategy's own")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench import Batch, Burst, ProfileCache, Server, SingleStream, bench_model
    from ..config import load_config
    from ..context import RunContext, quiet
    from ..machine import describe
    from ..report import write_report
    from ..router import Router

    t_start = time.monotonic()
    say = quiet if args.json else stderr_progress
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ctx = RunContext.at(args.cache_dir, progress=say, profiles=ProfileCache())
    cfg = load_config(args.config, ctx.registry)  # fail early on a bad config, before any measuring
    n = 300 if args.quick else args.n
    # The router measures its candidates again, interleaved (plan.py); the report shows both:
    # this single-stream run per variant and the router's own profile per candidate.
    single = SingleStream(n=cfg.router.bench.n if not args.quick else n,
                          warmup=cfg.router.bench.warmup, max_s=cfg.router.bench.max_s)
    scenarios = [single, Server(rate_hz=2000, n=n, max_s=3.0),
                 Burst(duration_s=0.5 if args.quick else 2.0, seed=0, max_s=4.0)]
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    say(f"machine: {describe()}")
    model = model_from_args(args)
    calib = calibration_from_args(args, model)
    res = bench_model(model, targets, None, scenarios, context=ctx, bars=not args.json,
                      max_ref_s=1.5, calibration_data=calib)
    if not args.quick and not res.interrupted:
        hw = sorted({(p.target, p.precision) for p in res.profiles
                     if p.mode == "hardware" and p.precision == "fp32" and p.target != "ref"})
        for tgt, _ in hw:
            say(f"batch sweep and offered-load sweep on {tgt}:fp32")
            bench_model(model, [tgt], ["fp32"],
                        [Batch(sizes=(1, 8, 32), n=1000, max_s=2.0)]
                        + [Server(rate_hz=r, n=n, max_s=2.0) for r in (500, 5000, 20000)],
                        context=ctx, results=res, calibration_data=calib)
            # bench_model re-appends the variant and availability rows: keep the first of each
            res.variants = _dedupe(res.variants, lambda v: (v.variant, v.batch_size, v.error))
            res.availability = _dedupe(res.availability, lambda a: a["target"])
    sliding = None if res.interrupted else sliding_figure(ctx, args.quick)
    if sliding is not None and sliding["profile"] is not None:
        # into the results and the report too: its params name its model (zoo:lstm), so
        # neither a comparison nor a routing of this run's model takes it for that model's
        from ..bench import LatencyProfile
        res.profiles.append(LatencyProfile.from_dict(sliding["profile"]))
    router = None
    if not res.interrupted:
        say(f"routing the strategies of {args.config}")
        cfg_model = {s.model for s in cfg.strategies.values()}
        router = Router.from_config(args.config, context=ctx, strict=False,
                                    calibration_data=args.calibration_data,
                                    validation_data=args.validation_data)
        res.routing = routing_rows(res, cfg, list(router.decisions.values()))
        if cfg_model != {args.model}:
            say(f"note: the strategies use {', '.join(sorted(cfg_model))}; the bench used {args.model}")
    res.command = "hwb " + " ".join(sys.argv[1:]) if sys.argv[1:] else "hwb demo"
    rpath = res.save(out / "results.json")
    html = write_report(res, out / "report.html", registry=ctx.registry)
    took = time.monotonic() - t_start
    lines = [res.table(), ""]
    if router is not None:
        lines += ["routing (examples: " + Path(args.config).name + "):"]
        for d in router.decisions.values():
            c = d.chosen
            lines.append(f"  {d.strategy:<16} tier {d.tier:<9} p99 ≤ {d.budget_us:>6g} µs → "
                         + (f"{c.variant} ({c.mode}, p99 {c.p99_us:.2f} µs)" if c else "none")
                         + ("" if d.meets_budget else "   ! " + d.note))
        lines.append("  (hwb route " + args.config + " --explain: every candidate and why)")
    if sliding is not None:
        lines += ["", sliding["line"]]
    if res.data:
        from ..samples import describe as describe_data
        lines += [f"fidelity {describe_data(res.data)}"]
    skipped = [a["target"] for a in res.availability if a.get("skipped")]
    if skipped:
        lines += [f"not built (slow; --targets '*,{skipped[0]}' adds it): {', '.join(skipped)}"]
    lines += ["", f"results: {rpath.resolve()}", f"report:  {html}", f"took {took:.0f} s"]
    emit(args, {"results": str(rpath.resolve()), "report": str(html),
                "routing": res.routing, "sliding": sliding, "seconds": took}, "\n".join(lines))
    return 130 if res.interrupted else 0


#: The sliding figure's model and target (the issue's: the zoo LSTM, cpu.native's exact form).
SLIDING_MODEL, SLIDING_TARGET = "zoo:lstm", "cpu.native"


def sliding_figure(ctx: "RunContext", quick: bool) -> dict[str, Any]:
    """The demo's sliding figures: ``zoo:lstm`` on cpu.native in the sliding scenario (push
    timed, the prepare apart, the full window interleaved; then the load sweep over NMI 1 … 24
    and offered tick rates; at most 2 s each), as ``{"line", "profile"}`` (the profile's
    ``params["model"]`` names zoo:lstm; the demo adds it to its results and report);
    a line saying why when cpu.native cannot run here or the build fails."""
    from ..bench import Sliding, measure
    from ..bench.profile import load_lines
    from ..bench.scenarios import NMI_SWEEP
    from ..compiler import compile as hwb_compile
    from ..context import quiet
    from ..errors import HwbError
    from ..registry import safe_probe

    head = f"sliding window, {SLIDING_MODEL} on {SLIDING_TARGET}"
    tgt = ctx.registry.targets.get(SLIDING_TARGET)
    av = safe_probe(tgt) if tgt is not None else None
    if av is None or not av.usable:
        why = av.reason if av is not None else "not registered"
        return {"line": f"{head}: not measured ({SLIDING_TARGET} unavailable: {why})",
                "profile": None}
    ctx.progress(f"{head}: one tick at a time")
    try:
        cm = hwb_compile(SLIDING_MODEL, SLIDING_TARGET, "fp32", context=ctx)
        # the STAC-ML sweep (NMI 1 … 24) over offered tick rates; --quick: one window
        prof = measure(cm, Sliding(n=500 if quick else 5000, warmup=100, max_s=2.0, rounds=5,
                                   streams=(1,) if quick else NMI_SWEEP,
                                   ticks=200 if quick else 1000),
                       bars=ctx.progress is not quiet)
    except HwbError as exc:
        return {"line": f"{head}: not measured ({type(exc).__name__}: {exc})", "profile": None}
    prof.params["model"] = SLIDING_MODEL
    sl = prof.sliding or {}
    full, prep = sl.get("full") or {}, sl.get("prepare") or {}
    line = (f"{head}: push p50 {prof.p50_us:.2f} µs / p99 {prof.p99_us:.2f} µs vs full window "
            f"{full.get('p50_us', float('nan')):.2f} µs ({sl.get('form')}; prepare p50 "
            f"{prep.get('p50_us', float('nan')):.2f} µs apart, n={prof.n})")
    line = "\n".join([line] + [f"  {x}" for x in load_lines(prof)])
    return {"line": line, "profile": prof.to_dict()}


def _dedupe(rows: list[Any], key: Callable[[Any], Any]) -> list[Any]:
    seen, outl = set(), []
    for r in rows:
        k = key(r)
        if k not in seen:
            seen.add(k)
            outl.append(r)
    return outl
