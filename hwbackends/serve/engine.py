"""The in-process serving engine: one serving thread per strategy, micro-batching, inference
cache, per-call deadlines with a breaker, optional core pinning, hot swap.

    eng = Engine(hwb.compile(model, "cpu.litert"), EngineConfig.preset("latency"), strategy="mom")
    eng.start()                                   # warms up, then serves
    r = eng.predict_into(x, out, deadline_us=200) # True, or an Unavailable (falsy) result
    if not r: skip_this_tick(r.reason)

Callers (any number of threads) hand requests to the serving thread through a C-implemented
queue and wait on a per-request lock; the serving thread gathers what arrives within
``batch_timeout_us`` of the first waiting request (up to ``max_batch_size``), copies the rows
into the preallocated buffers of the smallest allowed batch size, runs the backend once and
hands each caller its row. A deadline miss is a *result* (:class:`Unavailable`), not an
exception: a strategy skips the tick and carries on.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..fidelity import Tolerance
from ..inputs import as_sample
from .backend import label, normalise
from .batching import PRESETS, BatchPlan, BatchPolicy
from .cache import InferenceCache
from .lifecycle import ShadowCollector, SwapError, SwapResult, Version, run_swap
from .metrics import EngineMetrics, PromMetrics

log = logging.getLogger("hwbackends.serve")


class Unavailable:
    """"Signal unavailable" for this call: falsy, with the reason. Not an exception, so the
    hot path of a strategy stays a branch: ``if not engine.predict_into(x, out): ...``."""

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

_PENDING, _DONE, _ABANDONED = 0, 1, 2


@dataclass(frozen=True)
class EngineConfig:
    policy: BatchPolicy = field(default_factory=BatchPolicy)
    #: Default per-call deadline (µs from the call); ``None``: wait for the answer.
    deadline_us: float | None = None
    #: Inference cache bounds; ``cache_entries=0`` (default) turns the cache off.
    cache_entries: int = 0
    cache_bytes: int = 16 << 20
    #: Cores the serving thread is pinned to (``os.sched_setaffinity``); ``None``: not pinned.
    pin_cores: tuple[int, ...] | None = None
    #: Warm-up calls per batch slot before the engine takes traffic (and before a swap).
    warmup: int = 50
    #: Consecutive deadline misses/errors that open the breaker, and how long it stays open.
    breaker_failures: int = 5
    breaker_reset_s: float = 1.0
    #: Swap validation: tolerance of the new version against the serving one on live inputs.
    tolerance: Tolerance | None = field(default_factory=lambda: Tolerance(corr_min=0.999, rel_err=0.01))
    shadow_samples: int = 256
    shadow_timeout_s: float = 30.0
    #: Check each request's shape/dtype/finiteness (a wrong array raises InputError).
    validate: bool = True
    #: Run calls *without a deadline* in the caller's thread (needs max_batch_size == 1): no
    #: thread hand-off (about 20 µs of the engine's latency here), but such a call is neither
    #: pinned nor preemptible. Calls with a deadline still go through the serving thread.
    inline: bool = False

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "EngineConfig":
        """``single`` (no batching), ``latency`` (≤ 4, 50 µs), ``balanced`` (≤ 16, 500 µs),
        ``throughput`` (≤ 64, 2 ms); keyword overrides for any field."""
        try:
            pol = PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
        return cls(policy=pol, **overrides)

    def with_policy(self, **kw: Any) -> "EngineConfig":
        return replace(self, policy=replace(self.policy, **kw))


class _Req:
    __slots__ = ("x", "y", "t0", "deadline", "done", "state", "err", "key")

    def __init__(self, x: np.ndarray, t0: float, deadline: float):
        self.x = x
        self.y: np.ndarray | None = None
        self.t0 = t0
        self.deadline = deadline
        self.done = threading.Lock()
        self.done.acquire()
        self.state = _PENDING
        self.err: str | None = None
        self.key: bytes | None = None


class Engine:
    """Serves one strategy's model (see the module docstring)."""

    def __init__(self, backends: Any, config: EngineConfig | None = None, *,
                 strategy: str = "default", prom: PromMetrics | None = None):
        self.config = cfg = config or EngineConfig()
        self.strategy = strategy
        if cfg.inline and cfg.policy.max_batch_size != 1:
            raise ConfigError(f"inline serving runs one call at a time; it needs max_batch_size=1 "
                              f"(got {cfg.policy.max_batch_size}): use the 'single' preset")
        self._inline = cfg.inline
        # Serialises executions: backends (a LiteRT interpreter) are not thread-safe, and inline
        # calls share the slots with the serving thread. Uncontended it costs ~0.1 µs a batch.
        self._exec_lock = threading.Lock()
        if cfg.pin_cores is not None:
            allowed = os.sched_getaffinity(0)
            bad = sorted(set(cfg.pin_cores) - allowed)
            if not cfg.pin_cores or bad:
                raise ConfigError(f"pin_cores {tuple(cfg.pin_cores)}: core(s) {bad or 'none given'} "
                                  f"not available to this process (allowed: {sorted(allowed)})")
        self.metrics = EngineMetrics(strategy, prom)
        self.cache = InferenceCache(cfg.cache_entries, cfg.cache_bytes) if cfg.cache_entries > 0 else None
        self._version_counter = 0
        self._active = Version(self._next_version(), BatchPlan(normalise(backends), cfg.policy),
                               "initial")
        self._active.source = label(self._active.plan.slots[0].backend)
        self._previous: Version | None = None
        self.history: list[dict[str, Any]] = [self._active.to_dict()]
        self._in_shape = tuple(self._active.plan.input.shape)
        self._shadow: ShadowCollector | None = None
        self._q: queue.SimpleQueue[_Req | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._running = False
        self._fails = 0
        self._open_until = 0.0
        self._half_open = False
        self._swap_lock = threading.Lock()
        self.metrics.set_version(self._active.number)

    # -- lifecycle of the engine ------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> "Engine":
        """Start the serving thread; returns once it is pinned and warm."""
        if self._running:
            return self
        self._ready.clear()
        self._start_error = None
        self._thread = threading.Thread(target=self._serve, name=f"hwb-serve-{self.strategy}",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise ConfigError(f"engine {self.strategy!r} did not finish warming up in {timeout:g} s")
        if self._start_error is not None:
            raise self._start_error
        self._running = True
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving; requests still queued are answered ``engine-stopped``."""
        if self._thread is None:
            return
        self._running = False
        self._q.put(None)
        self._thread.join(timeout)
        self._thread = None
        while True:
            try:
                r = self._q.get_nowait()
            except queue.Empty:
                break
            if r is not None:
                r.err = STOPPED.reason
                r.done.release()

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._running

    @property
    def version(self) -> int:
        return self._active.number

    @property
    def variant(self) -> str:
        return self._active.variant

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self._in_shape

    @property
    def output_shape(self) -> tuple[int, ...]:
        return tuple(self._active.plan.output.shape)

    # -- the serving thread -----------------------------------------------------------------
    def _serve(self) -> None:
        try:
            if self.config.pin_cores is not None:
                os.sched_setaffinity(0, self.config.pin_cores)  # pid 0 = this thread on Linux
                self.metrics.set_pinned(tuple(sorted(os.sched_getaffinity(0))))
            self._active.plan.warmup(self.config.warmup)
        except BaseException as exc:
            self._start_error = ConfigError(f"engine {self.strategy!r} failed to start: "
                                            f"{type(exc).__name__}: {exc}")
            self._ready.set()
            return
        self._ready.set()
        q = self._q
        get, get_nowait = q.get, q.get_nowait
        Empty = queue.Empty
        clock = time.perf_counter
        while True:
            first = get()
            if first is None:
                return
            batch = [first]
            pol = self.config.policy
            max_b = pol.max_batch_size
            stop = False
            if max_b > 1:
                # The batch closes batch_timeout_us after the first request *arrived*, so a
                # request that queued behind a running batch waits no longer than that.
                t_end = first.t0 + pol.batch_timeout_us * 1e-6
                while len(batch) < max_b:
                    try:
                        r = get_nowait()
                    except Empty:
                        rem = t_end - clock()
                        if rem <= 0:
                            break
                        try:
                            r = get(timeout=rem)
                        except Empty:
                            break
                    if r is None:
                        stop = True
                        break
                    batch.append(r)
            self._run(batch, clock)
            if stop:
                return

    def _run(self, batch: list[_Req], clock: Any) -> None:
        with self._exec_lock:
            self._run_locked(batch, clock)

    def _run_locked(self, batch: list[_Req], clock: Any) -> None:
        now = clock()
        live = []
        for r in batch:
            if r.state != _PENDING:
                continue
            if now > r.deadline:  # already too late: don't spend the model on it
                r.err = DEADLINE.reason
                r.done.release()
                continue
            live.append(r)
        if not live:
            return
        v = self._active  # read once: a swap between batches never splits one
        self.metrics.batch(len(live), [now - r.t0 for r in live])
        shadow = self._shadow
        number = v.number

        def deliver(start: int, xr: np.ndarray, yr: np.ndarray) -> None:
            for i in range(len(yr)):
                live[start + i].y = yr[i].copy()
            if shadow is not None:
                shadow.offer(number, xr, yr)
        try:
            v.plan.run([r.x for r in live], deliver)
        except Exception as exc:  # the backend failed this batch: each caller gets "unavailable"
            msg = f"backend {v.variant} failed: {type(exc).__name__}: {exc}"
            log.warning("%s: %s", self.strategy, msg)
            for r in live:
                if r.y is None:
                    r.err = msg
        for r in live:
            r.done.release()

    # -- callers ----------------------------------------------------------------------------
    def _check(self, x: Any) -> np.ndarray:
        return as_sample(x, self._active.plan.input, "reject" if self.config.validate else "pass",
                         where=f"engine {self.strategy!r} (requests are batched for you)")

    def _breaker_blocks(self) -> bool:
        if self._open_until:
            if time.monotonic() < self._open_until:
                return True
            self._open_until = 0.0
            self._half_open = True  # the next failure re-opens at once
            self.metrics.set_breaker(False)
        return False

    def _failed(self) -> None:
        self._fails += 1
        if self._half_open or self._fails >= self.config.breaker_failures:
            self._open_until = time.monotonic() + self.config.breaker_reset_s
            self._fails = 0
            self._half_open = False
            self.metrics.set_breaker(True)
            log.warning("%s: breaker open for %g s", self.strategy, self.config.breaker_reset_s)

    def submit(self, x: Any, deadline_us: float | None = None) -> _Req | Unavailable:
        """Queue one sample; pass the handle to :meth:`wait`. (``predict_into`` = both.)"""
        if not self._running:
            return STOPPED
        if self._breaker_blocks():
            self.metrics.breaker_reject()
            return BREAKER_OPEN
        x = self._check(x)
        t0 = time.perf_counter()
        d = deadline_us if deadline_us is not None else self.config.deadline_us
        r = _Req(x, t0, t0 + d * 1e-6 if d is not None else float("inf"))
        if self.cache is not None:
            key = self.cache.key(x, self._active.number)
            y = self.cache.get(key)
            self.metrics.cache(y is not None)
            if y is not None:
                r.y = y
                r.state = _DONE
                return r
            r.key = key
        if self._inline and d is None:
            self._run([r], time.perf_counter)  # in this thread; r.done is released on return
            return r
        self._q.put(r)
        return r

    def wait(self, r: _Req | Unavailable, out: np.ndarray | None = None) -> np.ndarray | Unavailable:
        """The outputs of a submitted request (written into ``out`` too when given), or
        :class:`Unavailable`."""
        if isinstance(r, Unavailable):
            return r
        if r.state == _PENDING:
            rem = r.deadline - time.perf_counter()
            if rem == float("inf"):
                got = r.done.acquire()
            else:
                got = r.done.acquire(timeout=rem) if rem > 0 else r.done.acquire(blocking=False)
            if not got:
                r.state = _ABANDONED
                self.metrics.deadline_miss()
                self._failed()
                return DEADLINE
            r.state = _DONE
            if r.err is not None:
                if r.err == DEADLINE.reason:
                    self.metrics.deadline_miss()
                    self._failed()
                    return DEADLINE
                if r.err == STOPPED.reason:
                    return STOPPED
                self.metrics.error()
                self._failed()
                return Unavailable(r.err)
            if r.key is not None and self.cache is not None:
                self.cache.put(r.key, r.y)
        self._fails = 0
        self._half_open = False
        self.metrics.served(time.perf_counter() - r.t0, self._active.variant)
        if out is not None:
            out[...] = r.y
        return r.y

    def predict_into(self, x: Any, out: np.ndarray, deadline_us: float | None = None) -> bool | Unavailable:
        """Hot path: one sample in, its outputs written into ``out``; ``True`` or an
        :class:`Unavailable` (falsy) when the deadline passed, the breaker is open, the
        backend failed or the engine is stopped."""
        res = self.wait(self.submit(x, deadline_us), out)
        return res if isinstance(res, Unavailable) else OK

    def predict(self, x: Any, deadline_us: float | None = None) -> np.ndarray | Unavailable:
        """Outputs for one sample (a new array), or :class:`Unavailable`."""
        res = self.wait(self.submit(x, deadline_us))
        return res if isinstance(res, Unavailable) else np.array(res)

    # -- direct calls for co-located transports (the shm endpoint's poll thread) -------------
    def run_direct(self, x: np.ndarray, out: np.ndarray) -> None:
        """Run one already-validated sample ``x`` (shape ``(1, *input_shape)``, float32) on the
        active version in the *caller's* thread, outputs into ``out`` (``(1, *output_shape)``).

        It holds the engine's executor lock, so it never runs concurrently with the serving
        thread or inline calls (one thread per executor at a time). No queue, breaker, cache
        or deadline: the caller (the shm poll loop) checks deadlines and input itself.
        Exceptions of the backend propagate."""
        with self._exec_lock:
            slot = self._active.plan.slot_for(1)  # read once: a swap never splits a call
            if slot.size == 1:
                slot.fn(x, out)
            else:  # a static-batch backend: pad to its batch size
                slot.x[0] = x[0]
                slot.x[1:] = 0.0
                slot.fn(slot.x, slot.y)
                out[0] = slot.y[0]

    # -- versions ---------------------------------------------------------------------------
    def _next_version(self) -> int:
        self._version_counter += 1
        return self._version_counter

    def _install(self, v: Version) -> None:
        self._previous, self._active = self._active, v
        if self.cache is not None:
            self.cache.clear()  # keys carry the version; clearing frees the old entries now
        self.history.append(v.to_dict())
        self.metrics.swap("accepted", v.number)
        log.info("%s: now serving version %d (%s)", self.strategy, v.number, v.variant)

    def swap(self, new: Any, *, tolerance: Tolerance | None | str = "config",
             shadow_samples: int | None = None, shadow_timeout_s: float | None = None,
             wait: bool = True, nice: int = 10) -> SwapResult | "Future[SwapResult]":
        """Replace the serving model without a pause (see :mod:`.lifecycle`).

        ``new``: a backend, ``{batch_size: backend}``, or a zero-argument factory returning one
        (run in the background, e.g. ``lambda: hwb.compile(model, "cpu.litert")``).
        ``tolerance``: the strategy's (a :class:`RouterStrategy` carries it), else the config's;
        ``None`` switches without shadow validation.
        Returns the :class:`SwapResult` (or a Future of it with ``wait=False``)."""
        if not self._swap_lock.acquire(blocking=False):
            raise SwapError(f"a swap of {self.strategy!r} is already in progress; wait for it")
        if tolerance == "config":  # the strategy's own tolerance when the backend carries one
            tol = getattr(self._active.plan.slots[0].backend, "tolerance", None) or self.config.tolerance
        else:
            tol = tolerance
        fut: Future[SwapResult] = Future()

        def job() -> None:
            try:
                res = run_swap(self, new, tolerance=tol,  # type: ignore[arg-type]
                               shadow_samples=shadow_samples or self.config.shadow_samples,
                               shadow_timeout_s=shadow_timeout_s or self.config.shadow_timeout_s,
                               warmup=self.config.warmup, policy=self.config.policy, nice=nice)
                if not res.accepted:
                    log.warning("%s: swap rejected: %s", self.strategy, res.reason)
                fut.set_result(res)
            except BaseException as exc:
                fut.set_exception(exc)
            finally:
                self._shadow = None
                self._swap_lock.release()
        threading.Thread(target=job, name=f"hwb-swap-{self.strategy}", daemon=True).start()
        return fut.result() if wait else fut

    def rollback(self) -> int:
        """Serve the previous version again (atomically); returns its number."""
        with self._swap_lock:
            if self._previous is None:
                raise SwapError(f"{self.strategy!r} has no previous version to roll back to")
            self._previous, self._active = self._active, self._previous
            if self.cache is not None:
                self.cache.clear()
            self.history.append({**self._active.to_dict(), "rollback": True})
            self.metrics.swap("rollback", self._active.number)
            return self._active.number

    # -- reporting --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        s = self.metrics.snapshot()
        fo = [getattr(b, "failovers", None) for b in self._active.plan.backends]
        failovers = sum(f() for f in fo if f is not None)
        self.metrics.set_failovers(failovers)
        s.update({"version": self.version, "variant": self.variant, "failovers": failovers,
                  "batch_sizes_allowed": self._active.plan.sizes,
                  "breaker_open": bool(self._open_until and time.monotonic() < self._open_until),
                  "cache": None if self.cache is None else vars(self.cache.stats()) | {
                      "hit_rate": self.cache.stats().hit_rate}})
        return s
