"""Numerical fidelity of a compiled variant against the source model's fp32 reference.

Which metrics mean something depends on what the output *is*. The model's owner says so
(``output_kind``: :func:`hwbackends.compile`, a strategy's ``output_kind`` in strategies.toml);
without that, :func:`classify` infers it from the reference outputs, and the result says it
was inferred (``kind_source``), because a guess can be wrong: a regression whose values
happen to lie in [0, 1] looks like a probability. :func:`compare` records the metric set the
kind gates on:

=============  =====================================  =========================================
kind           inferred when (reference outputs)      gated metrics
=============  =====================================  =========================================
probabilities  ≥ 0 and rows sum to 1 (softmax), or    corr, max_abs/rel_err/mae, decision
               all in [0, 1] (sigmoid)                (argmax; ``> 0.5`` for one column)
regression     ≥ 0, unbounded (ReLU, prices, counts)  corr, max_abs/rel_err/mae
signed         has negative values, one column        corr, max_abs/rel_err/mae, sign
logits         has negative values, ≥ 2 columns       corr, max_abs/rel_err/mae, sign, argmax
=============  =====================================  =========================================

A tolerance that the kind does not gate (``sign_min`` on probabilities or a regression,
``argmax_min`` on a signed or regression output) is an error naming the kind
(:meth:`Tolerance.violations`), never skipped in silence.

A **degenerate** reference — every output the same for every validation input (the model
saturates on inputs unlike its training data, e.g. the synthetic N(0,1) used when no
validation data is given) — makes correlation, sign and decision agreement measure nothing
(a constant vector correlates perfectly with itself across its columns). :func:`compare`
flags it (``degenerate``, ``warning``), gates only the errors, takes ``rel_err`` against the
output's magnitude instead of its (near-zero) range, and the message asks for real data.

Sign and decision agreement use a dead band: a sample whose reference is within
``DEAD_BAND`` × (output range) of the decision boundary (0 for sign, 0.5 or the runner-up
for decisions) does not count, because an fp32 → fp16/int8/fixed-point variant may flip it
without being wrong (a probability that rounds to exactly 0 is not a sign flip).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import ConfigError

#: Share of the reference output's range (peak to peak) around a decision boundary in which
#: sign/argmax disagreements are not counted.
DEAD_BAND = 0.01
#: A reference whose every output column spreads across the validation samples by at most
#: this share of the output's magnitude (max |ref|) is constant: ``degenerate``.
DEGENERATE_RTOL = 1e-5
DEGENERATE_ADVICE = (
    "the reference output is the same for every validation input, so correlation, sign and "
    "decision agreement measure nothing (rel_err is taken against the output's magnitude). The "
    "inputs are not what the model expects (without validation data they are synthetic N(0,1)): "
    "pass samples of the model's real inputs — load_model(..., validation_data=X), "
    "compile(..., calibration_data=X); on the command line --validation X.npy")
#: Every metric a Tolerance can check; a Fidelity's ``gated`` is the subset that applies.
ALL_METRICS = ("corr", "max_abs", "rel_err", "mae", "sign", "argmax")
_ERRORS = ("corr", "max_abs", "rel_err", "mae")
GATED: dict[str, tuple[str, ...]] = {
    "probabilities": (*_ERRORS, "argmax"),
    "regression": _ERRORS,
    "signed": (*_ERRORS, "sign"),
    "logits": (*_ERRORS, "sign", "argmax"),
}
#: The kinds an output may be declared as (``output_kind``).
KINDS = ("signed", "regression", "probabilities", "logits")
#: The tolerance fields that gate one metric, and the metric (the others gate errors, which
#: every kind gates).
KIND_TOLERANCES = {"sign_min": "sign", "argmax_min": "argmax"}
#: Why :func:`classify` inferred each kind, for the messages that show an inferred kind.
INFERRED_BECAUSE = {
    "probabilities": "the reference outputs are ≥ 0 and within [0, 1] or sum to 1",
    "regression": "the reference outputs are ≥ 0 and exceed 1",
    "signed": "the reference output has negative values (one column)",
    "logits": "the reference outputs have negative values (several columns)",
}


@dataclass(frozen=True)
class Fidelity:
    """Agreement between a variant's outputs and the reference on ``n`` validation samples.

    ``rel_err`` is the max abs error over the reference's output range (peak to peak), so it
    compares across models with different output scales. ``sign_agree`` is the share of
    outputs whose sign matches (the trade direction of a signal), outside the dead band;
    ``argmax_agree`` the share of samples whose decision is the same (argmax over several
    outputs, ``> 0.5`` for one probability), ``None`` when there is no decision. ``kind`` is
    what :func:`classify` made of the output and ``gated`` the metrics a :class:`Tolerance`
    checks for it (the others are shown, not gated).
    """

    n: int
    max_abs: float
    mae: float
    rel_err: float
    corr: float
    sign_agree: float
    argmax_agree: float | None
    kind: str = "signed"
    gated: tuple[str, ...] = ALL_METRICS
    #: The reference is constant over the samples (see the module doc); ``warning`` says so.
    degenerate: bool = False
    warning: str = ""
    #: Several outputs: the metrics above are those of the *worst* output, named here (lowest
    #: corr, then largest rel_err), so a :class:`Tolerance` gates every output at once;
    #: ``outputs`` holds each output's own Fidelity. ``""`` / ``None`` for one output.
    output: str = ""
    outputs: dict[str, "Fidelity"] | None = None
    #: ``declared`` (``output_kind`` given) or ``inferred`` (:func:`classify`).
    kind_source: str = "inferred"

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("output", "outputs")}
        d["gated"] = list(self.gated)
        if self.outputs is not None:
            d["output"] = self.output
            d["outputs"] = {k: f.to_dict() for k, f in self.outputs.items()}
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Fidelity":
        """The inverse of :meth:`to_dict`, for one output or several (a results file, a fleet
        node's answer): ``Fidelity.from_dict(f.to_dict()) == f``. Unknown keys (a newer
        writer's) are ignored, so an older reader still gates on the metrics it knows."""
        known = {f.name for f in fields(Fidelity)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["gated"] = tuple(kw.get("gated", ALL_METRICS))
        if "outputs" in kw or "output" in kw:
            kw["outputs"] = {k: Fidelity.from_dict(v) for k, v in (kw.get("outputs") or {}).items()}
        return Fidelity(**kw)

    def __str__(self) -> str:
        am = "" if self.argmax_agree is None else f" argmax={self.argmax_agree:.4f}"
        warn = f"\n  WARNING: degenerate fidelity: {self.warning}" if self.degenerate else ""
        own = (f"[{self.kind}{', inferred' if self.kind_source == 'inferred' else ''}] max_abs={self.max_abs:.3g} mae={self.mae:.3g} rel={self.rel_err:.3g} "
               f"corr={self.corr:.6f} sign={self.sign_agree:.4f}{am} (n={self.n}){warn}")
        if self.outputs is None:
            return own
        return (f"worst output {self.output!r}: {own}; "
                + "; ".join(f"{k}: corr={f.corr:.6f} rel={f.rel_err:.3g}"
                            + (" (degenerate: constant reference)" if f.degenerate else "")
                            for k, f in self.outputs.items()))


def classify(reference: np.ndarray) -> str:
    """The output kind (see the module table) from reference outputs ``(n, k)``."""
    ref = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    if ref.size == 0 or not np.isfinite(ref).all():
        return "signed"
    tol = 1e-5
    if ref.min() >= -tol:
        if ref.shape[1] > 1 and np.allclose(ref.sum(1), 1.0, atol=1e-3):
            return "probabilities"
        if ref.max() <= 1 + tol:
            return "probabilities"
        return "regression"
    return "logits" if ref.shape[1] > 1 else "signed"


def describe_kind(f: Fidelity | None, declared: str | None = None) -> str:
    """The output kind in words, saying whether it was declared or inferred (and how to
    declare it): what ``hwb compile`` and ``hwb route --explain`` print."""
    kind = declared or (f.kind if f is not None else None)
    if kind is None:
        return "not known yet (no fidelity measured); declare output_kind to set it"
    gates = ", ".join(GATED.get(kind, _ERRORS))
    if declared or (f is not None and f.kind_source == "declared"):
        return f"{kind} (declared; gates {gates})"
    return (f"{kind} (inferred: {INFERRED_BECAUSE.get(kind, 'from the reference outputs')}; "
            f"gates {gates}; if it is not, declare output_kind (hwb compile --output-kind) as one "
            f"of {', '.join(KINDS)})")


def check_kind(kind: Any, what: str = "output_kind") -> str:
    """``kind`` if it is one of :data:`KINDS`, else a :class:`ConfigError` listing them."""
    if kind not in KINDS:
        raise ConfigError(f"{what} {str(kind)[:40]!r} is not an output kind; one of "
                          f"{', '.join(KINDS)}")
    return kind


def with_kind(f: Fidelity, kind: str) -> Fidelity:
    """A measured Fidelity judged as a declared ``kind`` (a results file's variant, measured
    before the strategy declared it): every metric is kept, ``gated`` follows the kind. A
    decision agreement is only known where it was measured (one column judged as
    probabilities needs it measured as such)."""
    check_kind(kind)
    outs = {k: with_kind(v, kind) for k, v in f.outputs.items()} if f.outputs is not None else None
    return replace(f, kind=kind, kind_source="declared", outputs=outs,
                   gated=_ERRORS[1:] if f.degenerate else GATED[kind])


def is_degenerate(reference: np.ndarray) -> bool:
    """Whether reference outputs ``(n, …)`` are the same for every sample (to
    :data:`DEGENERATE_RTOL` of their magnitude); one sample is never called degenerate."""
    ref = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    if len(ref) < 2 or ref.size == 0 or not np.isfinite(ref).all():
        return False
    spread = float(np.ptp(ref, axis=0).max())
    return spread <= DEGENERATE_RTOL * float(np.abs(ref).max())


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    if np.std(a) == 0 or np.std(b) == 0:
        return 1.0 if np.allclose(a, b) else 0.0
    return float(np.corrcoef(a, b)[0, 1])


def _sign_agree(ref: np.ndarray, out: np.ndarray, band: float) -> float:
    a, b = ref.ravel(), out.ravel()
    keep = np.abs(a) > band
    if not keep.any():
        return 1.0
    return float(np.mean(np.sign(a[keep]) == np.sign(b[keep])))


def _decision_agree(ref: np.ndarray, out: np.ndarray, band: float, kind: str) -> float | None:
    if ref.shape[1] == 1:
        if kind != "probabilities":
            return None
        keep = np.abs(ref[:, 0] - 0.5) > band
        same = (ref[:, 0] > 0.5) == (out[:, 0] > 0.5)
    else:
        top2 = np.sort(ref, axis=1)[:, -2:]
        keep = (top2[:, 1] - top2[:, 0]) > band  # near-ties may go either way
        same = ref.argmax(1) == out.argmax(1)
    return float(np.mean(same[keep])) if keep.any() else 1.0


def compare(reference: Any, got: Any, kind: str | Mapping[str, str] | None = None,
            names: Sequence[str] | None = None) -> Fidelity:
    """Fidelity of ``got`` against ``reference``: one ``(n, *output.shape)`` array each, or
    tuples with one such array per output (``names`` names them, in order). Several outputs
    are compared each on its own (each classified on its own unless declared) and the result
    carries the worst one's metrics (see :attr:`Fidelity.outputs`). ``kind`` declares the
    output kind (one of :data:`KINDS`; for several outputs one for all, or a mapping by
    output name); ``None`` infers it (:func:`classify`)."""
    refs = tuple(reference) if isinstance(reference, (tuple, list)) else (reference,)
    gots = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    if names is None and len(refs) == 1:
        if len(gots) != 1:
            raise ValueError(f"1 reference output, {len(gots)} outputs")
        return _compare_one(refs[0], gots[0], kind if isinstance(kind, str) or kind is None
                            else next(iter(kind.values()), None))
    names = list(names) if names is not None else [f"output_{i}" for i in range(len(refs))]
    if not (len(refs) == len(gots) == len(names)):
        raise ValueError(f"{len(refs)} reference outputs, {len(gots)} outputs, "
                         f"{len(names)} names")
    kinds = dict(kind) if isinstance(kind, Mapping) else {n: kind for n in names}
    each = {n: _compare_one(r, g, kinds.get(n)) for n, r, g in zip(names, refs, gots, strict=True)}
    worst = min(each, key=lambda n: (each[n].corr, -each[n].rel_err))
    flat = [n for n, f in each.items() if f.degenerate]
    # any constant output is worth the warning, worst or not
    warn = {"degenerate": True,
            "warning": f"output(s) {', '.join(flat)}: {DEGENERATE_ADVICE}"} if flat else {}
    return replace(each[worst], output=worst, outputs=each, **warn)


def _compare_one(reference: np.ndarray, got: np.ndarray, kind: str | None = None) -> Fidelity:
    ref = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    out = np.asarray(got, dtype=np.float64).reshape(len(got), -1)
    if ref.shape != out.shape:
        raise ValueError(f"reference shape {ref.shape} != output shape {out.shape}")
    source = "declared" if kind else "inferred"
    kind = check_kind(kind) if kind else classify(ref)
    err = np.abs(ref - out)
    rng = float(np.ptp(ref)) if ref.size else 0.0
    band = DEAD_BAND * (rng or 1.0)
    degenerate = is_degenerate(ref)
    scale = float(np.abs(ref).max()) if degenerate else rng
    return Fidelity(
        n=len(ref), max_abs=float(err.max(initial=0.0)), mae=float(err.mean()) if err.size else 0.0,
        rel_err=float(err.max(initial=0.0)) / (scale or 1.0), corr=_corr(ref.ravel(), out.ravel()),
        sign_agree=_sign_agree(ref, out, band),
        argmax_agree=_decision_agree(ref, out, band, kind) if ref.size else None,
        kind=kind, gated=_ERRORS[1:] if degenerate else GATED[kind], degenerate=degenerate,
        warning=DEGENERATE_ADVICE if degenerate else "", kind_source=source)


@dataclass(frozen=True)
class Tolerance:
    """What a variant must meet to be trusted. ``None`` fields are not checked, and a
    degenerate reference gates errors only. A set field whose metric the output kind does not
    gate (``sign_min`` for probabilities) is skipped by a generic tolerance (the FPGA
    auto-precision target names every metric, for whichever kind it meets), and is an error
    naming the kind for a ``strict`` one: a strategy's gate, written for one model
    (:meth:`hwbackends.config.FidelityConfig.tolerance`)."""

    # The gate's fields, declared here only: each carries the range a value must lie in
    # (``bounds``: low, high; None: open), which a strategies file's ``fidelity`` table is
    # checked against (:class:`hwbackends.config.FidelityConfig` is built from these).
    corr_min: float | None = field(default=0.999, metadata={"bounds": (-1.0, 1.0)})
    max_abs: float | None = field(default=None, metadata={"bounds": (0.0, None)})
    rel_err: float | None = field(default=None, metadata={"bounds": (0.0, None)})
    mae: float | None = field(default=None, metadata={"bounds": (0.0, None)})
    sign_min: float | None = field(default=None, metadata={"bounds": (0.0, 1.0)})
    argmax_min: float | None = field(default=None, metadata={"bounds": (0.0, 1.0)})
    #: The output kind declared for the model (``output_kind``): a Fidelity whose kind was
    #: inferred is judged as this kind (:func:`with_kind`). ``None``: as measured.
    kind: str | None = None
    #: A set field the output kind does not gate is an error (:meth:`check_kind`), not skipped.
    strict: bool = False

    @classmethod
    def gate_fields(cls) -> tuple[Any, ...]:
        """The dataclass fields that gate (each with ``metadata["bounds"]``), in order: what a
        strategy's ``fidelity`` table and an FPGA target's ``fidelity`` option may set."""
        return tuple(f for f in fields(cls) if "bounds" in f.metadata)

    def gates(self) -> dict[str, float | None]:
        """The gate fields' values, by name."""
        return {f.name: getattr(self, f.name) for f in self.gate_fields()}

    def misapplied(self, kind: str) -> list[str]:
        """The set fields that do not apply to an output of ``kind``."""
        gated = GATED.get(kind, _ERRORS)
        return [k for k, metric in KIND_TOLERANCES.items()
                if getattr(self, k) is not None and metric not in gated]

    def check_kind(self, kind: str, source: str = "declared") -> None:
        """Raise :class:`ConfigError` when a set field does not apply to ``kind`` outputs."""
        bad = self.misapplied(kind)
        if not bad:
            return
        how = ("declared" if source == "declared" else
               f"inferred: {INFERRED_BECAUSE.get(kind, 'from the reference outputs')}")
        fits = sorted(k for k in KINDS if not self.misapplied(k))
        raise ConfigError(f"fidelity {' and '.join(bad)} does not apply to a {kind} output "
                          f"({how}); a {kind} output gates {', '.join(GATED.get(kind, _ERRORS))}. "
                          f"Drop {' and '.join(bad)}, or declare the output kind it is meant for "
                          f"(output_kind = one of {', '.join(fits)})")

    def violations(self, f: Fidelity) -> list[str]:
        """What ``f`` misses of this tolerance (empty: it passes). A ``strict`` tolerance
        raises :class:`ConfigError` when a set field does not apply to an output's kind."""
        if self.kind is not None and (f.kind, f.kind_source) != (self.kind, "declared"):
            f = with_kind(f, self.kind)
        for one in (f, *(f.outputs or {}).values()) if self.strict else ():
            self.check_kind(one.kind, one.kind_source)
        v = []
        g = set(f.gated)
        if "corr" in g and self.corr_min is not None and not f.corr >= self.corr_min:
            v.append(f"corr {f.corr:.6f} < {self.corr_min}")
        if "max_abs" in g and self.max_abs is not None and not f.max_abs <= self.max_abs:
            v.append(f"max_abs {f.max_abs:.3g} > {self.max_abs}")
        if "rel_err" in g and self.rel_err is not None and not f.rel_err <= self.rel_err:
            v.append(f"rel_err {f.rel_err:.3g} > {self.rel_err}")
        if "mae" in g and self.mae is not None and not f.mae <= self.mae:
            v.append(f"mae {f.mae:.3g} > {self.mae}")
        if "sign" in g and self.sign_min is not None and not f.sign_agree >= self.sign_min:
            v.append(f"sign agreement {f.sign_agree:.4f} < {self.sign_min} ({f.kind} output)")
        if ("argmax" in g and self.argmax_min is not None and f.argmax_agree is not None
                and not f.argmax_agree >= self.argmax_min):
            v.append(f"argmax agreement {f.argmax_agree:.4f} < {self.argmax_min} ({f.kind} output)")
        return v

    def passes(self, f: Fidelity) -> bool:
        return not self.violations(f)



#: Fidelity each precision family must meet against the fp32 reference: the policy that
#: ``hwb compile``'s gate, a fleet node's artifact import and the conformance kit all apply
#: (:func:`gate_violations`). ``rel_err`` is the max abs error over the reference's output
#: range. fp32 differs only by summation order; half precision by ~3 decimal digits; int8 and
#: fixed point by a quantisation step per layer (DOMAIN: correlation ≥ 0.98 is the
#: practitioners' floor for a compressed signal).
TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(corr_min=0.99999, rel_err=1e-4),
    "half": Tolerance(corr_min=0.999, rel_err=3e-2),
    "quantized": Tolerance(corr_min=0.98, rel_err=0.2),
}


#: The FPGA plugins' ``auto`` precision search's goal on calibration data (their option
#: ``fidelity``, hwb_plugins/_shared/fixed_point.py ``FidelityTarget``): tighter than the
#: quantized family's gate, because the search then keeps the cheapest type that meets it.
AUTO_SEARCH = Tolerance(corr_min=0.999, rel_err=0.01, sign_min=0.995, argmax_min=0.995)

#: What a new model version must meet against the serving one on live inputs before a swap
#: (``hwb serve``'s shadow check, :class:`hwbackends.serve.engine.EngineConfig`'s default
#: ``tolerance``): both are already gated against the reference, so this catches a version
#: that answers differently from what is served, not one that drifted a little.
SWAP_GATE = Tolerance(corr_min=0.999, rel_err=0.01)


def precision_family(precision: str) -> str:
    """``fp32`` | ``half`` (fp16, bf16, tf32, mixed) | ``quantized`` (int8*, uint8, int4,
    fixed-point). Unknown names count as ``quantized``, the loosest family."""
    p = precision.lower()
    if p in ("fp32", "float32", "f32"):
        return "fp32"
    if any(k in p for k in ("fp16", "bf16", "float16", "half", "tf32", "mixed")):
        return "half"
    return "quantized"


def family_tolerance(precision: str) -> Tolerance:
    """The :data:`TOLERANCES` entry of ``precision``'s family."""
    return TOLERANCES[precision_family(precision)]


def gate_violations(precision: str, f: Fidelity) -> list[str]:
    """What ``f`` misses of ``precision``'s family tolerance (empty: it passes the gate)."""
    return family_tolerance(precision).violations(f)
