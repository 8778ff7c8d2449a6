"""``hwb fpga-trace MODEL [-p PRECISION]``: where an fpga.hls4ml design loses precision;
``hwb fpga-adopt BOARD FINGERPRINT``: sign a bitstream entry hwb did not write
(:mod:`.bitstreams`).

Compiles (or loads) the variant, then compares every layer's fixed-point output (hls4ml's
trace of the C-simulation, :mod:`.trace`) with the same layer of the Keras model. The
plugin adds the command through the ``hwb_cli_commands`` hook, so it is ``hwb fpga-trace``
for users while the core's command line names no plugin. Only the standard library and the
core's light CLI helpers are imported here: ``hwb`` builds this parser on every call.
"""
from __future__ import annotations

import argparse

from hwbackends.contract.cli import add_model_args, compile_from_args, count, emit, model_from_args

from .target import Hls4mlTarget

TARGET = Hls4mlTarget.name


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fpga-trace", help=f"per-layer error of an {TARGET} design vs the Keras model")
    add_model_args(p)
    p.set_defaults(target=TARGET)
    p.add_argument("-n", "--samples", type=count("sample count", 1, 1 << 16), default=128, help="validation samples to trace")
    p.set_defaults(func=run)
    a = sub.add_parser("fpga-adopt", help="sign a bitstream entry hwb did not write, so "
                       f"{TARGET} may program the board with it")
    a.add_argument("board", help="the board directory (PYNQ's BOARD, e.g. Pynq-Z2)")
    a.add_argument("fingerprint", help="the model fingerprint the entry implements")
    a.set_defaults(func=adopt)


def run(args: argparse.Namespace) -> int:
    from hwbackends.contract import UnsupportedError, load_model

    from .trace import trace_layers

    if args.target != TARGET:
        raise UnsupportedError(f"fpga-trace traces {TARGET} designs; got --target {args.target}: "
                               f"leave --target out")
    cm = compile_from_args(args, fidelity=False)
    m = load_model(model_from_args(args))
    rows = trace_layers(m, cm, m.representative(args.samples, seed=7))
    human = "\n".join([f"{cm.variant} on {m.name} ({cm.mode.value}: C-simulation), "
                       f"{args.samples} samples"] + [str(r) for r in rows])
    emit(args, {"variant": cm.variant, "layers": [r.to_dict() for r in rows]}, human)
    return 0


def adopt(args: argparse.Namespace) -> int:
    """``hwb fpga-adopt BOARD FINGERPRINT``: :meth:`BitstreamStore.adopt` (the store at
    ``HWB_BITSTREAMS``, default the repository's ``bitstreams/``)."""
    from .bitstreams import BitstreamStore

    e = BitstreamStore().adopt(args.board, args.fingerprint)
    print(f"adopted {e.path} (board {e.board}, part {e.manifest.get('part')}, built "
          f"{e.manifest.get('build_date')}): {TARGET} may now program the board with it")
    return 0
