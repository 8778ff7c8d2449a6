"""A circuit breaker, shared by the serving engine and the router's lanes.

``failures`` consecutive failures open it; it stays open ``reset_s`` seconds, then it is
*half-open*: the next call goes through as a retry — a success closes it, a failure re-opens
it at once. Callers decide what a failure is (the engine counts backend errors and deadline
misses the backend caused — a fair budget during which the backend completed no batch — never
a client's own input, and never a miss behind work queued ahead while batches kept completing;
see docs/serving.md).

Not locked: a lost update between two racing callers only shifts the count by one, and
the state a reader sees is always one of the three.
"""
from __future__ import annotations

import time
from enum import Enum
from typing import Callable


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class Breaker:
    """Consecutive-failure breaker with a timed half-open retry (see the module docstring)."""

    __slots__ = ("failures", "reset_s", "consecutive", "retry_at", "_state", "_clock")

    def __init__(self, failures: int, reset_s: float, clock: Callable[[], float] = time.monotonic):
        if failures < 1:
            raise ValueError(f"a breaker needs failures ≥ 1, got {failures}")
        self.failures = failures
        self.reset_s = reset_s
        self.consecutive = 0
        #: When an open breaker turns half-open (``clock()`` time); 0 while closed.
        self.retry_at = 0.0
        self._state = BreakerState.CLOSED
        self._clock = clock

    @property
    def state(self) -> BreakerState:
        """The state now: an open breaker whose ``reset_s`` has passed reads half-open."""
        if self._state is BreakerState.OPEN and self._clock() >= self.retry_at:
            self._state = BreakerState.HALF_OPEN
        return self._state

    def allows(self) -> bool:
        """Whether a call may go through now (closed, or half-open for a retry)."""
        return self._state is BreakerState.CLOSED or self.state is BreakerState.HALF_OPEN

    def failure(self) -> bool:
        """Count one failure; ``True`` when this one opened the breaker."""
        self.consecutive += 1
        st = self.state
        if st is BreakerState.OPEN:
            return False
        if st is BreakerState.HALF_OPEN or self.consecutive >= self.failures:
            self.trip()
            return True
        return False

    def success(self) -> None:
        """A call went through: the count restarts and a half-open breaker closes."""
        self.consecutive = 0
        if self._state is not BreakerState.CLOSED and self.state is BreakerState.HALF_OPEN:
            self._state = BreakerState.CLOSED
            self.retry_at = 0.0

    def trip(self) -> None:
        """Open now (for ``reset_s``)."""
        self._state = BreakerState.OPEN
        self.retry_at = self._clock() + self.reset_s
        self.consecutive = 0

    def half_open(self) -> None:
        """Half-open now: the next failure re-opens it at once, a success closes it (the
        router's retry of a variant taken out for its latency)."""
        self._state = BreakerState.HALF_OPEN

    def close(self) -> None:
        self._state = BreakerState.CLOSED
        self.consecutive = 0
        self.retry_at = 0.0

    @property
    def is_open(self) -> bool:
        return self.state is BreakerState.OPEN

    def __repr__(self) -> str:
        return f"Breaker({self.state.value}, {self.consecutive}/{self.failures})"
