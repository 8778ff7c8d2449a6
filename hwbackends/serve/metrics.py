"""Serving metrics: exact in-process counters (``Engine.stats()``) and, opt-in, Prometheus.

Prometheus families follow the naming conventions (``hwb_serve_*``, base units, ``_seconds``
histograms, ``_total`` counters) and carry ``strategy`` (and ``variant`` where it varies with
swaps and failover) labels. One :class:`PromMetrics` holds the families for any number of
engines; its HTTP endpoint binds 127.0.0.1 unless told otherwise. ``prometheus-client`` is
imported only when Prometheus is asked for (the ``serve`` extra).
"""
from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any, Callable

import numpy as np

from ..errors import ConfigError

#: Latency buckets from 5 µs to 1 s: the interesting range for a signal is 5 µs–10 ms.
LATENCY_BUCKETS = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2,
                   5e-2, 0.1, 0.25, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class PromMetrics:
    """The Prometheus metric families, in their own registry (several servers or tests in one
    process never collide in the global one)."""

    def __init__(self, registry: Any = None):
        try:
            import prometheus_client as pc
        except ImportError as exc:  # pragma: no cover - the serve extra is missing
            raise ConfigError("metrics need prometheus-client: pip install 'hwbackends[serve]'") from exc
        self._pc = pc
        r = self.registry = registry or pc.CollectorRegistry()
        H, C, G = pc.Histogram, pc.Counter, pc.Gauge
        self.latency = H("hwb_serve_request_latency_seconds", "End-to-end engine latency per request "
                         "(queue wait + batch run), served requests only", ["strategy", "variant"],
                         buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = H("hwb_serve_queue_wait_seconds", "Time a request waited for its batch "
                            "to start", ["strategy"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = H("hwb_serve_batch_size", "Requests per executed batch (before padding)",
                            ["strategy"], buckets=BATCH_BUCKETS, registry=r)
        self.requests = C("hwb_serve_requests_total", "Requests by outcome (ok, unavailable, error)",
                          ["strategy", "outcome"], registry=r)
        self.cache_hits = C("hwb_serve_cache_hits_total", "Inference cache hits", ["strategy"], registry=r)
        self.cache_misses = C("hwb_serve_cache_misses_total", "Inference cache misses", ["strategy"],
                              registry=r)
        self.deadline_misses = C("hwb_serve_deadline_misses_total", "Requests past their deadline "
                                 "(answered 'signal unavailable')", ["strategy"], registry=r)
        self.failovers = G("hwb_serve_failovers", "Calls a router candidate failed or timed out on "
                           "(served by the next candidate) plus the router's switches off a failing "
                           "or slow variant, as the router counts them (read at each scrape)",
                           ["strategy"], registry=r)
        self.swaps = C("hwb_serve_swaps_total", "Model swaps by outcome (accepted, rejected, "
                       "rollback)", ["strategy", "outcome"], registry=r)
        self.model_version = G("hwb_serve_model_version", "Version number now serving", ["strategy"],
                               registry=r)
        self.pinned_cores = G("hwb_serve_pinned_cores", "CPU cores the serving thread may run on "
                              "(0: not pinned)", ["strategy", "cores"], registry=r)
        self.breaker_open = G("hwb_serve_breaker_open", "1 while the deadline breaker is open",
                              ["strategy"], registry=r)

    def text(self) -> bytes:
        return self._pc.generate_latest(self.registry)

    def serve_http(self, port: int = 0, addr: str = "127.0.0.1") -> tuple[Any, int]:
        """Start the /metrics endpoint in a daemon thread; returns (server, bound port).
        ``port=0`` picks a free port. Call ``server.shutdown()`` to stop it."""
        server, _thread = self._pc.start_http_server(port, addr=addr, registry=self.registry)
        return server, server.server_address[1]


class EngineMetrics:
    """One engine's counters. Plain fields are exact (``+=`` under a lock on multi-writer
    paths); each event is mirrored to Prometheus when a :class:`PromMetrics` is attached."""

    def __init__(self, strategy: str, prom: PromMetrics | None = None, samples: int = 100_000):
        self.strategy = strategy
        self.prom = prom
        self._lock = threading.Lock()
        self.requests = self.ok = self.errors = 0
        self.deadline_misses = self.breaker_rejects = 0
        #: The part of ``deadline_misses`` on budgets too small to be fair to the backend
        #: (they never count toward the breaker).
        self.client_deadline_misses = 0
        #: The part of ``deadline_misses`` while the backend kept completing batches: the request
        #: waited behind work queued ahead of it (any client's), so the miss is load, not a
        #: backend fault, and never counts toward the breaker.
        self.load_deadline_misses = 0
        self.cache_hits = self.cache_misses = 0
        self.batches = 0
        self.batch_sizes: Counter[int] = Counter()
        self.swaps: Counter[str] = Counter()
        self.latency_s: deque[float] = deque(maxlen=samples)   # recent served requests
        self.queue_wait_s: deque[float] = deque(maxlen=samples)
        self.pinned: tuple[int, ...] = ()
        if prom is not None:
            s = strategy
            self._p_qwait = prom.queue_wait.labels(s)
            self._p_batch = prom.batch_size.labels(s)
            self._p_ok = prom.requests.labels(s, "ok")
            self._p_unav = prom.requests.labels(s, "unavailable")
            self._p_err = prom.requests.labels(s, "error")
            self._p_hit = prom.cache_hits.labels(s)
            self._p_miss = prom.cache_misses.labels(s)
            self._p_dl = prom.deadline_misses.labels(s)
            self._p_lat: dict[str, Any] = {}

    # -- caller threads ---------------------------------------------------------------------
    def served(self, seconds: float, variant: str) -> None:
        self.latency_s.append(seconds)  # deque.append is atomic
        with self._lock:
            self.ok += 1
        if self.prom is not None:
            h = self._p_lat.get(variant)
            if h is None:
                h = self._p_lat[variant] = self.prom.latency.labels(self.strategy, variant)
            h.observe(seconds)
            self._p_ok.inc()

    def deadline_miss(self) -> None:
        with self._lock:
            self.deadline_misses += 1
        if self.prom is not None:
            self._p_dl.inc()
            self._p_unav.inc()

    def client_deadline_miss(self) -> None:
        with self._lock:
            self.client_deadline_misses += 1
        self.deadline_miss()

    def load_deadline_miss(self) -> None:
        with self._lock:
            self.load_deadline_misses += 1
        self.deadline_miss()

    def breaker_reject(self) -> None:
        with self._lock:
            self.breaker_rejects += 1
        if self.prom is not None:
            self._p_unav.inc()

    def error(self) -> None:
        with self._lock:
            self.errors += 1
        if self.prom is not None:
            self._p_err.inc()

    def cache(self, hit: bool) -> None:
        with self._lock:
            if hit:
                self.cache_hits += 1
            else:
                self.cache_misses += 1
        if self.prom is not None:
            (self._p_hit if hit else self._p_miss).inc()

    # -- the serving thread (single writer) -------------------------------------------------
    def batch(self, n: int, waits: list[float]) -> None:
        self.batches += 1
        self.batch_sizes[n] += 1
        self.queue_wait_s.extend(waits)
        if self.prom is not None:
            self._p_batch.observe(n)
            for w in waits:
                self._p_qwait.observe(w)

    # -- rare events ------------------------------------------------------------------------
    def swap(self, outcome: str, version: int | None = None) -> None:
        with self._lock:
            self.swaps[outcome] += 1
        if self.prom is not None:
            self.prom.swaps.labels(self.strategy, outcome).inc()
            if version is not None:
                self.prom.model_version.labels(self.strategy).set(version)

    def set_pinned(self, cores: tuple[int, ...]) -> None:
        self.pinned = cores
        if self.prom is not None:
            self.prom.pinned_cores.labels(self.strategy, ",".join(map(str, cores))).set(len(cores))

    def set_breaker(self, open_: bool) -> None:
        if self.prom is not None:
            self.prom.breaker_open.labels(self.strategy).set(1 if open_ else 0)

    def bind_failovers(self, fn: Callable[[], float]) -> None:
        """The failovers gauge reads ``fn()`` at every scrape (the router's own count, live)."""
        if self.prom is not None:
            self.prom.failovers.labels(self.strategy).set_function(fn)

    def set_version(self, v: int) -> None:
        if self.prom is not None:
            self.prom.model_version.labels(self.strategy).set(v)

    # -- reading ----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        lat = np.fromiter(self.latency_s, float) if self.latency_s else np.zeros(0)
        qw = np.fromiter(self.queue_wait_s, float) if self.queue_wait_s else np.zeros(0)

        def pct(a: np.ndarray, q: float) -> float | None:
            return float(np.percentile(a, q) * 1e6) if a.size else None

        return {"strategy": self.strategy, "requests_ok": self.ok, "errors": self.errors,
                "deadline_misses": self.deadline_misses,
                "client_deadline_misses": self.client_deadline_misses,
                "load_deadline_misses": self.load_deadline_misses,
                "breaker_rejects": self.breaker_rejects,
                "cache_hits": self.cache_hits, "cache_misses": self.cache_misses,
                "batches": self.batches, "batch_sizes": dict(sorted(self.batch_sizes.items())),
                "latency_us": {"p50": pct(lat, 50), "p99": pct(lat, 99), "p99.9": pct(lat, 99.9),
                               "n": int(lat.size)},
                "queue_wait_us": {"p50": pct(qw, 50), "p99": pct(qw, 99), "n": int(qw.size)},
                "swaps": dict(self.swaps), "pinned_cores": list(self.pinned)}
