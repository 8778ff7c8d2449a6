"""The reload check: a few inputs and the outputs an artifact gave for them, stored in its
signed manifest; every load re-runs them and refuses an artifact whose outputs changed."""
from __future__ import annotations

import base64
from typing import Any

import numpy as np

from ..compiled import CompiledModel
from ..models import Model
from ..specs import Availability
from ..target import Artifact, Target
from .request import as_tuple

#: Rows of the validation data whose outputs are stored with each artifact, its reload check
#: (in its signed manifest, so they are covered by the HMAC and no file is added to what the
#: target wrote).
RELOAD_CHECK_ROWS = 8


def _pack(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a, dtype=np.float32)
    return {"shape": list(a.shape), "f32": base64.b64encode(a.tobytes()).decode()}


def _unpack(d: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["f32"]), dtype=np.float32).reshape(d["shape"])


def make_reload_check(executor: Any, art: Artifact, tgt: Target, m: Model, val: Any) -> dict[str, Any]:
    """The reload check: a few inputs (one entry per input tensor), the artifact's outputs for them (flattened
    to one ``(n, total)`` array) and the tolerance a reload must meet:
    ``max(1e-3·(1+max|out|), ½·max|out − reference|)`` — the build's own error against the
    fp32 reference bounds how far a faithful reload may drift; another model is far outside."""
    cm = CompiledModel(executor, art, Availability.hardware("reload-check"), m.name, "pass",
                       tgt.static_batch)
    xs = tuple(np.ascontiguousarray(a[:RELOAD_CHECK_ROWS], dtype=np.float32) for a in as_tuple(val))
    out = _flat(cm.predict(xs))
    err = float(np.nanmax(np.abs(out - _flat(m.reference(xs))))) if out.size else 0.0
    tol = max(1e-3 * (1.0 + float(np.nanmax(np.abs(out)) if out.size else 0.0)), 0.5 * err)
    return {"xs": [_pack(a) for a in xs], "out": _pack(out), "tol": tol}


def _flat(ys: Any) -> np.ndarray:
    """Outputs (one array or several) as one ``(n, total)`` array (the reload check's stored outputs)."""
    parts = as_tuple(ys)
    return np.concatenate([np.asarray(p, np.float32).reshape(len(p), -1) for p in parts], axis=1)


def check_reload(executor: Any, art: Artifact, tgt: Target, check: Any) -> str | None:
    """``None`` when the loaded artifact reproduces its reload check's stored outputs, else
    what differs (a check without them, or of another layout, is a difference)."""
    try:
        xs = tuple(_unpack(d) for d in check["xs"])
        out, tol = _flat(_unpack(check["out"])), float(check["tol"])
    except (TypeError, KeyError, ValueError) as exc:
        return f"no usable stored outputs ({type(exc).__name__}: {exc})"
    cm = CompiledModel(executor, art, Availability.hardware("reload-check"), "reload-check", "pass",
                       tgt.static_batch)
    try:
        pred = _flat(cm.predict(xs))
    except Exception as exc:
        return f"predict on the stored inputs raised {type(exc).__name__}: {exc}"
    if pred.shape != out.shape:
        return f"output shape {pred.shape} != stored {out.shape}"
    diff = np.abs(pred - out)
    same = (diff <= tol) | (np.isnan(pred) & np.isnan(out))
    if not same.all():
        return f"max |output − stored output| {float(np.nanmax(diff)):.3g} > tolerance {tol:.3g}"
    return None
