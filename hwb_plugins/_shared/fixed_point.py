"""Fixed-point precision search shared by the FPGA targets (``fpga.hls4ml``, ``fpga.da4ml``).

The fidelity target an ``auto`` precision must meet, and the search for the fewest
fractional bits meeting it: each trial builds and measures one design, the error of a trial
predicts the next (rounding error ∝ 2^-f), and a pass/fail bracket keeps the search honest.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

from hwbackends.contract import AUTO_SEARCH, Fidelity, Tolerance

F_MIN, F_MAX = 2, 24
#: Error budgets the calibration data must meet, as a share of the target's (see tolerance()).
SEARCH_MARGIN = 0.5


@dataclass(frozen=True)
class FidelityTarget:
    """What ``auto`` must meet on the calibration data (option ``fidelity``); the defaults are
    the policy's :data:`hwbackends.fidelity.AUTO_SEARCH`."""

    corr_min: float = float(AUTO_SEARCH.corr_min)  # type: ignore[arg-type]
    rel_err: float = float(AUTO_SEARCH.rel_err)  # type: ignore[arg-type]
    sign_min: float = float(AUTO_SEARCH.sign_min)  # type: ignore[arg-type]
    argmax_min: float = float(AUTO_SEARCH.argmax_min)  # type: ignore[arg-type]

    @classmethod
    def from_option(cls, d: dict[str, float] | None) -> "FidelityTarget":
        from hwbackends.contract import UnsupportedError
        d = dict(d or {})
        bad = sorted(set(d) - set(cls.__dataclass_fields__))
        if bad:
            raise UnsupportedError(f"option fidelity has unknown key(s) {', '.join(bad)}; known: "
                                   f"{', '.join(cls.__dataclass_fields__)}")
        return cls(**{k: float(v) for k, v in d.items()})

    def tolerance(self, margin: float = 1.0) -> Tolerance:
        """The target as a :class:`Tolerance`; ``margin`` < 1 tightens the error budgets (the
        search uses 0.5 on calibration data so that unseen validation data still passes:
        one more fractional bit roughly halves the error)."""
        return Tolerance(corr_min=1 - (1 - self.corr_min) * margin, rel_err=self.rel_err * margin,
                         sign_min=self.sign_min, argmax_min=self.argmax_min)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass
class Trial:
    """One candidate design the search built and measured."""

    frac_bits: int
    fidelity: dict[str, Any]
    violations: list[str]
    build_seconds: float

    @property
    def passed(self) -> bool:
        return not self.violations


def int_bits(maxabs: float, signed: bool = True, headroom: int = 0) -> int:
    """Integer bits (sign included when ``signed``) that hold ±``maxabs``."""
    if not maxabs > 0 or not math.isfinite(maxabs):
        return 1
    bits = math.floor(math.log2(maxabs)) + 1 + headroom + (1 if signed else 0)
    return max(1, bits)


def first_guess(target: FidelityTarget, out_range: float) -> int:
    """Fractional bits whose rounding step is ~1/8 of the allowed error (errors compound
    through layers), clamped to the search interval."""
    budget = max(target.rel_err * SEARCH_MARGIN * max(out_range, 1e-6), 1e-9)
    return int(min(F_MAX, max(F_MIN + 2, math.ceil(math.log2(8.0 / budget)))))


def error_ratio(fid: Fidelity, tol: Tolerance) -> float:
    """How far a trial is from the budget (> 1: over it), for the scalable metrics: rounding
    error roughly halves per fractional bit, so log2 of this is the number of bits to add
    (or, below 1, that could be removed)."""
    r = 0.0
    if tol.rel_err:
        r = max(r, fid.rel_err / tol.rel_err)
    if tol.corr_min is not None and tol.corr_min < 1:
        r = max(r, (1 - fid.corr) / (1 - tol.corr_min))
    if tol.violations(fid) and r <= 1:  # only sign/argmax fail: one bit at a time
        r = 2.0
    return r


