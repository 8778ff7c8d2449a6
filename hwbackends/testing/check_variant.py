"""Per-variant checks: it compiles (labelled with the probe's mode), predicts the right shapes,
and matches the fp32 reference within its precision family's tolerance."""
from __future__ import annotations

import json

import numpy as np

from ..fidelity import compare, family_tolerance, gate_violations, precision_family
from .context import Conformance, ConformanceError, Variant


def check_compile(ctx: Conformance, v: Variant) -> str:
    """The zoo model compiles (or is refused with an UnsupportedError naming the layer/op),
    and the result is labelled with the mode the probe reported."""
    cm = ctx.compiled(v)
    av = ctx.availability()
    if cm.mode is not av.mode:
        raise ConformanceError(f"compiled variant says mode {cm.mode.value}, probe says {av.mode.value}")
    if cm.precision != v.precision or cm.target != ctx.target_name:
        raise ConformanceError(f"artifact is labelled {cm.variant}, asked for {ctx.target_name}:{v.precision}")
    d = cm.describe()
    json.dumps(d, default=str)  # metadata must serialise (reports, CLI --json)
    how = "cached" if cm.artifact.cached else f"built in {cm.artifact.compile_seconds:.1f} s"
    return f"{cm.variant} ({cm.mode.value}) {how}, {cm.artifact.size_bytes():,} bytes"


def check_predict(ctx: Conformance, v: Variant) -> str:
    """``predict`` returns float32 of the output shape for one sample and for a batch;
    ``predict_into`` fills ``out`` in place with the same values."""
    cm = ctx.compiled(v)
    m = ctx.model(v.model)
    xs = m.representative(7, seed=3)
    one = cm.predict(xs[0])
    if one.shape != cm.output.shape or one.dtype != np.float32:
        raise ConformanceError(f"predict(one sample) gave {one.dtype}{one.shape}; expected "
                               f"float32{cm.output.shape}")
    many = cm.predict(xs)
    if many.shape != (7, *cm.output.shape) or many.dtype != np.float32:
        raise ConformanceError(f"predict(7 samples) gave {many.dtype}{many.shape}; expected "
                               f"float32{(7, *cm.output.shape)}")
    if not np.isfinite(many).all():
        raise ConformanceError("predict returned NaN/Inf on finite inputs")
    b = cm.batch_size
    x = np.ascontiguousarray(np.resize(xs, cm.input.batched(b)), dtype=np.float32)
    out = np.full(cm.output.batched(b), np.nan, np.float32)
    ret = cm.predict_into(x, out)
    if ret is not None and ret is not out:
        raise ConformanceError("predict_into must write into out (and return None)")
    if not np.isfinite(out).all():
        raise ConformanceError("predict_into did not fill every element of out")
    again = cm.predict(x)
    if not np.allclose(out, again, rtol=1e-6, atol=1e-6):
        raise ConformanceError("predict_into and predict disagree on the same input "
                               f"(max diff {np.max(np.abs(out - again)):.3g})")
    if np.allclose(many[0], many[1:]):
        raise ConformanceError("every sample gives the same output: the input is ignored")
    return f"one {one.dtype}{one.shape}, batch {many.shape}, predict_into batch {b}"


def check_fidelity(ctx: Conformance, v: Variant) -> str:
    """Outputs match the source model's fp32 reference within the precision family's
    tolerance (:func:`hwbackends.fidelity.gate_violations`, the gate ``hwb compile`` applies),
    on inputs the compile never saw."""
    cm = ctx.compiled(v)
    m = ctx.model(v.model)
    xs = m.representative(256, seed=11)
    fam = precision_family(v.precision)
    f = compare(m.reference(xs), cm.predict(xs))
    bad = gate_violations(v.precision, f)
    if bad:
        raise ConformanceError(f"{cm.variant} on {v.model}: {'; '.join(bad)} (precision family "
                               f"{fam}, tolerance {family_tolerance(v.precision)}); measured {f}")
    return f"{fam}: {f}"
