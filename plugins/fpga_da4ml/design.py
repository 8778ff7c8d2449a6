"""Dense layers + a fixed-point plan → da4ml's combinational graph (``CombLogic``).

Each Dense is a constant matrix–vector product that da4ml turns into multiplier-free adder
trees (distributed arithmetic). Activations:

* ``relu``/``linear``: a saturating quantization of the accumulator;
* ``tanh``/``sigmoid``: one lookup table per unit over a saturated input (±4 / ±8);
* ``softmax``: without a divider, as ``p_i = exp(z_i − LSE(z))`` where the log-sum-exp is a
  fold of ``LSE(a, b) = max(a, b) + log1p(exp(−|a − b|))`` (one table per pair) and ``exp`` of
  a non-positive argument is one table per output. Every table's input is at most
  ``1 + 4 + TABLE_F`` bits.

Inputs use WRAP/TRN quantization (the only modes da4ml accepts on inputs); the executor
saturates values to the input's range on the host before they enter the design, so a
wrapped input never happens.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .network import DenseLayer

#: Fractional bits of every table's input: bounds tables at 2^(5+TABLE_F) entries.
TABLE_F = 8


@dataclass
class Plan:
    """Fixed-point types of one design. Integer bits exclude the sign bit (da4ml's k/i/f)."""

    f: int                      # fractional bits of the data
    fw: int                     # fractional bits of weights and biases
    in_int: int                 # integer bits of the (signed) input
    out_int: list[int] = field(default_factory=list)  # per layer, of its result

    @property
    def table_f(self) -> int:
        return min(self.f, TABLE_F)

    def input_range(self) -> tuple[float, float]:
        """What the design's input can hold (the host saturates to it)."""
        top = 2.0 ** self.in_int
        return -top, top - 2.0 ** -self.f

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def quantize_const(a: np.ndarray, f: int) -> np.ndarray:
    """Round constants to the ``2^-f`` grid (they become shifts and adds, never multipliers)."""
    return np.round(np.asarray(a, np.float64) * 2.0 ** f) / 2.0 ** f


def build(layers: list[DenseLayer], plan: Plan, n_in: int) -> Any:
    """The design as a da4ml ``CombLogic``."""
    from da4ml.trace import FixedVariableArrayInput, comb_trace

    inp = FixedVariableArrayInput(n_in)
    x = inp.quantize(k=1, i=plan.in_int, f=plan.f)  # WRAP/TRN: see the module docstring
    for layer, i_out in zip(layers, plan.out_int, strict=True):
        y = x @ quantize_const(layer.w, plan.fw) + quantize_const(layer.b, plan.fw)
        x = _activation(y, layer.activation, i_out, plan)
    return comb_trace(inp, x)


def _activation(y: Any, act: str, i_out: int, plan: Plan) -> Any:
    f, ft = plan.f, plan.table_f
    if act == "relu":
        return y.relu().quantize(k=0, i=i_out, f=f, overflow_mode="SAT")
    if act == "linear":
        return y.quantize(k=1, i=i_out, f=f, overflow_mode="SAT")
    if act == "tanh":
        t = y.quantize(k=1, i=2, f=ft, overflow_mode="SAT")
        return t.apply(np.tanh).quantize(k=1, i=0, f=f, overflow_mode="SAT")
    if act == "sigmoid":
        t = y.quantize(k=1, i=3, f=ft, overflow_mode="SAT")
        return t.apply(lambda v: 1 / (1 + np.exp(-v))).quantize(k=0, i=0, f=f, overflow_mode="SAT")
    if act == "softmax":
        return _softmax(y, i_out, plan)
    raise ValueError(act)  # network.py admits only the above


def _softplus_neg_abs(v: np.ndarray) -> np.ndarray:
    return np.log1p(np.exp(-np.abs(v)))


def _softmax(y: Any, i_in: int, plan: Plan) -> Any:
    """``exp(z_i − LSE(z))`` with tables only (no divider); see the module docstring."""
    from da4ml.trace import FixedVariableArray

    f, ft = plan.f, plan.table_f
    z = y.quantize(k=1, i=i_in, f=ft, overflow_mode="SAT")
    lse = z[0:1]
    for j in range(1, z.shape[0]):
        zj = z[j:j + 1]
        d = (lse - zj).quantize(k=1, i=3, f=ft, overflow_mode="SAT")
        g = d.apply(_softplus_neg_abs).quantize(k=0, i=0, f=ft)
        lse = (np.maximum(lse, zj) + g).quantize(k=1, i=i_in + 1, f=ft, overflow_mode="SAT")
    # z_i − LSE ≤ 0; below −16 the probability is < 1.2e-7, i.e. 0 at any f we use.
    arg = _sub_broadcast(z, lse, FixedVariableArray).quantize(k=1, i=4, f=ft, overflow_mode="SAT")
    return arg.apply(np.exp).quantize(k=0, i=1, f=f, overflow_mode="SAT")


def _sub_broadcast(z: Any, one: Any, cls: Any) -> Any:
    """``z − one`` elementwise, ``one`` a 1-element array (da4ml arrays do not broadcast)."""
    return cls(np.array([a - one._vars[0] for a in z._vars]), z.solver_options, hwconf=z.hwconf)
