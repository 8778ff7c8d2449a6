"""A Dense over the flattened window, slid incrementally (hwb_plugins/cpu_native/sliding_conv.py's
head when the last stage is followed by ``Flatten`` then ``Dense``; the input itself, a conv
stack's output in either flatten layout — a channels-first flatten reaches the IR as a Dense
whose rows were put in channels-last order, layer_ir.walk.walk_flatten).

**Why it is exact.** The Dense's answer on a window is ``b + Σ_j W_j·v_j`` over the last
stage's positions ``j`` (``W_j``: the rows that multiply position ``j``). A *clean* position
(one whose receptive field reads no zero padding, sliding_conv.py) is one value ``U(τ)`` at a
fixed absolute time, the same in every window that holds it: in the window ending at
``τ + r + m·S`` it is position ``L-1-m`` (``S``: ticks between the stage's positions, ``r``:
its lag). So each window in flight keeps its own partial sum ``P_w``, one vector of the
Dense's width in a ring of ``M = r + (L-1)·S + 1`` slots (window ``w`` in slot ``w mod M``,
the stage ring's own index), and when ``U(τ)`` becomes known the prepare adds ``W_{L-1-m}·U(τ)``
into every window that will hold it as a clean position but not as its last. A window's
padded positions (the first ``B``) are its own: the prepare before its push adds them. The push
adds the last position's term, ``W_{L-1}·v_{L-1}``, and runs the head: it reads only the
weights that multiply the newest position (and when the stage lags the newest step, so that
the last position is known before the tick, the prepare adds that term too). Each window's sum starts from the bias when its
slot is freed (no running add/subtract of old terms), so nothing drifts over any number of
ticks; the sum's order differs from the full window's (within fp32 rounding, ~1e-7 relative).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hwbackends import layer_ir as ir

from .emit import Emitter


@dataclass
class FlatDense:
    """The Dense after a ``Flatten`` of the last stage (``length`` positions of ``channels``)."""

    dense: ir.Dense
    length: int
    channels: int

    @property
    def width(self) -> int:
        return int(self.dense.w.shape[1])

    def rows(self, j: int) -> np.ndarray:
        """``W_j``: the Dense's rows that multiply position ``j`` (channels-last flatten)."""
        c = self.channels
        return np.ascontiguousarray(self.dense.w[j * c:(j + 1) * c])


def take(layers: list[ir.Layer], length: int, channels: int) -> FlatDense | None:
    """A ``Flatten`` then a ``Dense`` of the flattened window at the start of ``layers``."""
    if len(layers) < 2 or not isinstance(layers[0], ir.Flatten) or not isinstance(layers[1], ir.Dense):
        return None
    d = layers[1]
    if d.w.ndim != 2 or d.w.shape[0] != length * channels:
        return None
    return FlatDense(d, length, channels)


def _pad(n: int) -> int:
    return -(-n // 16) * 16


def members(fd: FlatDense, slots: int) -> list[str]:
    """The window's ring of partial sums, one per window in flight (``w->P``)."""
    return [f"float P[{slots}][{_pad(fd.width)}] A64;"]


def retire(e: Emitter, fd: FlatDense, slot: str) -> None:
    """Slot ``slot`` (the window just answered) starts over as a later window's: the bias."""
    bias = e.const("B", fd.dense.b)
    e.line(f"for (int i = 0; i < {fd.width}; i++) w->P[{slot}][i] = {bias}[i];")


def spread(e: Emitter, fd: FlatDense, newest: str, head: str, slots: int, lag: int, stride: int,
           padded: int) -> None:
    """``newest`` (a clean value ``U(t)``, the last stage's at the current tick, ring slot
    ``head``) into every window that will hold it as clean position ``L-1-m``, ``m >= 1``."""
    n = fd.length
    for m in range(1, n - padded):
        off = lag + m * stride
        assert 1 <= off < slots, (off, slots)
        e.line(f"{{ int s = {head} + {off}; if (s >= {slots}) s -= {slots}; float *p = w->P[s];")
        e.matvec([(newest, fd.channels)], "p", fd.width, fd.rows(n - 1 - m), None, accumulate=True)
        e.line("}")


def own_terms(e: Emitter, fd: FlatDense, slot: str, row: Callable[[int], str], padded: int,
              last_known: bool) -> None:
    """The current window's own terms: its padded positions (``j < padded``, not the last),
    and the last position's when it is known before the tick (``last_known``: the stage lags
    the newest step, so nothing of the answer waits for ``x_t``)."""
    js = list(range(min(padded, fd.length - 1))) + ([fd.length - 1] if last_known else [])
    if not js:
        return
    e.line(f"{{ float *p = w->P[{slot}];")
    for j in js:
        e.matvec([(row(j), fd.channels)], "p", fd.width, fd.rows(j), None, accumulate=True)
    e.line("}")


def push(e: Emitter, fd: FlatDense, slot: str, last: str | None) -> str:
    """The push's part: the window's partial sum plus the last position's term (``last``:
    its row; None when :func:`own_terms` added it), in a new buffer (returned: the head's
    layers after the Dense read it)."""
    v = e.buf(_pad(fd.width))
    e.line(f"for (int i = 0; i < {fd.width}; i++) {v}[i] = w->P[{slot}][i];")
    if last is not None:
        e.matvec([(last, fd.channels)], v, fd.width, fd.rows(fd.length - 1), None, accumulate=True)
    return v
