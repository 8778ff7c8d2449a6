"""Fidelity each precision family must meet against the fp32 reference."""
from __future__ import annotations

from ..fidelity import Tolerance

#: Fidelity each precision family must meet against the fp32 reference. ``rel_err`` is the
#: max abs error over the reference's output range. fp32 differs only by summation order;
#: half precision by ~3 decimal digits; int8 and fixed point by a quantisation step per layer
#: (DOMAIN: correlation ≥ 0.98 is the practitioners' floor for a compressed signal).
TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(corr_min=0.99999, rel_err=1e-4),
    "half": Tolerance(corr_min=0.999, rel_err=3e-2),
    "quantized": Tolerance(corr_min=0.98, rel_err=0.2),
}


def precision_family(precision: str) -> str:
    """``fp32`` | ``half`` (fp16, bf16, tf32, mixed) | ``quantized`` (int8*, uint8, int4,
    fixed-point). Unknown names count as ``quantized``, the loosest family."""
    p = precision.lower()
    if p in ("fp32", "float32", "f32"):
        return "fp32"
    if any(k in p for k in ("fp16", "bf16", "float16", "half", "tf32", "mixed")):
        return "half"
    return "quantized"
