"""Input validation for the public API: ``CompiledModel.predict``, the router, the
serving engine and the shared-memory client all call :func:`as_batches` (per tensor
:func:`as_batch`, or :func:`as_sample` for one request), so a wrong array gets the same clear
:class:`InputError` everywhere.

The executor hot path (``predict_into``) does *not* come through here: it only checks shape
and dtype identity (see :class:`hwbackends.target.Executor`); these functions are for calls
that may allocate.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .errors import InputError
from .specs import TensorSpec

#: ``reject``: NaN/Inf in an input is an InputError; ``pass``: let it through to the model.
NAN_POLICIES = ("reject", "pass")


def _as_float32(x: Any, spec: TensorSpec) -> np.ndarray:
    if isinstance(x, dict):
        raise InputError(f"input is a dict (keys {', '.join(map(str, x))}); this model takes one "
                         f"input ({spec.name!r}, samples of shape {tuple(spec.shape)}): pass the "
                         f"array itself")
    try:
        arr = np.asarray(x)
    except Exception as exc:
        raise InputError(f"input is not array-like ({type(x).__name__}): {exc}") from exc
    if arr.dtype.kind not in "fiub":
        raise InputError(f"input has dtype {arr.dtype}; expected a numeric array convertible "
                         f"to {spec.dtype}")
    return arr


def _check_finite(arr: np.ndarray, nan_policy: str, given: np.ndarray | None = None) -> None:
    """NaN/Inf in float32 ``arr`` refused under ``reject``; ``given``, the array before its
    conversion to float32, tells values beyond float32's range from NaN/Inf the caller sent."""
    if nan_policy == "reject" and not np.isfinite(arr).all():
        bad = int(np.size(arr) - np.isfinite(arr).sum())
        if given is not None and given.dtype.kind == "f" and given.dtype.itemsize > 4:
            over = int(np.size(given) - np.isfinite(given).sum())
            if over < bad:
                raise InputError(f"input has {bad - over} value(s) beyond float32's range (up to "
                                 f"{float(np.nanmax(np.abs(given[np.isfinite(given)]))):.3g}); "
                                 f"the models take float32 inputs: scale the features into "
                                 f"float32's range (±3.4e38)")
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
    given, arr = arr, np.ascontiguousarray(arr, dtype=np.float32)
    _check_finite(arr, nan_policy, given)
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
    given, arr = arr, np.ascontiguousarray(arr, dtype=np.float32)
    _check_finite(arr, nan_policy, given)
    return arr


def _named(e: InputError, spec: TensorSpec) -> InputError:
    """``e`` with its message starting ``input 'NAME'`` instead of ``input``."""
    msg = str(e)
    if msg.startswith("input "):
        msg = f"input {spec.name!r} " + msg[len("input "):]
    return InputError(msg)


def as_batches(x: Any, specs: Sequence[TensorSpec],
               nan_policy: str = "reject") -> tuple[np.ndarray, ...]:
    """Every input as a tuple of C-contiguous float32 batches, one per spec, all with the
    same number of samples ``n`` (one sample per tensor gives ``n == 1``): the edge where
    arrays, tuples and dicts become the one internal shape.

    ``x`` is a tuple/list with one array per input in ``specs`` order, a dict keyed by input
    name, or (one input) the array itself. Raises :class:`InputError`, naming the tensor when
    there are several (``input 'state' has shape …``)."""
    names = [s.name for s in specs]
    one = len(specs) == 1
    if isinstance(x, dict) and not (one and set(x) != {names[0]}):
        missing = [n for n in names if n not in x]
        extra = sorted(str(k) for k in x if k not in names)
        if missing or extra:
            raise InputError(f"inputs are keyed {sorted(map(str, x))}; the model takes "
                             f"{names}" + (f" (missing {missing})" if missing else "")
                             + (f" (unknown {extra})" if extra else ""))
        items = [x[n] for n in names]
    elif isinstance(x, (tuple, list)) and not (one and not _tuple_of_arrays(x)):
        items = list(x)
    elif one:  # the array itself (or anything array-like: a nested list is one array)
        items = [x]
    else:
        raise InputError(f"this model takes {len(specs)} inputs ({', '.join(names)}); pass a "
                         f"tuple of {len(specs)} arrays in that order, or a dict keyed by name (to "
                         f"hwb predict: a .npz with one array per name); "
                         f"got one {type(x).__name__}")
    if len(items) != len(specs):
        raise InputError(f"got {len(items)} input arrays; the model takes {len(specs)} "
                         f"({', '.join(names)}), in that order")
    arrays: list[np.ndarray] = []
    singles: list[bool] = []
    for item, spec in zip(items, specs, strict=True):
        try:
            arr, single = as_batch(item, spec, nan_policy)
        except InputError as e:
            raise (e if one else _named(e, spec)) from None
        arrays.append(arr)
        singles.append(single)
    counts = {len(a) for a in arrays}
    if len(counts) > 1 or len(set(singles)) > 1:
        got = ", ".join(f"{s.name}: {tuple(np.shape(i))}" for s, i in zip(specs, items, strict=True))
        raise InputError(f"inputs have different numbers of samples ({got}); every input needs "
                         f"the same n (or all one sample each)")
    return tuple(arrays)


def _tuple_of_arrays(x: tuple | list) -> bool:
    """Whether a tuple/list given for a one-input model is the tuple form (a tuple of one,
    or a list of one ndarray) rather than one array written as a (nested) list."""
    return len(x) == 1 and (isinstance(x, tuple) or isinstance(x[0], np.ndarray))


def is_single(x: Any, specs: Sequence[TensorSpec]) -> bool:
    """Whether ``x``, already validated by :func:`as_batches`, was one sample per tensor (no
    batch axis)."""
    if isinstance(x, dict) and specs[0].name in x:
        first = x[specs[0].name]
    elif isinstance(x, (tuple, list)) and (len(specs) > 1 or _tuple_of_arrays(x)):
        first = x[0]
    else:
        first = x
    return tuple(np.shape(first)) == tuple(specs[0].shape)
