"""Numerical fidelity of a compiled variant against the source model's fp32 reference."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Fidelity:
    """Agreement between a variant's outputs and the reference on ``n`` validation samples.

    ``rel_err`` is the max abs error over the reference's output range (peak to peak), so it
    compares across models with different output scales. ``sign_agree`` is the share of
    outputs whose sign matches (the trade direction of a signal); ``argmax_agree`` the share of
    samples whose largest output is the same (class decisions), ``None`` for one output.
    """

    n: int
    max_abs: float
    mae: float
    rel_err: float
    corr: float
    sign_agree: float
    argmax_agree: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        am = "" if self.argmax_agree is None else f" argmax={self.argmax_agree:.4f}"
        return (f"max_abs={self.max_abs:.3g} mae={self.mae:.3g} rel={self.rel_err:.3g} "
                f"corr={self.corr:.6f} sign={self.sign_agree:.4f}{am} (n={self.n})")


def compare(reference: np.ndarray, got: np.ndarray) -> Fidelity:
    ref = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    out = np.asarray(got, dtype=np.float64).reshape(len(got), -1)
    if ref.shape != out.shape:
        raise ValueError(f"reference shape {ref.shape} != output shape {out.shape}")
    err = np.abs(ref - out)
    rng = float(np.ptp(ref)) or 1.0
    a, b = ref.ravel(), out.ravel()
    if np.std(a) == 0 or np.std(b) == 0:
        corr = 1.0 if np.allclose(a, b) else 0.0
    else:
        corr = float(np.corrcoef(a, b)[0, 1])
    argmax = None
    if ref.shape[1] > 1:
        argmax = float(np.mean(ref.argmax(1) == out.argmax(1)))
    return Fidelity(
        n=len(ref), max_abs=float(err.max(initial=0.0)), mae=float(err.mean()) if err.size else 0.0,
        rel_err=float(err.max(initial=0.0)) / rng, corr=corr,
        sign_agree=float(np.mean(np.sign(a) == np.sign(b))) if a.size else 1.0,
        argmax_agree=argmax)


@dataclass(frozen=True)
class Tolerance:
    """What a variant must meet to be trusted. ``None`` fields are not checked."""

    corr_min: float | None = 0.999
    max_abs: float | None = None
    rel_err: float | None = None
    mae: float | None = None
    sign_min: float | None = None
    argmax_min: float | None = None

    def violations(self, f: Fidelity) -> list[str]:
        v = []
        if self.corr_min is not None and not f.corr >= self.corr_min:
            v.append(f"corr {f.corr:.6f} < {self.corr_min}")
        if self.max_abs is not None and not f.max_abs <= self.max_abs:
            v.append(f"max_abs {f.max_abs:.3g} > {self.max_abs}")
        if self.rel_err is not None and not f.rel_err <= self.rel_err:
            v.append(f"rel_err {f.rel_err:.3g} > {self.rel_err}")
        if self.mae is not None and not f.mae <= self.mae:
            v.append(f"mae {f.mae:.3g} > {self.mae}")
        if self.sign_min is not None and not f.sign_agree >= self.sign_min:
            v.append(f"sign agreement {f.sign_agree:.4f} < {self.sign_min}")
        if self.argmax_min is not None and f.argmax_agree is not None and not f.argmax_agree >= self.argmax_min:
            v.append(f"argmax agreement {f.argmax_agree:.4f} < {self.argmax_min}")
        return v

    def passes(self, f: Fidelity) -> bool:
        return not self.violations(f)
