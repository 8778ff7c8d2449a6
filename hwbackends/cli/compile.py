"""``hwb compile MODEL --target T --precision P``: build (or load from the store) and check."""
from __future__ import annotations

import argparse
import json
from typing import Any

from ..units import MAX_BATCH
from . import (
    CACHE_DIR_HELP,
    EXIT_GATE,
    MAX_THREADS,
    check_precision_arg,
    count,
    emit,
    number,
    stderr_progress,
    usage_type,
)
from .source import add_source_args, calibration_from_args, model_from_args


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model file (.keras .h5 .json .onnx .pt2 .pt) or zoo:NAME")
    p.add_argument("--target", "-t", default="cpu.litert",
                   help="target name (see hwb targets; default %(default)s)")
    p.add_argument("--precision", "-p", default=None, help="precision (default: the target's first)")
    p.add_argument("--batch-size", type=count("batch size", 1, MAX_BATCH), default=None,
                   help="compiled batch (default: the model's fixed batch if it has one, else 1)")
    p.add_argument("--threads", type=count("thread count", 1, MAX_THREADS), default=None,
                   help="threads the runtime may use inside one call (default: 1, for batch-1 "
                        "latency)")
    p.add_argument("--option", "-O", action="append", default=[], metavar="KEY=VALUE",
                   type=usage_type(parse_option, "option"),
                   help="target-specific option (repeatable; see hwb targets -v); VALUE parsed "
                        "as JSON if it can be (default: none)")
    p.add_argument("--cache-dir", default=None, help=CACHE_DIR_HELP)
    p.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                   type=number(check_limit, "limit"),
                   help="raise (or lower) what a model may cost before it is refused: weights=8G, "
                        "activations=64M (per sample), macs=1e11 (per sample); 0 turns one off "
                        "(default: HWB_MAX_WEIGHTS/ACTIVATIONS/MACS, else 4G, 16M, 1e10)")
    p.add_argument("--output-kind", default=None,
                   choices=("signed", "regression", "probabilities", "logits"),
                   help="what the model's output is: decides the fidelity metrics gated (sign, "
                        "decision, or errors only) (default: inferred from the reference, and "
                        "printed as inferred)")
    p.add_argument("--json", action="store_true", help="machine-readable output (default: text)")
    add_source_args(p)


def check_limit(item: str) -> str:
    """``--limit NAME=VALUE`` checked when parsed (a bad one is a usage error), kept as text."""
    from ..cost import limits_from_items

    limits_from_items([item])
    return item


def parse_option(item: str) -> tuple[str, Any]:
    """``-O KEY=VALUE``: the key and the value, parsed as JSON where it is JSON (``synth=true``,
    ``clock_mhz=300``), else the text itself."""
    from ..errors import ConfigError

    k, eq, v = item.partition("=")
    if not eq or not k.strip():
        raise ConfigError(f"{item!r}: expected KEY=VALUE, e.g. -O synth=true")
    try:
        return k.strip(), json.loads(v)
    except ValueError:
        return k.strip(), v


def parse_options(items: list[Any]) -> dict[str, Any]:
    """The ``-O`` options as one dict (items parsed already by argparse, or ``KEY=VALUE`` text)."""
    return dict(parse_option(i) if isinstance(i, str) else i for i in items)


def compile_from_args(args: argparse.Namespace, **kw: Any) -> Any:
    """The compile the model options ask for (``add_model_args``), in a run context built
    here from ``--cache-dir`` (progress on stderr unless ``--json``); ``kw`` goes to
    :func:`hwbackends.compile` (``fidelity=False``, ``rebuild=``…)."""
    from ..compiler import compile as hwb_compile
    from ..context import RunContext
    from ..cost import export_limits, limits_from_items

    check_precision_arg(args.target, args.precision)
    if args.limit:  # this command's loads and its compile worker all read them
        export_limits(limits_from_items(args.limit))
    model = model_from_args(args)
    return hwb_compile(model, args.target, args.precision, batch_size=args.batch_size,
                       threads=args.threads, options=parse_options(args.option),
                       calibration_data=calibration_from_args(args, model),
                       context=RunContext.at(args.cache_dir,
                                             progress=None if args.json else stderr_progress),
                       output_kind=getattr(args, "output_kind", None), **kw)


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile", help="compile a model for one target and precision")
    add_model_args(p)
    p.add_argument("--rebuild", action="store_true",
                   help="build again even when the store holds the artifact (default: reuse it)")
    p.set_defaults(func=run)


def summary_lines(d: dict[str, Any]) -> list[str]:
    """The target's own lines about this variant's build (``Target.summary_lines`` of the
    artifact metadata: an FPGA target's modelled estimate, synthesis, bits). The core reads no
    plugin's metadata keys itself; a target not registered here prints none, and a plugin
    whose hook raises or returns something else is named in one line instead."""
    from ..registry import get_registry

    tgt = get_registry().targets.get(str(d.get("target", "")))
    if tgt is None:
        return []
    try:
        lines = tgt.summary_lines(d.get("meta") or {})
    except Exception as exc:  # the build succeeded: say the plugin's bug, do not lose the rest
        return [f"  ({tgt.name}.summary_lines raised {type(exc).__name__}: {exc}; a plugin bug)"]
    if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
        return [f"  ({tgt.name}.summary_lines returned {type(lines).__name__}, not a list of str; "
                f"a plugin bug)"]
    return lines


def run(args: argparse.Namespace) -> int:
    from ..compiler import fidelity_gate
    from ..samples import describe as describe_data

    # ungated: this command prints a failed gate with the figures and exits 3
    cm = compile_from_args(args, rebuild=args.rebuild, gate=False)
    d = cm.describe()
    gate = fidelity_gate(cm)
    d["fidelity_gate"] = gate
    how = "cached" if d["cached"] else f"built in {d['compile_seconds']:.1f} s"
    lines = [f"{d['model']} → {d['variant']} ({d['mode']}, {d['device']})",
             f"  artifact  {d['artifact_path']} ({d['artifact_bytes']:,} bytes, {how})",
             f"  fidelity  {cm.fidelity}"]
    if cm.fidelity is not None:
        from ..fidelity import describe_kind
        lines.append(f"  output    {describe_kind(cm.fidelity)}")
    if cm.data:
        lines.append(f"  data      {describe_data(cm.data)}")
    if gate and not gate["passed"]:
        lines.append(f"  ! FIDELITY GATE FAILED ({gate['family']} precision): "
                     + "; ".join(gate["violations"]))
    lines += summary_lines(d)
    emit(args, d, "\n".join(lines))
    return EXIT_GATE if gate and not gate["passed"] else 0
