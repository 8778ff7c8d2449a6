"""The model versions of one engine: the one serving, the previous one (for rollback), the
history, and the shadow collector a swap installs. The public seam between the engine, its
serving thread (which reads :attr:`Versions.active` and :attr:`Versions.shadow` once per batch)
and :func:`~hwbackends.serve.lifecycle.run_swap`.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .batch_plan import BatchPlan

log = logging.getLogger("hwbackends.serve")


@dataclass
class Version:
    """One model version an engine can serve."""

    number: int
    plan: BatchPlan
    source: str
    created: float = field(default_factory=time.time)

    @property
    def variant(self) -> str:
        return self.plan.variant

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.number, "variant": self.variant, "source": self.source,
                "batch_sizes": self.plan.sizes, "created": self.created}


class ShadowCollector:
    """Live inputs and the serving version's outputs, copied by the serving thread."""

    def __init__(self, version: int, n: int, in_shape: tuple[int, ...], out_shape: tuple[int, ...]):
        self.version = version
        self.n = n
        self.x = np.empty((n, *in_shape), np.float32)
        self.y = np.empty((n, *out_shape), np.float32)
        self.k = 0
        self.full = threading.Event()

    def offer(self, version: int, x_rows: np.ndarray, y_rows: np.ndarray) -> None:
        """Serving thread only (single writer)."""
        if version != self.version or self.k >= self.n:
            return
        m = min(len(x_rows), self.n - self.k)
        self.x[self.k:self.k + m] = x_rows[:m]
        self.y[self.k:self.k + m] = y_rows[:m]
        self.k += m
        if self.k >= self.n:
            self.full.set()


class Versions:
    """Active/previous versions and history; ``on_change(kind, version)`` runs after every
    switch (the engine clears its cache and counts the swap there)."""

    def __init__(self, plan: BatchPlan, source: str,
                 on_change: Callable[[str, "Version"], None] = lambda kind, v: None):
        self._counter = 0
        self.active = Version(self.next_number(), plan, source)
        self.previous: Version | None = None
        self.history: list[dict[str, Any]] = [self.active.to_dict()]
        #: Set by a swap while it collects live traffic; the serving thread offers each batch.
        self.shadow: ShadowCollector | None = None
        self._on_change = on_change
        self._watchers: list[Callable[[str, Version], None]] = []
        self._lock = threading.Lock()  # install vs rollback

    def watch(self, fn: Callable[[str, "Version"], None]) -> Callable[[], None]:
        """Also call ``fn(kind, version)`` after every switch (in the switching thread; the
        shm server's native fast path follows the serving version this way). Returns the
        function that stops the calls."""
        self._watchers.append(fn)

        def stop() -> None:
            if fn in self._watchers:
                self._watchers.remove(fn)
        return stop

    def _changed(self, kind: str, v: "Version") -> None:
        for fn in list(self._watchers):  # first: the fast path leaves the old version at once
            fn(kind, v)
        self._on_change(kind, v)

    def next_number(self) -> int:
        self._counter += 1
        return self._counter

    def install(self, v: Version) -> None:
        """Serve ``v`` from the next batch on (one reference assignment; in-flight batches
        finish on the version they started with)."""
        with self._lock:
            self.previous, self.active = self.active, v
            self.history.append(v.to_dict())
        self._changed("accepted", v)
        log.info("now serving version %d (%s)", v.number, v.variant)

    def rollback(self) -> Version | None:
        """Serve the previous version again; ``None`` when there is none."""
        with self._lock:
            if self.previous is None:
                return None
            self.previous, self.active = self.active, self.previous
            self.history.append({**self.active.to_dict(), "rollback": True})
        self._changed("rollback", self.active)
        return self.active
