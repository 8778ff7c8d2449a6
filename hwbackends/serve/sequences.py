"""Sequences: a client's correlation id selects one window of ``cm.sliding(streams=N)`` (or
one stream of ``cm.streaming(streams=N)``), as Triton's sequence batcher routes a correlation
id to one stateful slot.

Each request of a sequence is one tick (``input.shape[1:]`` floats). A request flagged START
allocates a free window for its id (a START for an id already live empties that id's window
and starts again); one flagged END is answered, then its window is freed. A request whose id
has no live window and no START, or a START when every window is taken, is refused with
:class:`SequenceError`, and nothing is pushed. A window whose id sent nothing for ``idle_s``
is reclaimed when a START finds no free one (Triton's ``max_sequence_idle_microseconds``), so
a client that never sends END cannot hold windows forever; its next tick is then "unknown".

Correlation ids are what the protocol carries: a positive 64-bit integer or a non-empty
string (at most :data:`MAX_ID_CHARS` characters). The windows' object is one caller at a time,
so every tick holds one lock; a recompute form calls the compiled model's ``predict_into``,
so the lock is the executor's own (:func:`hwbackends.exclusive.lock_for`), shared with the
engine serving that model.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import InputError
from ..exclusive import lock_for
from ..sliding import Windows

#: The longest string correlation id accepted.
MAX_ID_CHARS = 256
#: How long a live sequence may stay silent before a START that finds no free window takes it.
DEFAULT_IDLE_S = 60.0


class SequenceError(InputError):
    """A sequence request the windows cannot take: ``kind`` is ``"unknown"`` (no live window
    for this id and no START), ``"full"`` (a START when every window is live) or ``"bad"``
    (an id or flag that is not one)."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def check_correlation_id(cid: Any) -> int | str:
    """``cid`` as a correlation id (a positive int below 2**64, or a non-empty string of at most
    :data:`MAX_ID_CHARS` characters), else :class:`SequenceError`."""
    if isinstance(cid, (int, np.integer)) and not isinstance(cid, bool):
        if 0 < int(cid) < 1 << 64:
            return int(cid)
    elif isinstance(cid, str) and 0 < len(cid) <= MAX_ID_CHARS:
        return cid
    raise SequenceError(f"sequence_id {cid!r:.80}: expected a positive 64-bit integer or a "
                        f"string of 1 to {MAX_ID_CHARS} characters (0 means no sequence)", "bad")


class Sequences:
    """Correlation ids → windows of one :class:`~hwbackends.sliding.Windows` (see the module
    docstring). ``model`` is the compiled model the windows belong to (whose executor lock
    every tick holds)."""

    def __init__(self, windows: Windows, model: Any, *, idle_s: float = DEFAULT_IDLE_S):
        if not (isinstance(idle_s, (int, float)) and 0 < idle_s < 1e7):
            raise InputError(f"idle_s must be a positive number of seconds, got {idle_s!r}")
        self.windows = windows
        self.idle_s = float(idle_s)
        self.step_shape = tuple(windows.step_shape)
        self.output_shape = tuple(windows.output_shape)
        self.stateful = windows.stateful
        self._lock = lock_for(model)
        self._live: dict[int | str, int] = {}
        self._last: list[float] = [0.0] * windows.streams
        self._free = list(range(windows.streams - 1, -1, -1))
        self.started = self.ended = self.reclaimed = self.ticks = 0

    @property
    def capacity(self) -> int:
        return self.windows.streams

    @property
    def live(self) -> int:
        return len(self._live)

    def _allocate(self, cid: int | str, now: float) -> int:
        if not self._free:
            idle = [(self._last[s], c) for c, s in self._live.items() if now - self._last[s] > self.idle_s]
            if idle:
                _, oldest = min(idle, key=lambda t: t[0])
                self._free.append(self._live.pop(oldest))
                self.reclaimed += 1
        if not self._free:
            raise SequenceError(
                f"sequence {cid!r:.80}: all {self.capacity} sequence windows are live (none idle "
                f"for {self.idle_s:g} s); end a sequence (sequence_end) before starting another, "
                f"or serve more windows (hwb serve --sequences N)", "full")
        return self._free.pop()

    def tick(self, cid: Any, x: np.ndarray, out: np.ndarray, *, start: bool = False,
             end: bool = False) -> int:
        """Push tick ``x`` (float32, :attr:`step_shape`) into ``cid``'s window and write its
        answer into ``out`` (:attr:`output_shape`); returns the window's index. START allocates
        (or empties) the window first; END frees it after the answer."""
        cid = check_correlation_id(cid)
        now = time.monotonic()
        with self._lock:
            slot = self._live.get(cid)
            if start:
                if slot is None:
                    slot = self._allocate(cid, now)
                    self._live[cid] = slot
                    self.started += 1
                self.windows.reset(slot)
            elif slot is None:
                raise SequenceError(
                    f"sequence {cid!r:.80} is not live (never started, ended, or reclaimed after "
                    f"{self.idle_s:g} s idle): send its first tick with sequence_start=true", "unknown")
            try:
                self.windows.push_into(slot, x, out)
            finally:
                self._last[slot] = now
                if end:
                    del self._live[cid]
                    self._free.append(slot)
                    self.ended += 1
            self.ticks += 1
            return slot

    def stats(self) -> dict[str, Any]:
        return {"windows": self.capacity, "live": self.live, "started": self.started,
                "ended": self.ended, "reclaimed": self.reclaimed, "ticks": self.ticks,
                "form": self.windows.form, "stateful": self.stateful, "idle_s": self.idle_s}

