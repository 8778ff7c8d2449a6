"""JSON that strict parsers accept: no ``NaN`` / ``Infinity`` tokens.

Python's ``json`` writes a float NaN as the bare token ``NaN``, which ``JSON.parse``, ``jq``
and most other parsers reject. What hwb writes (results files, ``--json``) goes through
:func:`dumps`: every non-finite float becomes ``null``, and the object holding it gets a
``"null_reasons"`` entry saying, per key, what the value was and why (``"p50_us": "NaN: no
samples"``). :func:`restore` turns such an object back into the NaN / inf values, so a
reader computes with the same numbers the writer had.
"""
from __future__ import annotations

import json
import math
from typing import Any

#: The key, in an object that held non-finite floats, naming each one and why.
REASONS = "null_reasons"


def _token(x: float) -> str:
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _why(parent: dict[str, Any], x: float) -> str:
    if math.isnan(x):
        if parent.get("n") == 0:
            return "NaN: no samples"
        return "NaN: undefined on these samples (e.g. a correlation with a constant output)"
    return f"{_token(x)}: unbounded"


def _strip(v: Any) -> tuple[Any, str | None]:
    """``v`` with its non-finite floats as ``None``, and the token of the first one (or None)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None, _token(v)
    if isinstance(v, dict):
        return sanitize(v), None
    if isinstance(v, (list, tuple)):
        out, first = [], None
        for item in v:
            s, tok = _strip(item)
            out.append(s)
            first = first or tok
        return out, first
    return v, None


def sanitize(obj: Any) -> Any:
    """``obj`` (dicts, lists, scalars) with every non-finite float as ``None`` and a
    ``null_reasons`` entry in each object that held one directly or in a list under a key."""
    if not isinstance(obj, dict):
        return _strip(obj)[0]
    out: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    for k, v in obj.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[k], reasons[str(k)] = None, _why(obj, v)
            continue
        out[k], tok = _strip(v)
        if tok is not None:
            reasons[str(k)] = f"{tok}: entries held as null (undefined or unmeasured)"
    if reasons:
        out[REASONS] = {**(obj.get(REASONS) or {}), **reasons}
    return out


def dumps(obj: Any, **kw: Any) -> str:
    """``json.dumps`` of :func:`sanitize`'d ``obj``; raises on any non-finite float left."""
    kw.setdefault("default", str)
    return json.dumps(sanitize(obj), allow_nan=False, **kw)


def _unstrip(v: Any, tok: str) -> Any:
    if v is None:
        return float(tok.replace("Infinity", "inf"))
    if isinstance(v, list):
        return [_unstrip(x, tok) for x in v]
    return restore(v)


def restore(obj: Any) -> Any:
    """The inverse of :func:`sanitize`: ``null`` back to NaN / ±inf where ``null_reasons``
    names the key (a list under such a key: its nulls become NaN)."""
    if isinstance(obj, list):
        return [restore(x) for x in obj]
    if not isinstance(obj, dict):
        return obj
    reasons = obj.get(REASONS)
    if not isinstance(reasons, dict):
        return {k: restore(v) for k, v in obj.items()}
    out = {}
    for k, v in obj.items():
        if k == REASONS:
            continue
        why = reasons.get(k)
        if isinstance(why, str):
            tok = why.split(":", 1)[0]
            tok = tok if tok in ("NaN", "Infinity", "-Infinity") else "NaN"
            out[k] = _unstrip(v, tok)
        else:
            out[k] = restore(v)
    return out
