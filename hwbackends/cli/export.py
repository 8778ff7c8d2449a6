"""``hwb export MODEL -t VARIANT --format triton|tf-serving [--results R.json] -o DIR``: the
variant as a Triton model repository or a TF Serving model, batching and instances set from
its measurements (measured here first without ``--results``) (hwbackends/export, docs/export.md); other formats from the variant's target
(``Target.exports``)."""
from __future__ import annotations

import argparse
import shlex

from ..labels import parse_label
from ..units import MAX_BATCH
from . import CACHE_DIR_HELP, MAX_THREADS, check_precision_arg, count, emit, stderr_progress
from .source import add_source_args, model_from_args


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a measured variant as a Triton model repository, "
                                      "a TF Serving model, or a target's own format")
    p.add_argument("model", help="model file (.keras .h5 .json .onnx .pt2 .pt) or zoo:NAME")
    p.add_argument("--target", "-t", required=True, metavar="TARGET[:PRECISION]",
                   help="the variant: cpu.onnxruntime, cpu.litert:int8, …")
    p.add_argument("--precision", "-p", default=None,
                   help="precision (default: after the ':' in --target, else the target's first)")
    p.add_argument("--format", "-f", dest="fmt", required=True,
                   help="triton, tf-serving, or a format the target exports (hwb targets -v)")
    p.add_argument("--results", "-r", default=None, metavar="R.json",
                   help="hwb bench / hwb fleet results with the variant's batch sweep for "
                        "triton and tf-serving (default: measure batch sizes 1/8/32 first, "
                        "with progress)")
    p.add_argument("--config", default=None, metavar="STRATEGIES.toml",
                   help="strategies file whose --strategy gives the deadline (default: none: "
                        "no queue timeout, queue delay = one batch-1 p99)")
    p.add_argument("--strategy", default=None, help="strategy in --config (default: none)")
    p.add_argument("--machine", default=None,
                   help="machine of a fleet results file for config.pbtxt (default: the first "
                        "by name; every machine gets configs/<machine>.pbtxt)")
    p.add_argument("--max-batch-size", type=count("batch size", 1, MAX_BATCH), default=None,
                   help="cap (default: the largest measured size that meets the deadline)")
    p.add_argument("--threads", type=count("thread count", 1, MAX_THREADS), default=1,
                   help="intra-op threads per instance")
    p.add_argument("--instances", type=count("instance count", 1, MAX_THREADS), default=None,
                   help="model instances (default: usable cores // --threads)")
    p.add_argument("--flavour", choices=("native", "python"), default=None,
                   help="Triton backend: native (onnxruntime, tensorrt_plan) or python "
                        "(model.py runs the artifact) (default: native where Triton has one)")
    p.add_argument("--trt-version-compatible", action="store_true",
                   help="require a VERSION_COMPATIBLE TensorRT engine (refused otherwise)")
    p.add_argument("--name", default=None, help="model name in the repository (default: the "
                                                "model's name)")
    p.add_argument("--output", "-o", "--out", dest="out", required=True, metavar="DIR",
                   help="output directory: created, or yours and not writable by others; no "
                        "link in it is followed")
    p.add_argument("--replace", action="store_true",
                   help="replace the model directory even when it holds other model versions "
                        "or files this export does not write (default: refuse)")
    p.add_argument("--cache-dir", default=None, help=CACHE_DIR_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output (default: text)")
    add_source_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..context import RunContext, quiet
    from ..export import export

    target, prec, push = parse_label(args.target)
    if push:
        from ..errors import UnsupportedError
        raise UnsupportedError(f"hwb export takes TARGET[:PRECISION]; {args.target!r} names a "
                               f"sliding push form (+push={push}), which an export does not "
                               f"carry: export {target}:{prec}")
    check_precision_arg(target, args.precision or prec or None)
    res = export(model_from_args(args), target, args.fmt, args.out,
                 precision=args.precision or prec or None, results=args.results,
                 config=args.config, strategy=args.strategy, machine=args.machine,
                 max_batch_size=args.max_batch_size, threads=args.threads,
                 instances=args.instances, flavour=args.flavour, name=args.name,
                 version_compatible=args.trt_version_compatible, replace=args.replace,
                 context=RunContext.at(args.cache_dir,
                                       progress=quiet if args.json else stderr_progress),
                 command="hwb " + shlex.join(getattr(args, "argv", []) or []),
                 bars=not args.json)
    lines = [f"{res.format} export of {args.model} ({target}) in {res.directory}"]
    for machine, s in res.settings.items():
        lines.append(f"  {machine}: max_batch_size {s.max_batch_size}, preferred "
                     f"{list(s.preferred) or 'none'}, queue delay {s.queue_delay_us} µs, timeout "
                     f"{s.timeout_us if s.timeout_us is not None else 'none'}, "
                     f"{s.instances} instance(s) × {s.threads} thread(s)")
        lines += [f"    {w}" for w in s.why]
    lines += [f"  {n}" for n in res.notes]
    lines += [f"  served name {n}" for n in res.names]
    lines += [f"  wrote {f}" for f in res.files]
    emit(args, res.to_dict(), "\n".join(lines))
    return 0
