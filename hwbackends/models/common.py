"""What every format reader shares: bounded error text, checked names and static shapes, the
fingerprint digest."""
from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np

from ..errors import ModelError


def as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def module_of(obj: Any) -> str:
    return " ".join(c.__module__ for c in type(obj).__mro__)


def clip(text: str, limit: int = 300) -> str:
    """``text`` cut at a word boundary (never mid-word) with an ellipsis."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " …"


def unique_names(kind: str, names: Sequence[str], name: str) -> None:
    if len(set(names)) != len(names):
        raise ModelError(f"model {name!r} has {kind}s with the same name ({', '.join(names)}); "
                         f"give each {kind} its own name (keras.Input(name=...))")


def static_shape(shape: Sequence[Any], what: str, name: str) -> tuple[int, ...]:
    dims = tuple(shape)
    if any(d is None or (isinstance(d, int) and d < 0) or not isinstance(d, (int, np.integer)) for d in dims):
        raise ModelError(f"model {name!r} has a dynamic {what} shape {dims} beyond the batch "
                         f"dimension; compile needs static shapes (fix the window length)")
    return tuple(int(d) for d in dims)


def digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:32]
