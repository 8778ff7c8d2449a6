"""The one chunked predict: any number of samples through a fixed-batch ``predict_into``.

``CompiledModel.predict`` and ``Router.predict`` both serve "n samples, any n" on top of a
hot path that takes exactly ``(batch_size, *input)``: full chunks are copied into one
preallocated batch, the last partial one is zero-padded and its padding rows' outputs are
dropped.
"""
from __future__ import annotations

from typing import Callable

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
