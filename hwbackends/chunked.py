"""Chunked predict: any number of samples through a fixed-batch ``predict_into``.

``CompiledModel.predict`` and ``Router.predict`` both serve "n samples, any n" on top of a
hot path that takes exactly ``(batch_size, *spec.shape)`` per tensor: full chunks are copied
into one preallocated batch, the last partial one is zero-padded and its padding rows'
outputs are dropped. Tensors travel as tuples (one array per tensor, a model with one tensor
each way included): the caller adapts a single-array ``predict_into`` at its edge.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .specs import TensorSpec

#: A ``predict_into`` on tuples: one input array per input spec, one buffer per output spec.
TupleCall = Callable[[tuple[np.ndarray, ...], tuple[np.ndarray, ...]], None]


def tuple_call(predict_into: Callable[..., None], single: bool) -> TupleCall:
    """``predict_into`` as a call on tuples: itself for a variant with several tensors, else
    an adapter over its single-array form (for the allocating paths, not the hot path)."""
    if not single:
        return predict_into

    def one(xs: tuple[np.ndarray, ...], outs: tuple[np.ndarray, ...]) -> None:
        predict_into(xs[0], outs[0])
    return one


def predict_in_batches(predict_into: TupleCall, xs: tuple[np.ndarray, ...], batch_size: int,
                       inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
                       static_batch: bool = True,
                       xbufs: tuple[np.ndarray, ...] | None = None,
                       ybufs: tuple[np.ndarray, ...] | None = None) -> tuple[np.ndarray, ...]:
    """One ``(n, *spec.shape)`` array per output for already validated float32 batches ``xs``
    (one per input, ``n`` samples each). ``static_batch=False``: ``predict_into`` takes any
    batch, one call. ``xbufs``/``ybufs``: reusable ``(batch_size, …)`` buffers per tensor
    (allocated here when not given)."""
    n, b = len(xs[0]), batch_size
    res = tuple(np.empty((n, *s.shape), dtype=np.float32) for s in outputs)
    if n == b or not static_batch:
        predict_into(xs, res)
        return res
    xb = xbufs if xbufs is not None else tuple(np.zeros(s.batched(b), np.float32) for s in inputs)
    yb = ybufs if ybufs is not None else tuple(np.zeros(s.batched(b), np.float32) for s in outputs)
    for i in range(0, n, b):
        k = min(b, n - i)
        for buf, x in zip(xb, xs, strict=True):
            buf[:k] = x[i:i + k]
            if k < b:
                buf[k:] = 0.0  # pad the last partial batch; its padding rows are dropped
        predict_into(xb, yb)
        for r, y in zip(res, yb, strict=True):
            r[i:i + k] = y[:k]
    return res


def as_returned(ys: tuple[np.ndarray, ...], single: bool) -> Any:
    """Outputs as the public ``predict`` returns them (the edge): without the batch axis when
    the input was one sample, and the array itself when the model has one output."""
    if single:
        ys = tuple(y[0] for y in ys)
    return ys[0] if len(ys) == 1 else ys


def public(tensors: tuple[np.ndarray, ...], multi_io: bool) -> Any:
    """Tensors as a variant's ``predict_into`` takes them (the edge): the tuple for a variant
    with several inputs or outputs, else its one array."""
    return tensors if multi_io else tensors[0]
