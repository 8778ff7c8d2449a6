"""da4ml's bit-exact interpreter, and the one construct da4ml 0.6 gets wrong.

da4ml 0.6 shifts left by a *negative* count in a mux whose result has fewer fractional bits
than the operand it selects: ``DAISInterpreter::msb_mux`` in its C++ interpreter
(``CombLogic.predict``; undefined behaviour, seen returning half the value) and the Verilog
it generates for the same op (seen returning another wrong value). The tracer emits such muxes
in saturating quantizations of values that carry a power-of-two scale, depending on the
widths (the 16→64→32→32→5 jet tagger: at 12 and 15–20 fractional bits, not at 9–11, 13, 14):
its softmax's log-sum-exp then jumped on the samples that saturate (rows summing to 0.5 or
4.5) and the RTL "disagreed with the interpreter". Only da4ml's Python evaluator
(``CombLogic.__call__``) gets it right. A design holding such a mux is never built
(precision.py picks the nearest width without one); ``evaluate`` refuses one outright."""
from __future__ import annotations

from typing import Any

import numpy as np


def _shift(data: int) -> int:
    s = (int(data) >> 32) & 0xFFFFFFFF
    return s - (1 << 32) if s >= 1 << 31 else s


def unsafe_muxes(comb: Any) -> int:
    """How many of ``comb``'s muxes the C++ interpreter evaluates with a negative shift."""
    from da4ml.types import minimal_kif

    ops, n = comb.ops, 0
    for op in ops:
        if op.opcode not in (6, -6):
            continue
        f_out = minimal_kif(op.qint)[2]
        f0, f1 = minimal_kif(ops[op.id0].qint)[2], minimal_kif(ops[op.id1].qint)[2]
        if f_out - f0 < 0 or f_out - f1 + _shift(op.data) < 0:
            n += 1
    return n


def evaluate(comb: Any, x: np.ndarray) -> np.ndarray:
    """``comb`` on the rows of ``x`` (already in the input's range), bit-exact, float64."""
    from hwbackends.contract import CompileError

    if unsafe_muxes(comb):
        raise CompileError("this da4ml design holds a mux da4ml 0.6 evaluates wrongly (see "
                           "hwb_plugins/fpga_da4ml/interp.py); it must not be used")
    return np.asarray(comb.predict(np.asarray(x, np.float64).reshape(len(x), -1)), np.float64)
