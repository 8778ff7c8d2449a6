"""Run-time dispatch for one strategy (a *lane*): the hot path, failover, circuit breakers
and live tail tracking.

The hot path (:meth:`Lane.predict_into`) is one bound-method call into the serving variant's
own ``predict_into`` between two clock reads, plus a list store: no allocation, no lock, no
logging. Everything else (a failure, the end of a latency window) runs on the slow path.

* **Failover**: an exception from the serving variant is caught and the *same* request is
  served by the next healthy candidate in the decision's order, so no request is lost.
* **Deadline** (strategy ``timeout_us``): each variant runs in its own worker thread; a call
  that misses the deadline is served by the next candidate while the stalled one finishes
  (or not) in the background. This costs a thread hand-off per call, so it is opt-in.
* **Circuit breaker**: ``breaker_failures`` consecutive failures open a variant's breaker;
  after ``retry_after_s`` it is half-open: it serves one *retry window* again, and one clean
  window closes it, one failure re-opens it.
* **Live tail**: the serving variant's p99 is computed every ``window`` timed calls (one call
  in ``sample_every`` is timed: the two clock reads are most of the hot path's cost). After
  ``switch_after`` consecutive windows over the tier budget the lane switches, but only to a
  candidate *measured* clearly better (hysteresis): its estimate — the p99 of its own last
  live window when it has served one, else its bench p99 — must be below the serving one's
  windows by ``switch_margin`` (default 20%). When nothing is measured better (a noisy
  moment slows every candidate alike) the lane stays (``hold``). After ``retry_after_s`` the
  better-ranked one serves a retry window (``retry``) and is taken back if its p99 is within
  budget; a failed retry (``retry-failed``) goes back only to a candidate measured better than
  the retry window, and the rest before the next retry doubles (up to 32× ``retry_after_s``). Every switch is logged
  with the numbers; :attr:`Lane.failovers` counts the switches off a variant.

A lane serves one caller thread (one strategy's hot loop); it is not locked.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..breaker import Breaker, BreakerState
from ..chunked import tuple_call
from ..config import RouterConfig
from ..errors import HwbError
from ..exclusive import lock_for
from ..specs import several

log = logging.getLogger("hwbackends.router")


class NoRouteError(HwbError):
    """No candidate could serve a request or a strategy (the message says why for each)."""


def _copy(dst: tuple[np.ndarray, ...], src: tuple[np.ndarray, ...]) -> None:
    """``dst[...] = src`` tensor by tensor."""
    for d, x in zip(dst, src, strict=True):
        d[...] = x


class DeadlineWorker:
    """One variant behind a worker thread, so a stalled call can be abandoned.

    Every hand-off carries a sequence number and the worker tags its reply with it: the
    caller takes only the reply to its own call. (Without it, a late reply to an abandoned
    call could be taken as the answer to the next one — seen under a short GIL switch
    interval.) A worker still busy with an abandoned call takes no new one, so the variant
    never runs on two threads. The executor's lock is held from the hand-off until the call
    has ended, so an abandoned call (queued or running) always shows as a held lock to a lane
    built after it (:class:`Lane`)."""

    def __init__(self, fn: Callable[[Any, Any], None], x_shapes: Sequence[tuple[int, ...]],
                 y_shapes: Sequence[tuple[int, ...]], name: str, lock: Any = None):
        # Tuples inside (one buffer per tensor); ``fn`` and ``call`` keep the variant's public
        # shape: arrays when it has one tensor each way.
        self._single = not several(x_shapes, y_shapes)
        self.fn = tuple_call(fn, self._single)
        # The executor's process-wide lock (hwbackends.exclusive): an abandoned call keeps
        # running after its lane moved on, and another lane (or a new one) over the same
        # compiled model must not run beside it (seen: a wrong answer in the stress test).
        self._lock = lock if lock is not None else threading.Lock()
        self.x = tuple(np.zeros(s, np.float32) for s in x_shapes)
        self.y = tuple(np.zeros(s, np.float32) for s in y_shapes)
        self.busy = False
        self._seq = 0            # last call handed to the worker
        self._done_seq = 0       # last call the worker finished
        self._exc: BaseException | None = None
        self._cv = threading.Condition(threading.Lock())
        self._go: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"hwb-deadline-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            seq = self._go.get()
            exc: BaseException | None = None
            try:
                self.fn(self.x, self.y)
            except BaseException as e:  # handed to the caller of this sequence number
                exc = e
            finally:
                self._lock.release()  # taken by call() at the hand-off
            with self._cv:
                self._exc = exc
                self._done_seq = seq
                self.busy = False
                self._cv.notify_all()

    def call(self, x: np.ndarray, out: np.ndarray, timeout_s: float) -> bool:
        """Run one call; ``True`` when it completed in time (``out`` filled), ``False`` when it
        missed the deadline or the worker is still stuck on an earlier call."""
        with self._cv:
            if self.busy:
                return False
            self.busy = True
            self._seq += 1
            seq = self._seq
        end = time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=timeout_s):  # another user of the executor is in it
            with self._cv:
                self.busy = False
            return False
        try:
            _copy(self.x, (x,) if self._single else x)  # the worker is idle until the hand-off
        except BaseException:  # a bad input: the executor was never handed it
            self._lock.release()
            with self._cv:
                self.busy = False
            raise
        self._go.put(seq)  # the worker releases the lock when the call ends
        with self._cv:
            if not self._cv.wait_for(lambda: self._done_seq == seq, max(0.0, end - time.monotonic())):
                return False
            exc, self._exc = self._exc, None
            if exc is not None:
                raise exc
            _copy((out,) if self._single else out, self.y)  # under the lock: no later call writes y
        return True


#: How long a lane being built waits for an abandoned deadline call on one of its executors
#: to end before it takes that executor's lock on every call instead.
ABANDONED_WAIT_S = 1.0


def _unless_abandoned(fn: Callable[[Any, Any], None], lock: Any) -> Callable[[Any, Any], None]:
    """A direct lane's call of one executor: ``fn`` itself (lock-free; a lane has one caller),
    unless another lane's deadline worker is still in an abandoned call on the same executor
    (its lock is held): a lane built over cached compiled models while an old lane's stalled
    call runs on (a re-plan, a new router) would run beside it and could answer with the
    other call's output (seen in the stress test). Waits :data:`ABANDONED_WAIT_S` for that call
    to end; an executor still stuck after that is called under its lock by this lane."""
    if lock.acquire(timeout=ABANDONED_WAIT_S):
        lock.release()
        return fn

    def locked(x: Any, out: Any) -> None:
        with lock:
            fn(x, out)
    return locked


@dataclass
class VariantState:
    """Live state of one candidate in a lane: its breaker (failures) and whether it was taken
    out for its latency (``degraded``) or is serving a retry window (``retrying``)."""

    variant: str
    mode: str
    fn: Callable[[np.ndarray, np.ndarray], None]
    rank: int
    breaker: Breaker
    degraded: bool = False
    degraded_until: float = 0.0
    retrying: bool = False
    over: int = 0                  # consecutive windows over budget
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    window_p99_us: list[float] = field(default_factory=list)
    last_error: str = ""
    worker: DeadlineWorker | None = None
    #: The candidate's bench p99 (µs) from the routing decision; None when never measured.
    bench_p99_us: float | None = None
    #: Rest before the next latency retry (doubles after each failed retry).
    rest_s: float = 0.0
    #: Over budget with nothing measured better: the lane holds on this variant.
    holding: bool = False
    #: ``time.monotonic()`` of its last live window (0: it never served one).
    live_at: float = 0.0

    @property
    def state(self) -> str:
        """closed | open (breaker) | retrying (a retry window: half-open or a latency retry) | degraded."""
        b = self.breaker.state
        if b is BreakerState.OPEN:
            return "open"
        if self.retrying or b is BreakerState.HALF_OPEN:
            return "retrying" if self.retrying else "open"
        return "degraded" if self.degraded else "closed"

    @property
    def failures(self) -> int:
        return self.breaker.consecutive

    def may_serve(self, now: float) -> bool:
        """Closed, or out but due for another try (breaker half-open / latency retry)."""
        if not self.breaker.allows():
            return False
        return not self.degraded or now >= self.degraded_until

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "mode": self.mode, "rank": self.rank, "state": self.state,
                "breaker": self.breaker.state.value, "calls": self.calls, "errors": self.errors,
                "timeouts": self.timeouts, "consecutive_failures": self.failures,
                "recent_window_p99_us": self.window_p99_us[-10:], "last_error": self.last_error,
                "bench_p99_us": self.bench_p99_us}


class Lane:
    """Dispatch for one strategy over its ordered candidates (``order[0]`` is preferred)."""

    def __init__(self, strategy: str, order: list[Any], budget_us: float,
                 policy: RouterConfig | None = None, *, timeout_us: float | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None):
        """``policy``: the config's ``[router]`` table (window, sampling, switching, retry
        and breaker settings; its defaults when ``None``); ``timeout_us``: the strategy's
        per-call deadline."""
        if not order:
            raise NoRouteError(f"strategy {strategy!r} has no candidate to serve it")
        policy = policy or RouterConfig()
        self.strategy = strategy
        self.budget_ns = budget_us * 1e3
        self.budget_us = budget_us
        self.window = policy.window
        self.switch_after = policy.switch_after
        retry_after_s = self.retry_after_s = policy.retry_after_s
        breaker_failures = self.breaker_failures = policy.breaker_failures
        self.timeout_s = timeout_us / 1e6 if timeout_us else None
        self.sample_every = policy.sample_every
        self.switch_margin = policy.switch_margin
        #: A live window older than this no longer stands for the variant (its bench p99 does).
        self.stale_s = max(10.0, 32 * retry_after_s)
        #: The longest rest between latency retries (the rest doubles after each failed one).
        self.max_rest_s = 32 * retry_after_s
        self.events: list[dict[str, Any]] = []
        #: Switches of the serving variant off one that failed or was too slow (re-route,
        #: breaker-open, retry-failed); per-call failovers are the variants' errors/timeouts.
        self.failovers = 0
        self._on_event = on_event
        self.variants = [VariantState(c.variant, c.mode, c.cm.predict_into, i,
                                      Breaker(breaker_failures, retry_after_s),
                                      bench_p99_us=getattr(c, "p99_us", None), rest_s=retry_after_s)
                         for i, c in enumerate(order)]
        self.cms = [c.cm for c in order]
        for v, cm in zip(self.variants, self.cms, strict=True):
            lock = lock_for(cm)
            if self.timeout_s is None:
                v.fn = _unless_abandoned(v.fn, lock)
            else:
                b = cm.batch_size
                v.worker = DeadlineWorker(v.fn, [s.batched(b) for s in cm.inputs],
                                          [s.batched(b) for s in cm.outputs], v.variant, lock)
        self.cur = 0
        self.fn = self.variants[0].fn
        self._lat: list[int] = []  # this window's latencies (ns) of the serving variant
        self._set_fn: Callable[[Callable[..., None]], None] = lambda f: None
        # The hot path is chosen once: the callable callers keep (Router.handle).
        self.predict_into = (self._deadline_call if self.timeout_s is not None
                             else self._build_direct())

    # -- hot path ---------------------------------------------------------------------------
    def _build_direct(self) -> Callable[[np.ndarray, np.ndarray], None]:
        """The hot path as a closure: free variables load faster than attributes and there is
        no bound-method object per call. ``_set_fn`` (same scope) swaps the serving variant."""
        clock = time.perf_counter_ns
        lat = self._lat
        append = lat.append
        window = self.window
        failover = self._failover
        end_window = self._end_window
        fn = self.fn

        every = self.sample_every
        k = every

        def predict_into(x: np.ndarray, out: np.ndarray) -> None:
            # Time one call in ``every`` (the clock reads are most of the lane's cost); the
            # window's p99 is then the p99 of a uniform sample of the calls.
            nonlocal k
            k -= 1
            if k:
                try:
                    fn(x, out)
                except Exception as exc:
                    failover(x, out, exc)
                return
            k = every
            t0 = clock()
            try:
                fn(x, out)
            except Exception as exc:
                failover(x, out, exc)
                return
            append(clock() - t0)
            if len(lat) >= window:
                end_window()

        def set_fn(new: Callable[[np.ndarray, np.ndarray], None]) -> None:
            nonlocal fn
            fn = new

        self._set_fn = set_fn
        return predict_into

    # -- slow paths -------------------------------------------------------------------------
    @property
    def serving(self) -> str:
        return self.variants[self.cur].variant

    def _event(self, kind: str, frm: str, to: str, why: str, **numbers: Any) -> None:
        ev = {"time": time.time(), "strategy": self.strategy, "event": kind, "from": frm, "to": to,
              "reason": why, **numbers}
        self.events.append(ev)
        log.warning("router %s: %s %s → %s: %s %s", self.strategy, kind, frm, to, why,
                    " ".join(f"{k}={v}" for k, v in numbers.items()))
        if self._on_event:
            self._on_event(ev)

    def _switch(self, to: int, kind: str, why: str, **numbers: Any) -> None:
        frm = self.variants[self.cur].variant
        if kind != "retry":
            self.failovers += 1
        self.variants[self.cur].holding = False
        self.cur = to
        self.fn = self.variants[to].fn
        self._set_fn(self.fn)
        self._lat.clear()  # the window restarts with the new variant's own calls
        self._event(kind, frm, self.variants[to].variant, why, **numbers)

    def _healthy(self, exclude: int) -> int | None:
        """Best-ranked candidate that may serve now (closed, or due for a retry)."""
        now = time.monotonic()
        for j, v in enumerate(self.variants):
            if j != exclude and v.may_serve(now):
                return j
        return None

    def _inflation(self, exclude: int, now: float) -> float:
        """How much slower than their bench p99 the *other* variants ran in their recent live
        windows (the smallest such ratio, at least 1). A bench-only estimate is scaled by it: a
        moment that slows every candidate alike must not make an unmeasured one look better."""
        g: float | None = None
        for j, v in enumerate(self.variants):
            if (j == exclude or not v.window_p99_us or not v.bench_p99_us
                    or now - v.live_at > self.stale_s):
                continue
            r = self._live(v) / v.bench_p99_us
            g = r if g is None else min(g, r)
        return max(1.0, g) if g is not None else 1.0

    def _live(self, v: VariantState) -> float:
        """A candidate's live tail, pessimistically: the worst of its last ``switch_after``
        windows (one quiet window is no evidence that it is better)."""
        return max(v.window_p99_us[-self.switch_after:])

    def _estimate(self, v: VariantState, now: float, inflation: float) -> float | None:
        """What is known of ``v``'s tail now: its recent live windows (:meth:`_live`, retry
        windows included), else its bench p99 × ``inflation``; None: never measured."""
        if v.window_p99_us and now - v.live_at <= self.stale_s:
            return self._live(v)
        return None if v.bench_p99_us is None else v.bench_p99_us * inflation

    def _better(self, than_us: float, exclude: int, now: float) -> int | None:
        """Where to move traffic off variant ``exclude`` whose tail is ``than_us``: only to a
        candidate that may serve and is *measured* better by the margin (estimate < ``than_us``
        × (1 − ``switch_margin``)); among those the best-ranked within budget, else the one
        with the lowest estimate. ``None``: nothing is measured better, stay."""
        limit = than_us * (1.0 - self.switch_margin)
        g = self._inflation(exclude, now)
        best: tuple[float, int] | None = None
        for j, v in enumerate(self.variants):
            if j == exclude or not v.may_serve(now):
                continue
            e = self._estimate(v, now, g)
            if e is None or e >= limit:
                continue
            if e <= self.budget_us:
                return j  # variants are in rank order
            if best is None or e < best[0]:
                best = (e, j)
        return best[1] if best else None

    def _estimates(self, exclude: int, now: float) -> dict[str, float | None]:
        g = self._inflation(exclude, now)
        return {v.variant: (None if (e := self._estimate(v, now, g)) is None else round(e, 2))
                for v in self.variants}

    def _record_failure(self, j: int, what: str, timeout: bool = False) -> None:
        v = self.variants[j]
        v.last_error = what
        if timeout:
            v.timeouts += 1
        else:
            v.errors += 1
        failures = v.breaker.consecutive + 1
        if not v.breaker.failure():
            return
        v.retrying = False
        if j != self.cur:
            return
        nxt = self._healthy(exclude=j)
        if nxt is not None:
            self._switch(nxt, "breaker-open", f"{failures} consecutive failure(s), last: {what}",
                         failures=failures, retry_in_s=self.retry_after_s)
        else:
            self._event("breaker-open", v.variant, v.variant, f"no other candidate; last: {what}")

    def _call_direct(self, v: VariantState, x: np.ndarray, out: np.ndarray) -> bool:
        v.fn(x, out)
        return True

    def _call_with_deadline(self, v: VariantState, x: np.ndarray, out: np.ndarray) -> bool:
        return v.worker.call(x, out, self.timeout_s)  # type: ignore[union-attr,arg-type]

    def _serve_by_candidates(self, x: np.ndarray, out: np.ndarray, call: Callable[..., bool],
                             skip: int | None, errors: list[str]) -> None:
        """Serve this request by the first candidate that can: the serving one first (unless it
        is ``skip``, which just failed), then by rank, skipping open breakers. Each failure is
        recorded; when every candidate failed, :class:`NoRouteError` names each reason."""
        clock = time.perf_counter_ns
        order = [self.cur] + [k for k in range(len(self.variants)) if k != self.cur]
        for j in order:
            v = self.variants[j]
            if j == skip or (j != self.cur and not v.breaker.allows()):
                continue
            t0 = clock()
            try:
                ok = call(v, x, out)
            except Exception as exc:
                self._record_failure(j, f"{type(exc).__name__}: {exc}")
                errors.append(f"{v.variant}: {type(exc).__name__}: {exc}")
                continue
            if not ok:
                self._record_failure(j, f"missed the {self.timeout_s * 1e6:.0f} µs deadline",  # type: ignore[operator]
                                     timeout=True)
                errors.append(f"{v.variant}: deadline")
                continue
            v.breaker.consecutive = 0  # a clean call; closing is the retry window's job
            if j == self.cur and skip is None:
                self._lat.append(clock() - t0)
                if len(self._lat) >= self.window:
                    self._end_window()
            return
        raise NoRouteError(f"strategy {self.strategy}: every candidate failed this request: "
                           + "; ".join(errors))

    def _failover(self, x: np.ndarray, out: np.ndarray, exc: BaseException) -> None:
        """The direct hot path's slow path: the serving variant raised on this request."""
        failed = self.cur
        self._record_failure(failed, f"{type(exc).__name__}: {exc}")
        self._serve_by_candidates(x, out, self._call_direct, failed,
                                  [f"{self.variants[failed].variant}: {type(exc).__name__}: {exc}"])

    def _deadline_call(self, x: np.ndarray, out: np.ndarray) -> None:
        self._serve_by_candidates(x, out, self._call_with_deadline, None, [])

    def _end_window(self) -> None:
        v = self.variants[self.cur]
        p99_ns = float(np.quantile(self._lat, 0.99))
        self._lat.clear()
        p99 = p99_ns / 1e3
        v.calls += self.window * self.sample_every
        v.window_p99_us.append(round(p99, 2))
        del v.window_p99_us[:-50]
        v.breaker.consecutive = 0
        now = time.monotonic()
        v.live_at = now
        if v.retrying or v.degraded or v.breaker.state is not BreakerState.CLOSED:
            self._retry_window_done(v, p99, now)
            return
        over = p99_ns > self.budget_ns
        v.over = v.over + 1 if over else 0
        if not over:
            v.holding = False
        if v.over >= self.switch_after:
            last = v.window_p99_us[-self.switch_after:]
            v.over = 0
            nxt = self._better(min(last), self.cur, now)
            if nxt is not None:
                v.degraded, v.degraded_until = True, now + v.rest_s
                self._switch(nxt, "re-route", f"p99 over budget {self.budget_us:g} µs for "
                             f"{self.switch_after} consecutive windows of {self.window} calls; "
                             f"{self.variants[nxt].variant} measured better", window_p99_us=last,
                             budget_us=self.budget_us, estimates_us=self._estimates(self.cur, now))
                return
            if not v.holding:  # said once per episode, not every window
                v.holding = True
                self._event("hold", v.variant, v.variant,
                            f"p99 over budget {self.budget_us:g} µs for {self.switch_after} "
                            f"windows, but no candidate is measured {self.switch_margin:.0%} "
                            f"better: staying", window_p99_us=last, budget_us=self.budget_us,
                            estimates_us=self._estimates(self.cur, now))
        # A better-ranked variant due for a retry (breaker half-open, or degraded earlier)?
        # One taken out for its latency is not retried while the serving one is over budget too
        # (a noisy moment: the retry would measure the noise), unless it has rested the longest.
        for j in range(self.cur):
            b = self.variants[j]
            if (over and b.degraded and b.breaker.state is BreakerState.CLOSED
                    and now < b.degraded_until + self.max_rest_s):
                continue
            if (b.degraded or b.breaker.state is not BreakerState.CLOSED) and b.may_serve(now):
                b.retrying = True
                b.breaker.half_open()  # one failure in the retry window takes it out again
                self._switch(j, "retry", f"{self.retry_after_s:g} s after it was taken out "
                             f"(half-open): serving one window to check it")
                return

    def _retry_window_done(self, v: VariantState, p99: float, now: float) -> None:
        v.retrying = False
        v.breaker.close()
        v.over = 0
        if p99 <= self.budget_us:
            v.degraded, v.rest_s = False, self.retry_after_s
            self._event("recovered", v.variant, v.variant,
                        f"retry window p99 {p99:.1f} µs within budget {self.budget_us:g} µs",
                        window_p99_us=round(p99, 2))
            return
        nxt = self._better(p99, self.cur, now)
        if nxt is None:  # over budget, but nothing is measured better: it keeps serving
            v.degraded, v.holding = False, True
            self._event("hold", v.variant, v.variant,
                        f"retry window p99 {p99:.1f} µs > budget {self.budget_us:g} µs, but no "
                        f"candidate is measured {self.switch_margin:.0%} better: it keeps serving",
                        window_p99_us=round(p99, 2), estimates_us=self._estimates(self.cur, now))
            return
        v.rest_s = min(max(v.rest_s, self.retry_after_s) * 2, self.max_rest_s)
        v.degraded, v.degraded_until = True, now + v.rest_s
        est = self._estimates(self.cur, now)
        self._switch(nxt, "retry-failed", f"retry window p99 {p99:.1f} µs > budget "
                     f"{self.budget_us:g} µs", window_p99_us=round(p99, 2), retry_in_s=v.rest_s,
                     estimates_us=est)

    def status(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "serving": self.serving, "budget_us": self.budget_us,
                "failovers": self.failovers,
                "variants": [v.to_dict() for v in self.variants], "events": self.events[-20:]}
