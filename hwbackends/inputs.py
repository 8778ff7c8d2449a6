"""The one input validation of the public API: ``CompiledModel.predict``, the router, the
serving engine and the shared-memory client all call :func:`as_batch` (or
:func:`as_sample`), so a wrong array gets the same clear :class:`InputError` everywhere.

The executor hot path (``predict_into``) does *not* come through here: it only checks shape
and dtype identity (see :class:`hwbackends.target.Executor`); these functions are for calls
that may allocate.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import InputError
from .specs import TensorSpec

#: ``reject``: NaN/Inf in an input is an InputError; ``pass``: let it through to the model.
NAN_POLICIES = ("reject", "pass")


def _as_float32(x: Any, spec: TensorSpec) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except Exception as exc:
        raise InputError(f"input is not array-like ({type(x).__name__}): {exc}") from exc
    if arr.dtype.kind not in "fiub":
        raise InputError(f"input has dtype {arr.dtype}; expected a numeric array convertible "
                         f"to {spec.dtype}")
    return arr


def _check_finite(arr: np.ndarray, nan_policy: str) -> None:
    if nan_policy == "reject" and not np.isfinite(arr).all():
        bad = int(np.size(arr) - np.isfinite(arr).sum())
        raise InputError(f"input contains {bad} NaN/Inf value(s); clean the features, or "
                         f"compile with nan_policy='pass' to let them through")


def as_batch(x: Any, spec: TensorSpec, nan_policy: str = "reject") -> tuple[np.ndarray, bool]:
    """``x`` as a C-contiguous float32 batch ``(n, *spec.shape)`` and whether it was one
    sample of shape ``spec.shape`` (then ``n == 1``). Raises :class:`InputError` naming what
    was expected."""
    arr = _as_float32(x, spec)
    shape = tuple(spec.shape)
    single = tuple(arr.shape) == shape
    if single:
        arr = arr[None]
    elif arr.ndim != len(shape) + 1 or tuple(arr.shape[1:]) != shape:
        raise InputError(f"input has shape {tuple(arr.shape)}; expected {shape} (one sample) "
                         f"or (n, {', '.join(map(str, shape))}) for a batch of n")
    if len(arr) == 0:
        raise InputError(f"input is an empty batch {tuple(arr.shape)}; pass at least one sample "
                         f"of shape {shape}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    _check_finite(arr, nan_policy)
    return arr, single


def as_sample(x: Any, spec: TensorSpec, nan_policy: str = "reject", *,
              where: str = "this endpoint") -> np.ndarray:
    """``x`` as one C-contiguous float32 sample of shape ``spec.shape`` (no batch axis), for
    per-request paths (engine, shm client) that batch requests themselves."""
    if (type(x) is np.ndarray and x.shape == tuple(spec.shape) and x.dtype == np.float32
            and x.flags.c_contiguous):
        _check_finite(x, nan_policy)
        return x
    arr = _as_float32(x, spec)
    if tuple(arr.shape) != tuple(spec.shape):
        raise InputError(f"input has shape {tuple(arr.shape)}; {where} takes one sample of "
                         f"shape {tuple(spec.shape)} per call")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    _check_finite(arr, nan_policy)
    return arr
