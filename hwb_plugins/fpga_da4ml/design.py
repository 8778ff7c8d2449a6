"""Dense layers + a fixed-point plan → da4ml's combinational graph (``CombLogic``).

Each Dense is a constant matrix–vector product that da4ml turns into multiplier-free adder
trees (distributed arithmetic). Activations:

* ``relu``/``linear``: a saturating quantization of the accumulator;
* ``tanh``/``sigmoid``: one lookup table per unit over a saturated input (±4 / ±8);
* ``softmax``: without a divider, as ``p_i = exp(z_i − LSE(z))`` on logits kept at the data's
  precision. The log-sum-exp is a fold of ``LSE(a, b) = max(a, b) + log1p(exp(−|a − b|))``
  (one table per pair, its input ``|a − b|`` rounded to ``LSE_TABLE_F`` bits, its output at
  the data's precision). ``exp(−m)`` of the magnitude ``m = LSE − z_i`` is split so that no
  table grows with the precision: ``m = h + r`` with ``h`` on a ``2^−TABLE_F`` grid (one table)
  and ``0 ≤ r < 2^−TABLE_F``, and ``exp(−m) ≈ e·(1 − r)`` with ``e = exp(−h)`` (one small
  variable multiply; the dropped ``r²/2`` is below 2^−17). Tables have at most
  ``4 + TABLE_F`` / ``3 + LSE_TABLE_F`` input bits whatever the precision, and the error no
  longer stops at the tables' grid (it did at ≈ 0.011 with 8-bit tables and no split).

Inputs use WRAP/TRN quantization (the only modes da4ml accepts on inputs); the executor
saturates values to the input's range on the host before they enter the design, so a
wrapped input never happens.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .network import DenseLayer

#: Fractional bits of the inputs of the activation and exp tables (≤ 2^(5+TABLE_F) entries).
TABLE_F = 8
#: Fractional bits of the log-sum-exp tables' input ``|a − b| < 8`` (2^(3+LSE_TABLE_F) entries).
LSE_TABLE_F = 10


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


def _softmax(y: Any, i_in: int, plan: Plan) -> Any:
    """``exp(z_i − LSE(z))`` with tables and one small multiply (no divider); see the module
    docstring."""
    from da4ml.trace import FixedVariableArray

    f, ft, fl = plan.f, plan.table_f, min(plan.f, LSE_TABLE_F)
    z = y.quantize(k=1, i=i_in, f=f, overflow_mode="SAT")
    lse = z[0:1]
    for j in range(1, z.shape[0]):
        zj = z[j:j + 1]
        top = np.maximum(lse, zj)
        d = (top - np.minimum(lse, zj)).quantize(k=0, i=3, f=fl, overflow_mode="SAT", round_mode="RND")
        g = d.apply(_softplus_neg).quantize(k=0, i=0, f=f, round_mode="RND")
        lse = (top + g).quantize(k=1, i=i_in + 1, f=f, overflow_mode="SAT")
    # m = LSE − z_i ≥ 0; beyond 16 the probability is < 1.2e-7, i.e. 0 at any f we use.
    m = (-_sub_broadcast(z, lse, FixedVariableArray)).quantize(k=0, i=4, f=f, overflow_mode="SAT")
    h = m.quantize(k=0, i=4, f=ft)  # truncation: 0 ≤ m − h < 2^-ft
    e = h.apply(_exp_neg).quantize(k=0, i=1, f=f + 1, round_mode="RND")
    if f > ft:
        e = e - e * (m - h)
    return e.quantize(k=0, i=1, f=f, overflow_mode="SAT", round_mode="RND")


def _softplus_neg(v: np.ndarray) -> np.ndarray:
    return np.log1p(np.exp(-v))


def _exp_neg(v: np.ndarray) -> np.ndarray:
    return np.exp(-v)


def _sub_broadcast(z: Any, one: Any, cls: Any) -> Any:
    """``z − one`` elementwise, ``one`` a 1-element array (da4ml arrays do not broadcast)."""
    return cls(np.array([a - one._vars[0] for a in z._vars]), z.solver_options, hwconf=z.hwconf)
