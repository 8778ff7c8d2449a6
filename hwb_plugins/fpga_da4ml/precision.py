"""Fixed-point plans for ``fpga.da4ml``: ``auto`` (fewest bits meeting the fidelity gate) or
an explicit ``fixed<W,I>`` / ``ap_fixed<W,I>``.

``auto`` uses the same search as ``fpga.hls4ml`` (hwb_plugins/_shared/fixed_point.py): integer
bits per tensor from the float ranges on the calibration data (+1 bit headroom, results
saturate), one number ``f`` of fractional bits for the data and ``fw`` for the constants,
``f`` the smallest meeting the target, then ``fw`` narrowed. A trial here is a da4ml trace
plus its bit-exact interpreter (``CombLogic.predict``), seconds rather than a Verilator build:
only the chosen design is Verilated and synthesized.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from hwbackends.contract import CompileError, Fidelity, UnsupportedError, compare

from .._shared.fixed_point import (
    F_MAX,
    F_MIN,
    FidelityTarget,
    Trial,
    first_guess,
    int_bits,
    narrow_weights,
    search,
)
from . import design, interp
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


class _Builds:
    """Designs built so far, and the da4ml-safe one nearest a requested plan.

    da4ml 0.6 mis-evaluates one construct, in its C++ interpreter *and* in its Verilog: a mux
    whose result has fewer fractional bits than the operand it selects (interp.unsafe_muxes).
    Whether the tracer emits one depends on the widths, not on the network's meaning: the jet
    tagger has none at 9–11, 13 and 14 fractional bits and some at 12 and 15–20. A design that
    holds one is never used; the nearest design without one stands in for it."""

    #: Offsets tried around a requested width, in order: wider first (never less accurate).
    OFFSETS = (0, 1, 2, -1, -2, -3)

    def __init__(self, layers: list[DenseLayer], n_in: int):
        self.layers, self.n_in = layers, n_in
        self.done: dict[tuple[int, int], tuple[design.Plan, Any, int]] = {}
        self.skipped: list[dict[str, int]] = []

    def build(self, plan: design.Plan) -> tuple[Any, int]:
        key = (plan.f, plan.fw)
        if key not in self.done:
            comb = design.build(self.layers, plan, self.n_in)
            n = interp.unsafe_muxes(comb)
            self.done[key] = (plan, comb, n)
            if n:
                self.skipped.append({"frac_bits": plan.f, "weight_frac_bits": plan.fw, "unsafe_muxes": n})
        return self.done[key][1], self.done[key][2]

    def nearest_safe(self, make: Callable[[int], design.Plan | None]) -> tuple[design.Plan, Any] | None:
        """The first safe plan ``make(offset)`` gives, over OFFSETS (None: out of range)."""
        for off in self.OFFSETS:
            plan = make(off)
            if plan is None:
                continue
            comb, unsafe = self.build(plan)
            if not unsafe:
                return plan, comb
        return None


def choose(precision: str, layers: list[DenseLayer], calib: np.ndarray, ref: np.ndarray,
           target: FidelityTarget) -> Chosen:
    """The plan (and its traced design) for ``precision``."""
    n_in = calib.reshape(len(calib), -1).shape[1]
    builds = _Builds(layers, n_in)
    if precision != "auto":
        wi = parse_fixed(precision)
        if wi is None:
            raise UnsupportedError(f"fpga.da4ml precision must be 'auto' or fixed<W,I> (2 ≤ W ≤ 32, "
                                   f"1 ≤ I < W); got {precision!r}")
        plan = plan_fixed(layers, *wi)
        comb, unsafe = builds.build(plan)
        if unsafe:
            w, i = wi
            ok = [f"fixed<{w + d},{i}>" for d in (1, -1, 2, -2)
                  if 2 <= w + d <= 32 and i < w + d and not builds.build(plan_fixed(layers, w + d, i))[1]]
            raise UnsupportedError(
                f"fpga.da4ml cannot build {precision} for this model correctly: at these widths "
                f"da4ml 0.6 emits {unsafe} saturation mux(es) that its interpreter and its Verilog "
                f"both evaluate wrongly (a shift by a negative count). "
                + (f"Nearby widths without it: {', '.join(ok)}; or use precision='auto', which "
                   f"skips such widths." if ok else "Use precision='auto', which skips such widths."))
        return Chosen(plan, comb, _fidelity(comb, plan, calib, ref), {})
    ranges = measure(layers, calib)
    used: dict[tuple[int, int], design.Plan] = {}
    combs: dict[tuple[int, int], Any] = {}

    def trial(f: int, fw: int, narrowing: bool) -> tuple[Fidelity, float]:
        t0 = time.perf_counter()

        def make(off: int) -> design.Plan | None:
            ff, ww = (f, fw + off) if narrowing else (f + off, fw + off)
            return plan_auto(ranges, ff, ww) if F_MIN <= ww <= ff <= F_MAX else None
        got = builds.nearest_safe(make)
        if got is None:
            raise CompileError(
                f"precision='auto': every design near {f} fractional bits holds a construct "
                f"da4ml 0.6 evaluates wrongly (see interp.py); compile an explicit fixed<W,I> "
                f"with fewer fractional bits, or loosen option fidelity")
        used[(f, fw)], combs[(f, fw)] = got
        return _fidelity(got[1], got[0], calib, ref), time.perf_counter() - t0

    start = first_guess(target, float(np.ptp(ref)))
    best, trials = search(lambda f: trial(f, f, False), target, start)
    if best is None:
        raise CompileError(
            f"precision='auto' found no fixed-point design meeting {target.to_dict()} with up to "
            f"{F_MAX} fractional bits (best: {trials[-1].fidelity}; {'; '.join(trials[-1].violations)}). "
            f"Loosen option fidelity, or compile an explicit precision such as fixed<24,8>")
    chosen_f = used[(best, best)].f
    best_w, wtrials = narrow_weights(lambda fw: trial(chosen_f, fw, True), target, chosen_f)
    key = (chosen_f, best_w) if (chosen_f, best_w) in used else (best, best)
    plan, comb = used[key], combs[key]
    meta = {"frac_bits": plan.f, "weight_frac_bits": plan.fw, "start": start, "target": target.to_dict(),
            "trials": [_trial(p) for p in trials], "weight_trials": [_trial(p) for p in wtrials],
            "skipped_for_da4ml_bug": builds.skipped,
            "ranges": {"input": ranges.inp, "layers": ranges.layers}}
    return Chosen(plan, comb, _fidelity(comb, plan, calib, ref), meta)


def _trial(p: Trial) -> dict[str, Any]:
    return p.__dict__


def _fidelity(comb: Any, plan: design.Plan, x: np.ndarray, ref: np.ndarray) -> Fidelity:
    lo, hi = plan.input_range()
    y = interp.evaluate(comb, np.clip(x.reshape(len(x), -1), lo, hi))
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
