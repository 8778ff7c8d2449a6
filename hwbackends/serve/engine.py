"""The in-process serving engine: one serving thread per strategy, micro-batching, inference
cache, per-call deadlines with a breaker, optional core pinning, hot swap.

    eng = Engine(hwb.compile(model, "cpu.litert"), EngineConfig.preset("latency"), strategy="mom")
    eng.start()                                       # warms up, then serves
    r = eng.try_predict_into(x, out, deadline_us=200) # True, or an Unavailable (falsy) result
    if not r: skip_this_tick(r.reason)

The pieces: :mod:`.serving_thread` (queue, serving thread, batch execution),
:mod:`.batch_plan` (batching policy, batch slots), :mod:`.inference_cache`, :mod:`..breaker`
(the one breaker), :mod:`.versions` and :mod:`.lifecycle` (versions, swap, rollback),
:mod:`.request` (requests, :class:`Unavailable`, deadline validation). This module wires
them together behind the caller-facing API.

Trust model (docs/serving.md): a client can make its own calls fail (a bad array — wrong
shape, not float32, NaN — or deadline is an :class:`~hwbackends.errors.InputError`; a budget
too small to meet is answered "deadline"), but nothing a client sends counts toward the
breaker every client shares — only backend failures, and deadline misses on fair budgets
during which the backend completed no batch (a stall, not work queued ahead), do.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..breaker import Breaker
from ..errors import ConfigError, InputError
from ..fidelity import SWAP_GATE, Tolerance
from ..inputs import as_sample
from ..packing import Layout, layouts
from .batch_plan import PRESETS, BatchPlan, BatchPolicy
from .inference_cache import InferenceCache
from .lifecycle import SwapError, SwapResult, SwapTicket, run_swap
from .metrics import EngineMetrics, PromMetrics
from .request import (
    ABANDONED,
    BREAKER_OPEN,
    DEADLINE,
    DONE,
    OK,
    PENDING,
    STOPPED,
    Request,
    Status,
    Unavailable,
    check_deadline_us,
)
from .servable import normalise, servable_label
from .serving_thread import Batcher
from .versions import Version, Versions

log = logging.getLogger("hwbackends.serve")

__all__ = ["BREAKER_OPEN", "DEADLINE", "OK", "STOPPED", "Engine", "EngineConfig", "Status",
           "Unavailable"]


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
    #: A deadline miss counts toward the breaker only when the request's budget was at least
    #: this many µs (a budget the backend should have met). A client's own too-small budget
    #: is answered "deadline" to that client and counted as ``client_deadline_misses``, but
    #: cannot open the breaker for everyone. ``None``: the engine's own ``deadline_us`` when
    #: set, else 20× the warm-up call time + ``batch_timeout_us``, and at least 200 µs.
    breaker_min_deadline_us: float | None = None
    #: Swap validation: tolerance of the new version against the serving one on live inputs.
    tolerance: Tolerance | None = SWAP_GATE
    shadow_samples: int = 256
    shadow_timeout_s: float = 30.0
    #: A whole swap (factory, warm-up, shadow) that takes longer ends rejected; the engine
    #: is then free for the next swap (a factory that hangs cannot block swaps forever).
    swap_timeout_s: float = 600.0
    #: Check each request's shape/dtype/finiteness (a wrong array raises InputError).
    validate: bool = True
    #: Run calls *without a deadline* in the caller's thread (needs max_batch_size == 1): no
    #: thread hand-off (about 20 µs of the engine's latency here), but such a call is neither
    #: pinned nor preemptible. Calls with a deadline still go through the serving thread.
    inline: bool = False

    def __post_init__(self) -> None:
        try:
            check_deadline_us(self.deadline_us, "EngineConfig.deadline_us")
            check_deadline_us(self.breaker_min_deadline_us, "EngineConfig.breaker_min_deadline_us")
        except InputError as exc:  # a configuration mistake, not a request's
            raise ConfigError(str(exc)) from None
        if not (self.swap_timeout_s > 0 and math.isfinite(self.swap_timeout_s)):
            raise ConfigError(f"swap_timeout_s must be a finite number of seconds > 0, "
                              f"got {self.swap_timeout_s}")

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
        if cfg.pin_cores is not None:
            allowed = os.sched_getaffinity(0)
            bad = sorted(set(cfg.pin_cores) - allowed)
            if not cfg.pin_cores or bad:
                raise ConfigError(f"pin_cores {tuple(cfg.pin_cores)}: core(s) {bad or 'none given'} "
                                  f"not available to this process (allowed: {sorted(allowed)})")
        self.metrics = EngineMetrics(strategy, prom)
        self.cache = InferenceCache(cfg.cache_entries, cfg.cache_bytes) if cfg.cache_entries > 0 else None
        plan = BatchPlan(normalise(backends), cfg.policy)
        self.versions = Versions(plan, servable_label(plan.slots[0].backend), self._version_changed)
        self._in_shape = tuple(plan.input.shape)
        self.batcher = Batcher(strategy, self.versions, cfg.policy, self.metrics,
                               pin_cores=cfg.pin_cores, warmup=cfg.warmup)
        self.breaker = Breaker(cfg.breaker_failures, cfg.breaker_reset_s)
        self._fair_budget_us = cfg.breaker_min_deadline_us or cfg.deadline_us or 200.0
        self._running = False
        self._swap_lock = threading.Lock()
        self.metrics.set_version(self.versions.active.number)
        self.metrics.bind_failovers(self._failovers)
        if self.layout is not None:
            log.info("%s: several inputs/outputs, served as packed float32 records: %s → %s",
                     strategy, self.layout[0].describe(), self.layout[1].describe())

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.versions.history

    # -- lifecycle of the engine ------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> "Engine":
        """Start the serving thread; returns once it is pinned and warm."""
        if self._running:
            return self
        self.batcher.start(timeout)
        cfg = self.config
        if cfg.breaker_min_deadline_us is None and cfg.deadline_us is None:
            self._fair_budget_us = max(200.0, 20 * self.batcher.warm_call_s * 1e6
                                       + cfg.policy.batch_timeout_us)
        self._running = True
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving; requests still queued are answered ``engine-stopped``."""
        self._running = False
        self.batcher.stop(timeout)

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._running

    @property
    def version(self) -> int:
        return self.versions.active.number

    @property
    def variant(self) -> str:
        return self.versions.active.variant

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self._in_shape

    @property
    def output_shape(self) -> tuple[int, ...]:
        return tuple(self.versions.active.plan.output.shape)

    @property
    def breaker_min_deadline_us(self) -> float:
        """Budgets below this are the client's own: their misses never open the breaker."""
        return self._fair_budget_us

    @property
    def layout(self) -> tuple[Layout, Layout] | None:
        """For a model with several inputs/outputs, where each tensor sits in the packed
        float32 record the engine (and shm/gRPC) carries: ``(inputs, outputs)``
        (:mod:`hwbackends.packing`); ``None`` for a one-input, one-output model."""
        return layouts(self.versions.active.plan.slots[0].backend)

    # -- callers ----------------------------------------------------------------------------
    def _float32(self, x: Any, what: str = "input") -> None:
        """The engine serves float32 only, as its gRPC and shared-memory transports do: any
        other dtype (float64 from pandas, ints) is refused, never cast per call."""
        if not (isinstance(x, np.ndarray) and x.dtype == np.float32):
            got = f"dtype {x.dtype}" if isinstance(x, np.ndarray) else f"a {type(x).__name__}"
            raise InputError(f"{what} is {got}; engine {self.strategy!r} takes float32 numpy "
                             f"arrays only (as its gRPC and shared-memory endpoints do): convert "
                             f"once where the features are built, x.astype(np.float32)")

    def _check(self, x: Any) -> np.ndarray:
        nan = "reject" if self.config.validate else "pass"
        if isinstance(x, (tuple, list, dict)):
            lay = self.layout
            if lay is not None:  # one array per tensor: pack them into the record
                fast = lay[0].pack_sample(x, nan)
                if fast is not None:
                    return fast
                names = [f.name for f in lay[0].fields]
                # a wrong count is pack()'s error to name, so zip only as far as both go
                for name, a in (x.items() if isinstance(x, dict) else zip(names, x, strict=False)):
                    self._float32(a, f"input {name!r}")  # else pack() would cast it
                rec = lay[0].pack(x, nan)
                if len(rec) != 1:
                    raise InputError(f"engine {self.strategy!r} takes one sample per call; got "
                                     f"{len(rec)} (requests are batched for you)")
                return rec[0]
        self._float32(x)
        return as_sample(x, self.versions.active.plan.input, nan,
                         where=f"engine {self.strategy!r} (requests are batched for you)")

    def _breaker_blocks(self) -> bool:
        br = self.breaker
        if br.allows():
            if br.retry_at:  # it just turned half-open: the next failure re-opens it
                self.metrics.set_breaker(False)
            return False
        return True

    def _failed(self) -> None:
        if self.breaker.failure():
            self.metrics.set_breaker(True)
            log.warning("%s: breaker open for %g s", self.strategy, self.config.breaker_reset_s)

    def _missed(self, r: Request) -> Unavailable:
        """A deadline miss. The breaker counts it only when the budget was a fair one *and* the
        backend completed no batch while the request waited (it stalled or slowed down). A
        miss while batches kept completing waited behind work queued ahead of it — another
        client's large request, a burst — which is load, not a backend fault: the budget is
        normalised by the work the backend was visibly doing (docs/serving.md, trust model)."""
        if r.budget_us is not None and r.budget_us < self._fair_budget_us:
            self.metrics.client_deadline_miss()
        elif self.batcher.completed != r.progress0:
            self.metrics.load_deadline_miss()
        else:
            self.metrics.deadline_miss()
            self._failed()
        return DEADLINE

    def submit(self, x: Any, deadline_us: float | None = None) -> Request | Unavailable:
        """Queue one sample; pass the handle to :meth:`wait` (``try_predict_into`` = both).
        Raises :class:`~hwbackends.errors.InputError` for a bad sample or deadline."""
        if not self._running:
            return STOPPED
        x = self._check(x)
        d = check_deadline_us(deadline_us) if deadline_us is not None else self.config.deadline_us
        if self._breaker_blocks():
            self.metrics.breaker_reject()
            return BREAKER_OPEN
        r = Request(x, time.perf_counter(), d)
        r.progress0 = self.batcher.completed
        if self.cache is not None:
            key = self.cache.key(x, self.versions.active.number)
            y = self.cache.get(key)
            self.metrics.cache(y is not None)
            if y is not None:
                r.y = y
                r.version = self.cache.key_version(key)
                r.state = DONE
                return r
            r.key = key
        if self._inline and d is None:
            self.batcher.run([r])  # in this thread; r.done is released on return
            return r
        self.batcher.put(r)
        return r

    def wait(self, r: Request | Unavailable, out: Any = None) -> np.ndarray | Unavailable:
        """The outputs of a submitted request (written into ``out`` too when given), or
        :class:`Unavailable`."""
        if isinstance(r, Unavailable):
            return r
        if r.state == PENDING:
            rem = r.deadline - time.perf_counter()
            if rem == float("inf"):
                got = r.done.acquire()
            else:
                got = r.done.acquire(timeout=rem) if rem > 0 else r.done.acquire(blocking=False)
            if not got:
                r.state = ABANDONED
                return self._missed(r)
            r.state = DONE
            if r.failure is not None:
                return self._failure_result(r.failure, r)
            if r.key is not None and self.cache is not None and r.version is not None:
                self.cache.put(r.key, r.y, r.version)  # stored only if r.key's version ran it
        self.breaker.success()
        self.metrics.served(time.perf_counter() - r.t0, self.versions.active.variant)
        if out is not None:
            if isinstance(out, np.ndarray):
                out[...] = r.y
            else:  # one buffer per output tensor (a multi-IO model)
                self._layout_or_refuse(out)[1].into(r.y, out)
        return r.y

    def abandon(self, r: Request | Unavailable) -> None:
        """Give up on a submitted request nobody will :meth:`wait` for (the rest of a gRPC
        batch once one sample missed): the serving thread skips it if it has not run yet."""
        if isinstance(r, Request) and r.state == PENDING:
            r.state = ABANDONED

    def _layout_or_refuse(self, what: Any) -> tuple[Layout, Layout]:
        lay = self.layout
        if lay is None:
            raise InputError(f"engine {self.strategy!r} serves a model with one output; pass one "
                             f"array, not a {type(what).__name__}")
        return lay

    def _failure_result(self, failure: Unavailable, r: Request) -> Unavailable:
        if failure.status is Status.DEADLINE:
            return self._missed(r)
        if failure.status is Status.STOPPED:
            return failure
        self.metrics.error()
        self._failed()
        return failure

    def try_predict_into(self, x: Any, out: Any,
                         deadline_us: float | None = None) -> bool | Unavailable:
        """Hot path: one sample in, its outputs written into ``out`` (a multi-IO model: the
        packed record, or a tuple/dict with one buffer per output); ``True`` or an
        :class:`Unavailable` (falsy) when the deadline passed, the breaker is open, the
        backend failed or the engine is stopped."""
        res = self.wait(self.submit(x, deadline_us), out)
        return res if isinstance(res, Unavailable) else OK

    def predict(self, x: Any, deadline_us: float | None = None) -> np.ndarray | Unavailable:
        """Outputs for one sample (a new array; a tuple, one per output, for a model with
        several outputs), or :class:`Unavailable`. A multi-input model takes a tuple or dict
        of arrays, or the packed record (:attr:`layout`)."""
        res = self.wait(self.submit(x, deadline_us))
        if isinstance(res, Unavailable):
            return res
        lay = self.layout
        if lay is None:
            return np.array(res)
        ys = lay[1].split(res)
        return ys[0] if len(ys) == 1 else ys

    # -- direct calls for co-located transports (the shm endpoint's poll thread) -------------
    def run_direct(self, x: np.ndarray, out: np.ndarray) -> None:
        """Run one already-validated sample ``x`` (shape ``(1, *input_shape)``, float32) on the
        active version in the *caller's* thread, outputs into ``out`` (``(1, *output_shape)``).

        It holds the backend's lock, so it never runs concurrently with the serving thread,
        inline calls, a swap's warm-up or another engine on the same model (one thread per
        executor at a time). No queue, breaker, cache or deadline: the caller (the shm poll
        loop) checks deadlines and input itself.
        Exceptions of the backend propagate."""
        slot = self.versions.active.plan.slot_for(1)  # read once: a swap never splits a call
        with slot.lock:  # the backend's own lock (hwbackends.exclusive): one thread at a time
            if slot.size == 1:
                slot.fn(x, out)
            else:  # a static-batch backend: pad to its batch size
                slot.x[0] = x[0]
                slot.x[1:] = 0.0
                slot.fn(slot.x, slot.y)
                out[0] = slot.y[0]

    # -- versions ---------------------------------------------------------------------------
    def _version_changed(self, kind: str, v: Version) -> None:
        if self.cache is not None:
            self.cache.clear()  # keys carry the version; clearing frees the old entries now
        self.metrics.swap(kind, v.number)
        log.info("%s: %s: now serving version %d (%s)", self.strategy, kind, v.number, v.variant)

    def swap(self, new: Any, *, tolerance: Tolerance | None | str = "config",
             shadow_samples: int | None = None, shadow_timeout_s: float | None = None,
             wait: bool = True, nice: int = 10,
             timeout_s: float | None = None) -> SwapResult | "Future[SwapResult]":
        """Replace the serving model without a pause (see :mod:`.lifecycle`).

        ``new``: a backend, ``{batch_size: backend}``, or a zero-argument factory returning one
        (run in the background, e.g. ``lambda: hwb.compile(model, "cpu.litert")``).
        ``tolerance``: the strategy's (a :class:`RouterStrategy` carries it), else the config's;
        ``None`` switches without shadow validation. ``timeout_s`` (default the config's
        ``swap_timeout_s``): a swap still running then is rejected and the engine is free.
        Returns the :class:`SwapResult` (or a Future of it with ``wait=False``)."""
        if not self._swap_lock.acquire(blocking=False):
            raise SwapError(f"a swap of {self.strategy!r} is already in progress; wait for it")
        active = self.versions.active
        if tolerance == "config":  # the strategy's own tolerance when the backend carries one
            tol = getattr(active.plan.slots[0].backend, "tolerance", None) or self.config.tolerance
        else:
            tol = tolerance
        limit = timeout_s if timeout_s is not None else self.config.swap_timeout_s
        ticket = SwapTicket()
        inner: Future[SwapResult] = Future()
        fut: Future[SwapResult] = Future()

        def job() -> None:
            try:
                inner.set_result(run_swap(
                    self.versions, new, tolerance=tol,  # type: ignore[arg-type]
                    shadow_samples=shadow_samples or self.config.shadow_samples,
                    shadow_timeout_s=shadow_timeout_s or self.config.shadow_timeout_s,
                    warmup=self.config.warmup, policy=self.config.policy, nice=nice,
                    on_reject=lambda: self.metrics.swap("rejected"), ticket=ticket))
            except BaseException as exc:
                inner.set_exception(exc)

        def supervise() -> None:
            # The job runs in its own thread so a factory or backend that hangs can be
            # abandoned: the ticket is cancelled (it can never install) and the lock freed.
            try:
                try:
                    res = inner.result(timeout=limit)
                except FutureTimeout:
                    ticket.cancel()
                    self.versions.shadow = None
                    self.metrics.swap("rejected")
                    res = SwapResult(False, None, self.versions.active.number,
                                     f"the swap did not finish in {limit:g} s (stuck in its "
                                     f"{ticket.phase} phase); the serving version is unchanged "
                                     f"and the next swap may start")
                if not res.accepted:
                    log.warning("%s: swap rejected: %s", self.strategy, res.reason)
                fut.set_result(res)
            except BaseException as exc:
                fut.set_exception(exc)
            finally:
                self._swap_lock.release()
        threading.Thread(target=job, name=f"hwb-swap-{self.strategy}", daemon=True).start()
        threading.Thread(target=supervise, name=f"hwb-swap-watch-{self.strategy}", daemon=True).start()
        return fut.result() if wait else fut

    def rollback(self) -> int:
        """Serve the previous version again (atomically); returns its number."""
        with self._swap_lock:
            v = self.versions.rollback()
            if v is None:
                raise SwapError(f"{self.strategy!r} has no previous version to roll back to")
            return v.number

    # -- reporting --------------------------------------------------------------------------
    def _failovers(self) -> int:
        """The active version's failovers as its backends count them (a router strategy's)."""
        fo = [getattr(b, "failovers", None) for b in self.versions.active.plan.backends]
        return sum(int(f()) for f in fo if f is not None)

    def stats(self) -> dict[str, Any]:
        s = self.metrics.snapshot()
        plan = self.versions.active.plan
        failovers = self._failovers()
        s.update({"version": self.version, "variant": self.variant, "failovers": failovers,
                  "batch_sizes_allowed": plan.sizes,
                  "breaker_open": self.breaker.is_open,
                  "breaker_state": self.breaker.state.value,
                  "breaker_min_deadline_us": self._fair_budget_us,
                  "cache": None if self.cache is None else vars(self.cache.stats()) | {
                      "hit_rate": self.cache.stats().hit_rate}})
        return s
