"""One queued request, the serving :class:`Status`, the "signal unavailable" result, and
deadline validation.

A deadline miss is a *result* (:class:`Unavailable`), not an exception: a strategy skips the
tick and carries on. A deadline that cannot be a deadline (negative, NaN, infinite, below
:data:`MIN_DEADLINE_US`) is the caller's mistake: :class:`InputError`, never a miss, so it
cannot open the shared breaker.

What happened to a call travels as a :class:`Status`, never as its text: the engine, the
batcher, the shm poll loop (C) and the shm client all test the code. The codes are
``hwb_shm.h``'s (``HWB_SHM_STATUSES``), read from the C extension, which is built from that
header: Python defines no number of its own.
"""
from __future__ import annotations

import enum
import math
import threading
from typing import Any

import numpy as np

from ..errors import InputError

try:  # by name, not `from . import _shmloop`: the package __init__ imports this module
    from ._shmloop import STATUS as _CODES
    from ._shmloop import strerror as _strerror
except ImportError as exc:  # a checkout whose extension was never built
    raise ImportError(f"hwbackends.serve needs its C extension (hwbackends.serve._shmloop), "
                      f"which is not built: {exc}; reinstall with `pip install -e .` or run "
                      f"`python setup.py build_ext --inplace` (needs a C compiler)") from exc


class Status(enum.IntEnum):
    """The outcome of one serving call, with ``hwb_shm.h``'s codes (``HWB_SHM_<NAME>``): ≥ 0
    answered by the server, < 0 decided by a shared-memory client. :attr:`reason` is the
    header's ``hwb_shm_strerror`` text ("deadline", "breaker-open", "server-gone", ...)."""

    OK = _CODES["OK"]
    #: The server could not run it (the message says why: a backend error).
    UNAVAILABLE = _CODES["UNAVAILABLE"]
    #: NaN/Inf or wrong size: refused and counted by the server.
    BAD_INPUT = _CODES["BAD_INPUT"]
    #: The deadline passed before the answer.
    DEADLINE = _CODES["DEADLINE"]
    #: The engine's breaker is open: calls are shed while the backend recovers.
    BREAKER_OPEN = _CODES["BREAKER_OPEN"]
    #: The engine is stopping (or stopped).
    STOPPED = _CODES["STOPPED"]
    E_TIMEOUT = _CODES["E_TIMEOUT"]
    E_SERVER_GONE = _CODES["E_SERVER_GONE"]
    E_NOT_RESPONDING = _CODES["E_NOT_RESPONDING"]
    E_SHAPE = _CODES["E_SHAPE"]
    E_VERSION = _CODES["E_VERSION"]
    E_DTYPE = _CODES["E_DTYPE"]
    E_NOENT = _CODES["E_NOENT"]
    E_ACCESS = _CODES["E_ACCESS"]
    E_SLOTS_FULL = _CODES["E_SLOTS_FULL"]
    E_SYS = _CODES["E_SYS"]
    E_CLOSED = _CODES["E_CLOSED"]
    E_NOT_HWB = _CODES["E_NOT_HWB"]
    E_NAME = _CODES["E_NAME"]
    E_OWNER = _CODES["E_OWNER"]

    @property
    def reason(self) -> str:
        """``hwb_shm_strerror``'s text for this status: one wording for C and Python clients."""
        return str(_strerror(int(self)))


class Unavailable:
    """"Signal unavailable" for this call: falsy, with its :class:`Status` and the reason (the
    status's own text, or a message: a backend's error). Not an exception, so the hot path of
    a strategy stays a branch: ``if not engine.try_predict_into(x, out): ...``; a strategy
    that treats causes differently tests ``r.status``, never ``r.reason``."""

    __slots__ = ("reason", "status")

    def __init__(self, reason: str, status: Status = Status.UNAVAILABLE):
        self.reason = reason
        self.status = status

    @classmethod
    def of(cls, status: Status) -> "Unavailable":
        """The result for ``status`` with the status's own text as the reason."""
        return cls(status.reason, status)

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Unavailable({self.reason!r}, {self.status.name})"


DEADLINE = Unavailable.of(Status.DEADLINE)
BREAKER_OPEN = Unavailable.of(Status.BREAKER_OPEN)
STOPPED = Unavailable.of(Status.STOPPED)
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
    (a lock the serving thread releases once ``y`` or ``failure`` is set)."""

    __slots__ = ("x", "y", "t0", "deadline", "budget_us", "done", "state", "failure", "key",
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
        #: Why no ``y`` came (its :class:`Status` says which: deadline, stopped, backend
        #: error), set by the serving thread instead of ``y``.
        self.failure: Unavailable | None = None
        #: The inference-cache key, which names the version active at submit time.
        self.key: bytes | None = None
        #: The version that computed ``y`` (set by the serving thread with ``y``).
        self.version: int | None = None
        #: The serving thread's count of completed batches when this request was submitted: if it
        #: moved by the time the request missed its deadline, the backend was working (on work
        #: queued ahead), not stalled, and the miss does not count toward the breaker.
        self.progress0 = 0
