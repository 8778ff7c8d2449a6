"""One queued request, the "signal unavailable" result, and deadline validation.

A deadline miss is a *result* (:class:`Unavailable`), not an exception: a strategy skips the
tick and carries on. A deadline that cannot be a deadline (negative, NaN, infinite, below
:data:`MIN_DEADLINE_US`) is the caller's mistake: :class:`InputError`, never a miss, so it
cannot open the shared breaker.
"""
from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from ..errors import InputError


class Unavailable:
    """"Signal unavailable" for this call: falsy, with the reason. Not an exception, so the
    hot path of a strategy stays a branch: ``if not engine.try_predict_into(x, out): ...``."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Unavailable({self.reason!r})"


DEADLINE = Unavailable("deadline")
BREAKER_OPEN = Unavailable("breaker-open")
STOPPED = Unavailable("engine-stopped")
OK = True

PENDING, DONE, ABANDONED = 0, 1, 2

#: Deadlines are whole microseconds or more (a smaller one is a unit mistake: seconds or ns
#: passed as µs) and at most an hour (``None`` means "wait for the answer").
MIN_DEADLINE_US = 1.0
MAX_DEADLINE_US = 3600e6


def check_deadline_us(d: Any, where: str = "deadline_us") -> float | None:
    """``d`` as a float number of µs, or ``None``; raises :class:`InputError` for anything that
    is not a finite deadline in [MIN_DEADLINE_US, MAX_DEADLINE_US]."""
    if d is None:
        return None
    try:
        v = float(d)
    except (TypeError, ValueError):
        raise InputError(f"{where} must be a number of microseconds or None, got {d!r}") from None
    if not math.isfinite(v) or not MIN_DEADLINE_US <= v <= MAX_DEADLINE_US:
        raise InputError(f"{where} = {d!r}: expected a finite number of microseconds from "
                         f"{MIN_DEADLINE_US:g} to {MAX_DEADLINE_US:g}, or None (no deadline)")
    return v


class Request:
    """One sample handed from a caller to the serving thread. The caller waits on ``done``
    (a lock the serving thread releases once ``y`` or ``err`` is set)."""

    __slots__ = ("x", "y", "t0", "deadline", "budget_us", "done", "state", "err", "key",
                 "version", "progress0")

    def __init__(self, x: np.ndarray, t0: float, budget_us: float | None):
        self.x = x
        self.y: np.ndarray | None = None
        self.t0 = t0
        self.budget_us = budget_us
        self.deadline = t0 + budget_us * 1e-6 if budget_us is not None else float("inf")
        self.done = threading.Lock()
        self.done.acquire()
        self.state = PENDING
        self.err: str | None = None
        #: The inference-cache key, which names the version active at submit time.
        self.key: bytes | None = None
        #: The version that computed ``y`` (set by the serving thread with ``y``).
        self.version: int | None = None
        #: The serving thread's count of completed batches when this request was submitted: if it
        #: moved by the time the request missed its deadline, the backend was working (on work
        #: queued ahead), not stalled, and the miss does not count toward the breaker.
        self.progress0 = 0
