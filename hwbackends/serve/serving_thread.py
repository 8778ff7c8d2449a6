"""The engine's serving thread: the request queue, micro-batch gathering and batch execution.

Callers (any number of threads) hand requests to the serving thread through a C-implemented
queue and wait on a per-request lock; the serving thread gathers what arrives within
``batch_timeout_us`` of the first waiting request (up to ``max_batch_size``), runs the active
version's :class:`~hwbackends.serve.batch_plan.BatchPlan` once (which holds the backend's
:func:`~hwbackends.exclusive.lock_for` lock, so no executor ever runs on two threads) and
hands each caller its row.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable

import numpy as np

from ..errors import ConfigError
from .batch_plan import BatchPolicy
from .metrics import EngineMetrics
from .request import DEADLINE, PENDING, STOPPED, Request, Unavailable
from .versions import Versions

log = logging.getLogger("hwbackends.serve")


class Batcher:
    """Queue + serving thread for one engine (see the module docstring)."""

    def __init__(self, name: str, versions: Versions, policy: BatchPolicy, metrics: EngineMetrics,
                 *, pin_cores: tuple[int, ...] | None, warmup: int):
        self.name = name
        self.versions = versions
        self.policy = policy
        self.metrics = metrics
        self.pin_cores = pin_cores
        self.warmup = warmup
        #: Median seconds of one warm-up call of the largest slot (set when the thread starts).
        self.warm_call_s = 0.0
        #: Batches the backend completed (it only grows; the breaker's progress test reads it).
        self.completed = 0
        self._q: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self.put = self._q.put

    def start(self, timeout: float) -> None:
        """Start the serving thread; returns once it is pinned and warm."""
        self._ready.clear()
        self._start_error = None
        self._thread = threading.Thread(target=self._serve, name=f"hwb-serve-{self.name}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise ConfigError(f"engine {self.name!r} did not finish warming up in {timeout:g} s")
        if self._start_error is not None:
            raise self._start_error

    def stop(self, timeout: float) -> None:
        """Stop the thread; requests still queued are answered ``engine-stopped``."""
        if self._thread is None:
            return
        self._q.put(None)
        self._thread.join(timeout)
        self._thread = None
        while True:
            try:
                r = self._q.get_nowait()
            except queue.Empty:
                break
            if r is not None:
                r.failure = STOPPED
                r.done.release()

    def _serve(self) -> None:
        try:
            if self.pin_cores is not None:
                os.sched_setaffinity(0, self.pin_cores)  # pid 0 = this thread on Linux
                self.metrics.set_pinned(tuple(sorted(os.sched_getaffinity(0))))
            self.warm_call_s = self.versions.active.plan.warmup(self.warmup)
        except BaseException as exc:
            self._start_error = ConfigError(f"engine {self.name!r} failed to start: "
                                            f"{type(exc).__name__}: {exc}")
            self._ready.set()
            return
        self._ready.set()
        while True:
            batch = self._gather()
            if batch is None:
                return
            if batch[-1] is None:  # stop arrived while gathering: run what came before it
                self.run(batch[:-1])  # type: ignore[arg-type]
                return
            self.run(batch)  # type: ignore[arg-type]

    def _gather(self) -> list[Request | None] | None:
        """The next batch (ending in ``None`` when a stop arrived mid-batch), or ``None``."""
        q = self._q
        first = q.get()
        if first is None:
            return None
        batch: list[Request | None] = [first]
        max_b = self.policy.max_batch_size
        if max_b > 1:
            # The batch closes batch_timeout_us after the first request *arrived*, so a
            # request that queued behind a running batch waits no longer than that.
            t_end = first.t0 + self.policy.batch_timeout_us * 1e-6
            while len(batch) < max_b:
                try:
                    r = q.get_nowait()
                except queue.Empty:
                    rem = t_end - time.perf_counter()
                    if rem <= 0:
                        break
                    try:
                        r = q.get(timeout=rem)
                    except queue.Empty:
                        break
                batch.append(r)
                if r is None:
                    break
        return batch

    def run(self, batch: list[Request]) -> None:
        """Run one batch on the active version and release every caller (serving thread, or
        the caller's own thread for an inline call)."""
        now = time.perf_counter()
        live = []
        for r in batch:
            if r.state != PENDING:
                continue
            if now > r.deadline:  # already too late: don't spend the model on it
                r.failure = DEADLINE
                r.done.release()
                continue
            live.append(r)
        if not live:
            return
        v = self.versions.active  # read once: a swap between batches never splits one
        self.metrics.batch(len(live), [now - r.t0 for r in live])
        deliver = _deliverer(live, self.versions.shadow, v.number)
        try:
            v.plan.run([r.x for r in live], deliver)
            self.completed += 1
        except Exception as exc:  # the backend failed this batch: each caller gets "unavailable"
            msg = f"backend {v.variant} failed: {type(exc).__name__}: {exc}"
            log.warning("%s: %s", self.name, msg)
            failed = Unavailable(msg)  # Status.UNAVAILABLE, with the backend's error
            for r in live:
                if r.y is None:
                    r.failure = failed
        for r in live:
            r.done.release()


def _deliverer(live: list[Request], shadow: Any, number: int) -> Callable[[int, np.ndarray, np.ndarray], None]:
    def deliver(start: int, xr: np.ndarray, yr: np.ndarray) -> None:
        for i in range(len(yr)):
            r = live[start + i]
            r.version = number  # the answer is bound to the version that computed it
            r.y = yr[i].copy()
        if shadow is not None:
            shadow.offer(number, xr, yr)
    return deliver
