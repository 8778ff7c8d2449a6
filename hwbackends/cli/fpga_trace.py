"""``hwb fpga-trace MODEL [-p PRECISION]``: where an fpga.hls4ml design loses precision.

Compiles (or loads) the variant, then compares every layer's fixed-point output (hls4ml's
trace of the C-simulation) with the same layer of the Keras model. Owned by the fpga.hls4ml
plugin (plugins/fpga_hls4ml/trace.py); this module is only its command line.
"""
from __future__ import annotations

import argparse

from . import emit
from .compile import add_model_args, compile_from_args
from .source import model_from_args


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fpga-trace", help="per-layer error of an fpga.hls4ml design vs the Keras model")
    add_model_args(p)
    p.set_defaults(target="fpga.hls4ml")
    p.add_argument("-n", "--samples", type=int, default=128, help="validation samples to trace")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import UnsupportedError
    from ..models import load_model

    if args.target != "fpga.hls4ml":
        raise UnsupportedError(f"fpga-trace traces fpga.hls4ml designs; got --target {args.target}")
    from hwb_plugins.fpga_hls4ml.trace import trace_layers

    cm = compile_from_args(args, fidelity=False)
    m = load_model(model_from_args(args))
    rows = trace_layers(m, cm, m.representative(args.samples, seed=7))
    human = "\n".join([f"{cm.variant} on {m.name} ({cm.mode.value}: C-simulation), "
                       f"{args.samples} samples"] + [str(r) for r in rows])
    emit(args, {"variant": cm.variant, "layers": [r.to_dict() for r in rows]}, human)
    return 0
