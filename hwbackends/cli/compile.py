"""``hwb compile MODEL --target T --precision P``: build (or load from the store) and check."""
from __future__ import annotations

import argparse
import json
from typing import Any

from . import emit, stderr_progress
from .source import add_source_args, model_from_args


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model file (.keras .h5 .json .onnx .pt2 .pt) or zoo:NAME")
    p.add_argument("--target", "-t", default="cpu.litert", help="target name (see hwb targets)")
    p.add_argument("--precision", "-p", default=None, help="precision (default: the target's first)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="compiled batch (default: the model's fixed batch if it has one, else 1)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="target-specific option (repeatable); VALUE parsed as JSON if it can be")
    p.add_argument("--cache-dir", default=None, help="artifact store root (default HWB_CACHE_DIR)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_source_args(p)


def parse_options(items: list[str]) -> dict[str, Any]:
    from ..errors import ConfigError

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"option {item!r} must be KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def compile_from_args(args: argparse.Namespace, **kw: Any) -> Any:
    from ..compiler import compile as hwb_compile

    return hwb_compile(model_from_args(args), args.target, args.precision, batch_size=args.batch_size,
                       threads=args.threads, options=parse_options(args.option),
                       store=args.cache_dir, progress=None if args.json else stderr_progress, **kw)


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile", help="compile a model for one target and precision")
    add_model_args(p)
    p.add_argument("--rebuild", action="store_true", help="ignore the cached artifact")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cm = compile_from_args(args, rebuild=args.rebuild)
    d = cm.describe()
    how = "cached" if d["cached"] else f"built in {d['compile_seconds']:.1f} s"
    human = (f"{d['model']} → {d['variant']} ({d['mode']}, {d['device']})\n"
             f"  artifact  {d['artifact_path']} ({d['artifact_bytes']:,} bytes, {how})\n"
             f"  fidelity  {cm.fidelity}")
    emit(args, d, human)
    return 0
