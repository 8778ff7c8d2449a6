"""``hwb fleet MODEL --fleet ADDRESS|local``: ``hwb bench`` on every node of a Ray cluster,
each variant compiled and measured on the node that holds its target; one results file."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..units import parse_seconds
from . import emit, number, stderr_progress
from .bench import add_measure_options, csv_list
from .source import add_source_args, model_from_args, portable_model_file


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fleet", help="measure a model on every machine of a Ray cluster (or --fleet local)")
    p.add_argument("model", help="model file (.keras .onnx .pt2 …, shipped to the nodes) or zoo:NAME")
    p.add_argument("--fleet", required=True, metavar="ADDRESS|local",
                   help="Ray cluster address (host:port, ray://…), or 'local' for an embedded Ray "
                        "on this machine (run in a loopback-only network namespace)")
    add_measure_options(p, where=" on each node", default_output="hwb-fleet.json",
                        targets_default="all the fleet advertises")
    p.add_argument("--route", default=None, metavar="STRATEGIES_TOML",
                   help="also compute placement advice (per machine) for this strategies file "
                        "(default: none)")
    p.add_argument("--cache-dir", default=None,
                   help="artifact store root on every node (default: each node's HWB_CACHE_DIR)")
    p.add_argument("--task-timeout", type=number(parse_seconds, "timeout"), default=1800.0,
                   help="seconds a variant may take on its node before it is marked failed "
                        "(node busy or hung; default %(default)g)")
    p.add_argument("--no-share-artifacts", action="store_true",
                   help="compile on every node even when another node with the same toolchain "
                        "already built the variant")
    p.add_argument("--no-netns", action="store_true",
                   help="with --fleet local: do not enter a loopback-only network namespace "
                        "(Ray then also listens on the host's external interfaces)")
    p.add_argument("--json", action="store_true", help="print the results JSON instead of the table")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    add_source_args(p)
    p.set_defaults(func=run)


def _isolate_local(args: argparse.Namespace) -> None:
    """The embedded Ray binds every interface; run this command again inside a loopback-only
    network namespace (exec: does not return) unless already there or told not to."""
    from ..errors import HwbError
    from ..fleet import netns

    if args.fleet != "local" or args.no_netns or netns.loopback_only():
        return
    if os.environ.get(netns.ENV_FLAG):
        raise HwbError("entered a network namespace but it is not loopback-only; refusing to "
                       "start Ray (it would listen on external interfaces)")
    netns.reexec_hwb(getattr(args, "argv", None) or sys.argv[1:])
    raise HwbError("--fleet local needs a loopback-only network namespace (Ray binds the "
                   "host's external interfaces otherwise) and `unshare -n` / `unshare -rn` is "
                   "refused here; allow user namespaces, run as root, or pass --no-netns to "
                   "accept external listening sockets")


def run(args: argparse.Namespace) -> int:
    import tempfile

    _isolate_local(args)
    # A model that needs a loading option is loaded here and shipped re-saved as one file;
    # the data files are read and checked here and shipped as arrays.
    with tempfile.TemporaryDirectory(prefix="hwb-fleet-model-") as tmp:
        model = portable_model_file(args, Path(tmp))
        return _run(args, model, data_payload(args))


def data_payload(args: argparse.Namespace) -> dict | None:
    """``--calibration-data`` / ``--validation-data`` as ``run_fleet(data=)`` takes them."""
    if not (args.calibration_data or args.validation_data):
        return None
    from ..models import load_model
    from ..samples import read_samples

    m = load_model(model_from_args(args))
    out = {}
    for key, path in (("calibration", args.calibration_data), ("validation", args.validation_data)):
        if path:
            s = read_samples(path, m.inputs, f"--{key}-data")
            out[key] = {"arrays": list(s.arrays) if isinstance(s.arrays, tuple) else s.arrays,
                        "source": s.source.to_dict()}
    return out


def _run(args: argparse.Namespace, model: str, data: dict | None = None) -> int:
    from ..context import RunContext
    from ..context import quiet as quiet_progress
    from ..fleet import run_fleet

    quiet = args.quiet or args.json
    ctx = RunContext.at(args.cache_dir, progress=quiet_progress if quiet else stderr_progress)
    res = run_fleet(model, args.fleet, csv_list(args.targets) or ["*"], csv_list(args.precisions) or None,
                    args.scenario or ["single-stream"], n=args.n, pin=args.pin,
                    reuse_profiles=args.use_cache, task_timeout=args.task_timeout,
                    share_artifacts=not args.no_share_artifacts, cache_dir=args.cache_dir,
                    context=ctx, allow_external=args.no_netns, data=data)
    if args.route and not res.interrupted:
        from ..fleet.placement import place
        res.fleet["placement"] = place(res, args.route, ctx.registry)
    res.command = "hwb " + " ".join(sys.argv[1:])
    path = res.save(args.output)
    failed = [v for v in res.variants if v.error]
    human = (res.table() + f"\n\n{len({p.machine.get('node_id') for p in res.profiles})} machine(s), "
             f"{len(res.profiles)} profile(s), {len(failed)} failed row(s)"
             + "".join(f"\n  FAILED {v.variant}: {v.error}" for v in failed)
             + f"\nresults: {path}")
    if args.report:
        from ..report import write_report
        human += f"\nreport:  {write_report(res, args.report, registry=ctx.registry)}"
    emit(args, res.to_dict(), human)
    return 130 if res.interrupted else 0