def search(evaluate: Callable[[int], tuple[Fidelity, float]], target: FidelityTarget,
           start: int, margin: float = SEARCH_MARGIN) -> tuple[int | None, list[Trial]]:
    """Smallest ``f`` in [F_MIN, F_MAX] that passes, trying as few values as possible.

    ``evaluate(f)`` builds and runs one design and returns (fidelity, build seconds). Each
    trial's error predicts the next ``f`` (error ∝ 2^-f); the known pass/fail bracket keeps
    it honest, and bisection finishes when a prediction lands on a tried value. Assumes
    fidelity improves monotonically with ``f``."""
    tol = target.tolerance(margin)
    trials: dict[int, Trial] = {}
    ratios: dict[int, float] = {}

    def ok(f: int) -> bool:
        if f not in trials:
            fid, secs = evaluate(f)
            trials[f] = Trial(f, fid.to_dict(), tol.violations(fid), secs)
            ratios[f] = error_ratio(fid, tol)
        return trials[f].passed

    lo, hi = F_MIN - 1, None  # lo: largest known failure; hi: smallest known pass
    f = min(max(start, F_MIN), F_MAX)
    while True:
        if ok(f):
            hi = f if hi is None else min(hi, f)
        else:
            lo = max(lo, f)
        if lo >= F_MAX:
            return None, sorted(trials.values(), key=lambda p: p.frac_bits)
        if hi is not None and hi - lo <= 1:
            return hi, sorted(trials.values(), key=lambda p: p.frac_bits)
        r = ratios[f]
        if trials[f].passed:
            step = math.floor(math.log2(1 / r)) if r > 0 else 4
            guess = f - max(1, step)
        else:
            guess = f + max(1, math.ceil(math.log2(r)) if r > 0 else 2)
        upper = F_MAX if hi is None else hi - 1
        guess = min(max(guess, lo + 1), upper)
        if guess in trials:
            guess = (lo + hi) // 2 if hi is not None else min(F_MAX, lo + 2)
        f = guess


def narrow_weights(evaluate: Callable[[int], tuple[Fidelity, float]], target: FidelityTarget,
                   f: int, margin: float = SEARCH_MARGIN, first: int | None = None
                   ) -> tuple[int, list[Trial]]:
    """Second phase: weights are most of a design's bits (every multiplier's constant), so
    try fewer fractional bits for them than for the data, with one more build or two.
    Without a prediction: ``f-4``, then ``f-2`` when that fails. With one (``first``, from
    :func:`predict_bits`): ``first``, then ``first+1`` when that fails; none when ``first``
    is ``f`` (fewer weight bits failed even without the design's other error sources).
    Returns the smallest passing weight fraction (``f`` when none did). Deliberately coarse:
    each trial is a build."""
    tol = target.tolerance(margin)
    trials: list[Trial] = []

    def ok(fw: int) -> bool:
        fid, secs = evaluate(fw)
        trials.append(Trial(fw, fid.to_dict(), tol.violations(fid), secs))
        return trials[-1].passed

    tries = [f - 4, f - 2] if first is None else [first, first + 1]
    for fw in tries:
        if F_MIN <= fw < f and ok(fw):
            return fw, trials
    return f, trials


# -- a prediction from the float model, before any build ---------------------------------------
def round_to(x: Any, frac: int) -> Any:
    """``x`` on the grid of ``frac`` fractional bits, half up (ap_fixed's AP_RND)."""
    import numpy as np

    s = 2.0 ** frac
    return np.floor(np.asarray(x, dtype=np.float64) * s + 0.5) / s


#: A target's model of one layer of its design: ``(layer, x, f, fw) -> y`` (its output before
#: the rounding to ``f`` that every layer gets), or None for the generic one: the float layer
#: with its weights rounded to ``fw``. Targets model what their implementation adds (lookup
#: tables; a recurrent layer's state rounded every step).
LayerModel = Callable[[Any, Any, int, int], Any]


def rounded_forward(net: Any, x: Any, f: int, fw: int, model: LayerModel | None = None) -> Any:
    """The float64 reference of a layer-IR network (:mod:`.layer_ir`) with its input and
    every layer's output rounded to ``f`` fractional bits and its weights to ``fw``: the
    rounding a fixed-point design adds. ``model`` gives the target's own layers (lookup
    tables, recurrent state); saturation and accumulator widths are not modelled."""
    import dataclasses

    from hwbackends.layer_ir import reference

    h = round_to(x, f)
    for layer in net.layers:
        y = model(layer, h, f, fw) if model is not None else None
        if y is None:
            weights = {k: round_to(getattr(layer, k), fw) for k in ("w", "b", "scale", "shift")
                       if hasattr(layer, k)}
            y = reference.apply(dataclasses.replace(layer, **weights) if weights else layer, h)
        h = round_to(y, f)
    return h


def predict_bits(net: Any, x: Any, ref: Any, target: FidelityTarget,
                 model: LayerModel | None = None,
                 margin: float = SEARCH_MARGIN) -> tuple[int, int] | None:
    """The search's first guesses, (data ``f``, weights ``fw`` for that ``f``): the fewest
    fractional bits whose :func:`rounded_forward` meets ``target`` on ``x`` against ``ref``
    (the source model's outputs). Milliseconds of NumPy instead of builds; a design has more
    error sources than rounding, so the search still measures every value it returns. None
    when not even ``F_MAX`` bits pass (the search then starts from :func:`first_guess`)."""
    from hwbackends.contract import compare

    tol = target.tolerance(margin)

    def passes(f: int, fw: int) -> bool:
        y = rounded_forward(net, x, f, fw, model).astype("float32").reshape(ref.shape)
        return not tol.violations(compare(ref, y))

    f = next((f for f in range(F_MIN, F_MAX + 1) if passes(f, f)), None)
    if f is None:
        return None
    fw = next((fw for fw in range(max(F_MIN, f - 4), f) if passes(f, fw)), f)
    return f, fw


