"""Fixed-point plans for ``fpga.da4ml``: ``auto`` (fewest bits meeting the fidelity gate) or
an explicit ``fixed<W,I>`` / ``ap_fixed<W,I>``.

``auto`` uses the same search as ``fpga.hls4ml`` (plugins/_shared/fixed_point.py): integer
bits per tensor from the float ranges on the calibration data (+1 bit headroom, results
saturate), one number ``f`` of fractional bits for the data and ``fw`` for the constants,
``f`` the smallest meeting the target, then ``fw`` narrowed. A probe here is a da4ml trace
plus its bit-exact interpreter (``CombLogic.predict``), seconds rather than a Verilator build:
only the chosen design is Verilated and synthesized.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from hwbackends.errors import CompileError, UnsupportedError
from hwbackends.fidelity import Fidelity, compare

from .._shared.fixed_point import (
    F_MAX,
    FidelityTarget,
    Probe,
    first_guess,
    int_bits,
    narrow_weights,
    search,
)
from . import design
from .network import DenseLayer

_FIXED = re.compile(r"^(ap_)?fixed<\s*(\d+)\s*,\s*(-?\d+)\s*>$")


def parse_fixed(p: str) -> tuple[int, int] | None:
    """``(W, I)`` of ``fixed<W,I>``/``ap_fixed<W,I>`` (I counts the sign bit), or None."""
    m = _FIXED.match(p.strip())
    if not m:
        return None
    w, i = int(m.group(2)), int(m.group(3))
    return (w, i) if 2 <= w <= 32 and 1 <= i < w else None


@dataclass
class Ranges:
    """Largest magnitudes on the calibration data: the input and, per layer, the tensor that
    gets an integer width (the activation's output; the logits for softmax)."""

    inp: float
    layers: list[float] = field(default_factory=list)


def measure(layers: list[DenseLayer], x: np.ndarray) -> Ranges:
    h = np.asarray(x, np.float64).reshape(len(x), -1)
    r = Ranges(float(np.max(np.abs(h))))
    for layer in layers:
        pre = h @ layer.w + layer.b
        h = layer.forward(h)
        r.layers.append(float(np.max(np.abs(pre if layer.activation == "softmax" else h))))
    return r


def plan_auto(ranges: Ranges, f: int, fw: int | None = None) -> design.Plan:
    """Integer bits from the ranges (sign excluded, +1 headroom), ``f``/``fw`` fractional bits."""
    return design.Plan(f=f, fw=f if fw is None else fw,
                       in_int=int_bits(ranges.inp, signed=False, headroom=1),
                       out_int=[int_bits(m, signed=False, headroom=1) for m in ranges.layers])


def plan_fixed(layers: list[DenseLayer], width: int, integer: int) -> design.Plan:
    """Every tensor and constant as ``fixed<W,I>``."""
    return design.Plan(f=width - integer, fw=width - integer, in_int=integer - 1,
                       out_int=[integer - 1] * len(layers))


@dataclass
class Chosen:
    plan: design.Plan
    comb: Any
    fidelity: Fidelity
    search: dict[str, Any]


def choose(precision: str, layers: list[DenseLayer], calib: np.ndarray, ref: np.ndarray,
           target: FidelityTarget) -> Chosen:
    """The plan (and its traced design) for ``precision``."""
    n_in = calib.reshape(len(calib), -1).shape[1]
    if precision != "auto":
        wi = parse_fixed(precision)
        if wi is None:
            raise UnsupportedError(f"fpga.da4ml precision must be 'auto' or fixed<W,I> (2 ≤ W ≤ 32, "
                                   f"1 ≤ I < W); got {precision!r}")
        plan = plan_fixed(layers, *wi)
        comb = design.build(layers, plan, n_in)
        return Chosen(plan, comb, _fidelity(comb, plan, calib, ref), {})
    ranges = measure(layers, calib)
    combs: dict[tuple[int, int], Any] = {}

    def probe(f: int, fw: int) -> Callable[[], tuple[Fidelity, float]]:
        t0 = time.perf_counter()
        plan = plan_auto(ranges, f, fw)
        combs[(f, fw)] = design.build(layers, plan, n_in)
        return _fidelity(combs[(f, fw)], plan, calib, ref), time.perf_counter() - t0

    start = first_guess(target, float(np.ptp(ref)))
    best, probes = search(lambda f: probe(f, f), target, start)
    if best is None:
        raise CompileError(
            f"precision='auto' found no fixed-point design meeting {target.to_dict()} with up to "
            f"{F_MAX} fractional bits (best: {probes[-1].fidelity}; {'; '.join(probes[-1].violations)}). "
            f"Loosen option fidelity, or compile an explicit precision such as fixed<24,8>")
    best_w, wprobes = narrow_weights(lambda fw: probe(best, fw), target, best)
    plan = plan_auto(ranges, best, best_w)
    comb = combs[(best, best_w)]
    meta = {"frac_bits": best, "weight_frac_bits": best_w, "start": start, "target": target.to_dict(),
            "probes": [_probe(p) for p in probes], "weight_probes": [_probe(p) for p in wprobes],
            "ranges": {"input": ranges.inp, "layers": ranges.layers}}
    return Chosen(plan, comb, _fidelity(comb, plan, calib, ref), meta)


def _probe(p: Probe) -> dict[str, Any]:
    return p.__dict__


def _fidelity(comb: Any, plan: design.Plan, x: np.ndarray, ref: np.ndarray) -> Fidelity:
    lo, hi = plan.input_range()
    y = comb.predict(np.clip(x.reshape(len(x), -1), lo, hi).astype(np.float64))
    return compare(ref, np.asarray(y, np.float32).reshape(ref.shape))


def design_bits(comb: Any, plan: design.Plan, layers: list[DenseLayer]) -> dict[str, Any]:
    """What the design's widths add up to (for the report's bits column)."""
    n_in = comb.shape[0]
    w_in = 1 + plan.in_int + plan.f
    return {"input_bits": n_in * w_in, "input_width": w_in, "frac_bits": plan.f,
            "weight_frac_bits": plan.fw,
            "nonzero_weights": int(sum(np.count_nonzero(design.quantize_const(lyr.w, plan.fw))
                                             for lyr in layers)),
            "result_int_bits": plan.out_int}
