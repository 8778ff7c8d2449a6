"""The one chunked predict: any number of samples through a fixed-batch ``predict_into``.

``CompiledModel.predict`` and ``Router.predict`` both serve "n samples, any n" on top of a
hot path that takes exactly ``(batch_size, *input)``: full chunks are copied into one
preallocated batch, the last partial one is zero-padded and its padding rows' outputs are
dropped.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .specs import TensorSpec


def predict_in_batches(predict_into: Callable[[np.ndarray, np.ndarray], None], x: np.ndarray,
                       batch_size: int, inp: TensorSpec, outp: TensorSpec, *,
                       static_batch: bool = True, xbuf: np.ndarray | None = None,
                       ybuf: np.ndarray | None = None) -> np.ndarray:
    """Outputs ``(n, *outp.shape)`` for an already validated float32 batch ``x`` of ``n``
    samples. ``static_batch=False``: ``predict_into`` takes any batch, one call. ``xbuf``/
    ``ybuf``: reusable ``(batch_size, …)`` buffers (allocated here when not given)."""
    n, b = len(x), batch_size
    out = np.empty((n, *outp.shape), dtype=np.float32)
    if n == b or not static_batch:
        predict_into(x, out)
        return out
    xb = xbuf if xbuf is not None else np.zeros(inp.batched(b), np.float32)
    yb = ybuf if ybuf is not None else np.zeros(outp.batched(b), np.float32)
    for i in range(0, n, b):
        chunk = x[i:i + b]
        k = len(chunk)
        xb[:k] = chunk
        if k < b:
            xb[k:] = 0.0  # pad the last partial batch; its padding rows are dropped
        predict_into(xb, yb)
        out[i:i + k] = yb[:k]
    return out


def predict_in_batches_multi(predict_into: Callable[[tuple, tuple], None],
                             xs: tuple[np.ndarray, ...], batch_size: int,
                             inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *,
                             static_batch: bool = True,
                             xbufs: tuple[np.ndarray, ...] | None = None,
                             ybufs: tuple[np.ndarray, ...] | None = None) -> tuple[np.ndarray, ...]:
    """:func:`predict_in_batches` for a multi-IO ``predict_into(xs, outs)``: every input
    tensor is chunked and padded alike, every output gets its ``(n, *spec.shape)`` array."""
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
                buf[k:] = 0.0
        predict_into(xb, yb)
        for r, y in zip(res, yb, strict=True):
            r[i:i + k] = y[:k]
    return res