# -- ap_fixed arithmetic as integers (cpu.native's ``fixed`` precision) -----------------------
#: Quantisation modes (hls4ml's RoundingMode names, without ``AP_``) in the order of the C
#: emulation's enum (hwb_plugins/cpu_native/hwb_fixed.h).
QUANT_MODES = ("TRN", "TRN_ZERO", "RND", "RND_ZERO", "RND_INF", "RND_MIN_INF", "RND_CONV")
#: Overflow modes emulated exactly; AP_SAT_SYM and AP_WRAP_SM are not (see FxType.check).
OVF_MODES = ("WRAP", "SAT", "SAT_ZERO")


@dataclass(frozen=True)
class FxType:
    """One ``ap_fixed<W,I,Q,O>`` / ``ap_ufixed`` type: a value is ``raw · 2^-frac`` with
    ``raw`` a ``width``-bit two's-complement (or unsigned) integer."""

    width: int
    integer: int
    signed: bool = True
    quant: str = "TRN"
    ovf: str = "WRAP"

    @property
    def frac(self) -> int:
        return self.width - self.integer

    @property
    def hi(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1

    @property
    def lo(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    def __str__(self) -> str:
        return f"{'' if self.signed else 'u'}fixed<{self.width},{self.integer},{self.quant},{self.ovf}>"

    @classmethod
    def from_hls4ml(cls, p: Any) -> "FxType":
        """From an hls4ml ``FixedPrecisionType`` (or ``IntegerPrecisionType``: no fraction)."""
        width, integer = int(p.width), int(getattr(p, "integer", p.width))
        quant = str(getattr(p, "rounding_mode", None) or "TRN").replace("AP_", "")
        ovf = str(getattr(p, "saturation_mode", None) or "WRAP").replace("AP_", "")
        if int(getattr(p, "saturation_bits", 0) or 0):
            ovf = f"{ovf} with {p.saturation_bits} saturation bits"
        return cls(width, integer, bool(p.signed), quant, ovf)

    def unsupported(self) -> str:
        """Why the integer emulation cannot reproduce this type exactly, or ""."""
        if self.quant not in QUANT_MODES:
            return f"quantisation mode {self.quant}"
        if self.ovf not in OVF_MODES:
            return f"overflow mode {self.ovf} (emulated: {', '.join(OVF_MODES)})"
        if not 1 <= self.width <= 63:
            return f"width {self.width} (the emulation holds values in 64-bit integers: W ≤ 63)"
        return ""

    def overflow(self, v: int) -> int:
        """``v`` (an integer at this type's fraction) brought into range by the overflow mode."""
        if self.lo <= v <= self.hi:
            return v
        if self.ovf == "SAT":
            return self.hi if v > self.hi else self.lo
        if self.ovf == "SAT_ZERO":
            return 0
        v &= (1 << self.width) - 1
        return v - (1 << self.width) if self.signed and v > self.hi else v

    def cast_raw(self, v: int, frac: int) -> int:
        """``v · 2^-frac`` converted to this type (quantisation, then overflow), as ap_fixed's
        assignment does; the C emulation's ``fx_cast`` computes the same."""
        from fractions import Fraction
        return self.from_exact(Fraction(v, 1) / Fraction(2) ** frac if frac >= 0 else
                               Fraction(v * 2 ** -frac))

    def from_double(self, d: float) -> int:
        """The raw value of ``ap_fixed(d)`` for a finite double ``d``."""
        from fractions import Fraction
        return self.from_exact(Fraction(d))

    def from_exact(self, x: Any) -> int:
        """Raw value of the exact rational ``x`` (a ``Fraction``) converted to this type."""
        from fractions import Fraction
        s = x * (Fraction(2) ** self.frac)
        fl = math.floor(s)
        fr = s - fl
        half = Fraction(1, 2)
        up = {"TRN": False, "TRN_ZERO": s < 0 and fr != 0, "RND": fr >= half,
              "RND_ZERO": fr > half or (fr == half and s < 0),
              "RND_INF": fr > half or (fr == half and s >= 0), "RND_MIN_INF": fr > half,
              "RND_CONV": fr > half or (fr == half and fl % 2 == 1)}[self.quant]
        return self.overflow(fl + int(up))

    def value(self, raw: int) -> float:
        return float(raw) * 2.0 ** -self.frac
