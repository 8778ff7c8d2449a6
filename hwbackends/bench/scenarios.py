"""Benchmark scenarios and the timing loops behind them.

* ``single-stream``: closed loop, one call at a time, the next as soon as the last returns
  (MLPerf single-stream): the variant's own service time.
* ``server``: open loop, Poisson arrivals at ``rate_hz``. Latency runs from each request's
  *scheduled* arrival to its completion, so a call that waits behind a slow one is charged
  the wait (no coordinated omission, as MLPerf LoadGen).
* ``burst``: open-loop replay of a tick-arrival trace (``hwb_sim``): quiet periods and bursts.
* ``batch``: closed loop at N samples per tick (N symbols scored at once), N swept.
* ``sliding``: a windowed model (input ``(T, *step)``) fed one tick at a time through
  ``cm.sliding()``: tick → answer (``push_into``) timed, the ``prepare()`` after it timed apart
  (as STAC-ML Tacana reports it), and the full window (``predict_into``) in the same
  interleaved run, so the two are compared under the same noise; then under load, over
  ``cm.sliding(streams=N)`` for each ``N`` of ``streams`` (STAC-ML's NMI): ticks round-robin in
  a closed loop (:func:`streams_loop`: the rate one core sustains) and Poisson ticks at offered
  rates in open loops (:func:`streams_open_loop`), as hwbackends/bench/load.py keeps them.

The loops time with ``perf_counter_ns`` around the bare ``predict_into`` (the hot path), keep
the garbage collector off while measuring, and stop cleanly on Ctrl-C keeping what was
measured.
"""
from __future__ import annotations

import gc
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ConfigError

Fn = Callable[[np.ndarray, np.ndarray], None]
#: Open loops busy-wait this close to a scheduled arrival instead of sleeping.
SPIN_NS = 200_000


# -- scenarios --------------------------------------------------------------------------------
@dataclass(frozen=True)
class SingleStream:
    n: int = 2000
    max_s: float = 10.0
    warmup: int = 200
    name: str = field(default="single-stream", init=False)

    def key(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Server:
    rate_hz: float = 1000.0
    n: int = 2000
    max_s: float = 10.0
    warmup: int = 200
    seed: int = 0
    name: str = field(default="server", init=False)

    def key(self) -> dict[str, Any]:
        return asdict(self)

    def arrivals(self) -> np.ndarray:
        """Seeded Poisson arrival times (s): exponential gaps at ``rate_hz``."""
        rng = np.random.default_rng(self.seed)
        return np.cumsum(rng.exponential(1.0 / self.rate_hz, self.n))


@dataclass(frozen=True)
class Burst:
    duration_s: float = 2.0
    seed: int = 0
    trace: str | None = None  # a file of timestamps; generated from the seed when None
    unit: str = "s"
    warmup: int = 200
    max_s: float = 60.0
    name: str = field(default="burst", init=False)

    def key(self) -> dict[str, Any]:
        d = asdict(self)
        if self.trace:  # the file's content, not its name, identifies the trace
            import hashlib
            d["trace_sha256"] = hashlib.sha256(read_trace(self.trace)).hexdigest()[:16]
        return d

    def load(self) -> Any:
        import hwb_sim
        if self.trace:
            read_trace(self.trace)  # a regular file of bounded size, or refused unread
            return hwb_sim.load(self.trace, self.unit)
        return hwb_sim.generate(self.duration_s, self.seed)


#: The largest tick-arrival trace file read (10 M timestamps as text).
MAX_TRACE_BYTES = 256 << 20


def read_trace(path: str) -> bytes:
    """The bytes of a ``trace=FILE``: a regular file of at most :data:`MAX_TRACE_BYTES`
    (:func:`hwbackends.config.read_small_file`: a FIFO never blocks, a device is refused)."""
    from ..user_files import read_small_file

    return read_small_file(path, "trace file", MAX_TRACE_BYTES)


@dataclass(frozen=True)
class Batch:
    sizes: tuple[int, ...] = (1, 8, 32)
    n: int = 1000
    max_s: float = 5.0
    warmup: int = 100
    name: str = field(default="batch", init=False)

    def key(self) -> dict[str, Any]:
        return asdict(self)


#: The numbers of windows (model instances, STAC-ML's NMI) the STAC-ML sweep runs.
NMI_SWEEP = (1, 2, 4, 8, 24)
#: Offered aggregate rates of the load sweep when no ``rate`` is given: these fractions of the
#: rate one core sustains at that many windows (1 / the closed loop's median push + prepare).
AUTO_LOAD = (0.25, 0.5, 0.75, 0.9, 1.0, 1.2)
#: At most this many windows per scenario (``streams=``), as ``sliding(streams=N)`` allows.
MAX_SLIDING_STREAMS = 1 << 16


@dataclass(frozen=True)
class Sliding:
    """``n`` ticks, in ``rounds`` rounds; each round pushes ``n / rounds`` fresh steps (each
    followed by its timed ``prepare``) then runs as many full windows. Then the **load
    sweep**, for each count of windows in ``streams`` (``cm.sliding(streams=N)``): a closed
    loop (``ticks`` ticks round-robin over the ``N`` windows, push and prepare timed apart:
    the rate one core sustains) and, at each offered per-stream rate of ``rate_hz`` (empty:
    :data:`AUTO_LOAD` of that sustainable rate), an open loop of Poisson ticks at ``N ×
    rate`` (and at each aggregate rate of ``offered_hz``) to windows drawn at random, latency
    from each tick's scheduled arrival. The sweep
    takes at most ``max_s`` more; ``streams=()`` skips it. ``budget_us``: the p99 the knee is
    taken at (the router uses its tier's)."""

    n: int = 2000
    max_s: float = 10.0
    warmup: int = 200
    rounds: int = 5
    streams: tuple[int, ...] = (1,)
    rate_hz: tuple[float, ...] = ()
    #: Aggregate offered rates (ticks/s over all the windows) measured at every count of
    #: windows besides ``rate_hz`` (the router adds its strategy's load per core).
    offered_hz: tuple[float, ...] = ()
    ticks: int = 1000
    budget_us: float | None = None
    seed: int = 0
    name: str = field(default="sliding", init=False)

    def key(self) -> dict[str, Any]:
        return asdict(self)


Scenario = SingleStream | Server | Burst | Batch | Sliding
SCENARIOS: dict[str, type] = {"single-stream": SingleStream, "server": Server, "burst": Burst,
                              "batch": Batch, "sliding": Sliding}
#: The scenarios that run open loop (and so measure a no-op noise floor beside the variant).
OPEN_LOOP = (Server, Burst)


#: The bounds of each numeric scenario setting: the timed calls of one run keep 8 bytes each
#: (the CLI's MAX_CALLS), a run is bounded in time, a rate by what a clock can schedule.
MAX_CALLS = 10_000_000
MAX_WARMUP = 1_000_000
MAX_SIZES = 32
MAX_RUN_S = 3600.0
MAX_BURST_S = 600.0


def _setting(cls: type, k: str, v: str) -> Any:
    """One numeric setting ``k`` of scenario ``cls`` through the number parser of its kind
    (:mod:`hwbackends.units`), with its bounds; a ConfigError (a ValueError) naming the form."""
    from ..units import MAX_BATCH, parse_count, parse_rate, parse_seconds, parse_us

    def several(parse: Callable[[str], Any], example: str) -> tuple[Any, ...]:
        parts = v.split("/")
        if len(parts) > MAX_SIZES:
            raise ConfigError(f"at most {MAX_SIZES} values, e.g. {example}")
        return tuple(parse(s) for s in parts)

    if k == "sizes":
        return several(lambda s: parse_count(s, 1, MAX_BATCH, "a batch size", 8), "1/8/32")
    if cls is Sliding and k == "streams":
        v = v.strip()
        if v in ("stac", "none"):  # the STAC-ML sweep, or no load sweep
            return NMI_SWEEP if v == "stac" else ()
        return several(lambda s: parse_count(s, 1, MAX_SLIDING_STREAMS, "a count of windows", 8),
                       "1/2/4/8/24, 'stac', or 'none' (no load sweep)")
    if cls is Sliding and k in ("rate_hz", "offered_hz"):  # ticks per second per stream
        return several(parse_rate, "200/1000")
    if k in ("n", "ticks"):
        return parse_count(v, 1, MAX_CALLS, "a count", 2000, "each call keeps an 8-byte timing")
    if k == "warmup":
        return parse_count(v, 0, MAX_WARMUP, "a warm-up count", 200)
    if k == "seed":
        return parse_count(v, 0, (1 << 32) - 1, "a seed", 0)
    if k == "rounds":
        return parse_count(v, 1, 10_000, "a round count", 5)
    if k == "rate_hz":
        return parse_rate(v)
    if k == "budget_us":
        return parse_us(v)
    if k == "duration_s":
        return parse_seconds(v, hi=MAX_BURST_S)
    return parse_seconds(v, hi=MAX_RUN_S)  # max_s: a run's time limit


def parse(spec: str) -> Scenario:
    """``NAME[:key=value,...]``: ``single-stream:n=5000``, ``server:rate_hz=2000``,
    ``burst:trace=ticks.txt,unit=ms``, ``batch:sizes=1/8/64``,
    ``sliding:streams=1/2/4/8/24,rate=200/1000,budget_us=50`` (``streams=stac``: the
    STAC-ML sweep :data:`NMI_SWEEP`)."""
    name, _, rest = spec.partition(":")
    cls = SCENARIOS.get(name.strip())
    if cls is None:
        raise ConfigError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)} "
                          f"(optionally NAME:key=value,...)")
    fields = {f: t for f, t in cls.__dataclass_fields__.items() if f != "name"}
    kw: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        k, eq, v = item.partition("=")
        k = {"rate": "rate_hz", "duration": "duration_s", "offered": "offered_hz"}.get(k.strip(), k.strip())
        if not eq or k not in fields:
            raise ConfigError(f"scenario {name}: bad parameter {item!r}; allowed: "
                              f"{', '.join(f'{f}=…' for f in fields)}")
        try:
            kw[k] = v if k in ("trace", "unit") else _setting(cls, k, v)
        except ValueError as exc:
            raise ConfigError(f"scenario {name}: {k}={v[:40]!r} is not valid: {exc}") from None
    return cls(**kw)


# -- progress ---------------------------------------------------------------------------------
class ProgressBar:
    """A one-line progress indicator on stderr, redrawn at most 5 times a second. It is
    drawn between calls, never inside a timed region."""

    def __init__(self, label: str, total: int, enabled: bool = True):
        self.label, self.total, self.enabled = label, max(total, 1), enabled
        self._next = 0.0
        self._tty = sys.stderr.isatty()

    def update(self, done: int) -> None:
        if not self.enabled or not self._tty:
            return
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + 0.2
        frac = min(done / self.total, 1.0)
        bar = "█" * int(frac * 24) + "·" * (24 - int(frac * 24))
        sys.stderr.write(f"\r  {self.label:<44} {bar} {done:>7}/{self.total}")
        sys.stderr.flush()

    def done(self, note: str = "") -> None:
        if not self.enabled:
            return
        if self._tty:
            sys.stderr.write("\r" + " " * 100 + "\r")
        sys.stderr.write(f"  · {self.label} {note}\n")
        sys.stderr.flush()


# -- timing loops -----------------------------------------------------------------------------
@dataclass
class Timing:
    """Raw outcome of one loop: per-call latency (ns) and, for open loops, service time and
    the scheduled arrival offsets."""

    latency_ns: np.ndarray
    wall_s: float
    interrupted: bool = False
    service_ns: np.ndarray | None = None
    arrivals_s: np.ndarray | None = None


def _warm(fn: Fn, xs: Sequence[np.ndarray], out: np.ndarray, n: int) -> None:
    k = len(xs)
    for j in range(n):
        fn(xs[j % k], out)


def closed_loop(fn: Fn, xs: Sequence[np.ndarray], out: np.ndarray, n: int, max_s: float,
                warmup: int = 0, bar: ProgressBar | None = None) -> Timing:
    """``n`` calls back to back (stopping early after ``max_s``)."""
    _warm(fn, xs, out, warmup)
    clock = time.perf_counter_ns
    lat = np.empty(n, np.int64)
    k = len(xs)
    i = 0
    interrupted = False
    gc_was = gc.isenabled()
    gc.disable()  # a collection inside a timed call is the harness's noise, not the model's
    start = clock()
    stop = start + int(max_s * 1e9)
    try:
        while i < n:
            x = xs[i % k]
            t0 = clock()
            fn(x, out)
            lat[i] = clock() - t0
            i += 1
            if not i & 255:
                if bar:
                    bar.update(i)
                if clock() > stop:
                    break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if gc_was:
            gc.enable()
    return Timing(lat[:i], (clock() - start) / 1e9, interrupted)


def schedule(arrivals_s: np.ndarray, max_s: float) -> tuple[int, np.ndarray, int]:
    """An open loop's clock: its start (1 ms from now), each arrival's scheduled
    ``perf_counter_ns`` and the time past which it stops."""
    start = time.perf_counter_ns() + 1_000_000
    sched = start + (np.asarray(arrivals_s, dtype=np.float64) * 1e9).astype(np.int64)
    return start, sched, start + int(max_s * 1e9)


def wait_until(s: int) -> None:
    """Sleep through the gap to ``perf_counter_ns`` time ``s`` and spin its last 200 µs
    (sleep overshoots by tens of µs). On a busy machine a sleeper can still wake late; that
    lateness is charged, as it would be to a real server thread. Called only when ahead of
    the schedule, so a loop that is behind pays no call."""
    clock = time.perf_counter_ns
    now = clock()
    if s - now > 2 * SPIN_NS:
        time.sleep((s - now - SPIN_NS) / 1e9)
    while clock() < s:
        pass


def open_loop(fn: Fn, xs: Sequence[np.ndarray], out: np.ndarray, arrivals_s: np.ndarray,
              max_s: float, warmup: int = 0, bar: ProgressBar | None = None) -> Timing:
    """Requests arrive at ``arrivals_s`` (seconds from the start) whatever the variant does;
    one server takes them in order. Latency = completion − *scheduled* arrival."""
    _warm(fn, xs, out, warmup)
    clock = time.perf_counter_ns
    m = len(arrivals_s)
    lat = np.empty(m, np.int64)
    svc = np.empty(m, np.int64)
    k = len(xs)
    i = 0
    interrupted = False
    gc_was = gc.isenabled()
    gc.disable()
    start, sched, stop = schedule(arrivals_s, max_s)
    try:
        while i < m:
            s = int(sched[i])
            if clock() < s:
                wait_until(s)
            x = xs[i % k]
            t0 = clock()
            fn(x, out)
            t1 = clock()
            lat[i] = t1 - s
            svc[i] = t1 - t0
            i += 1
            if not i & 63:
                if bar:
                    bar.update(i)
                if t1 > stop:
                    break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if gc_was:
            gc.enable()
    return Timing(lat[:i], (clock() - start) / 1e9, interrupted, svc[:i],
                  np.asarray(arrivals_s[:i], dtype=np.float64))


def timeline(arrivals_s: np.ndarray, latency_ns: np.ndarray, bins: int = 100) -> dict[str, list[float]]:
    """Per time bin: arrival rate (Hz) and p99/max latency (µs), for the burst plot."""
    if len(arrivals_s) == 0:
        return {"t_s": [], "rate_hz": [], "p99_us": [], "max_us": []}
    end = float(arrivals_s[-1]) or 1e-3
    edges = np.linspace(0.0, end * (1 + 1e-9), bins + 1)
    idx = np.clip(np.searchsorted(edges, arrivals_s, side="right") - 1, 0, bins - 1)
    width = edges[1] - edges[0]
    us = latency_ns / 1e3
    t, rate, p99, mx = [], [], [], []
    for b in range(bins):
        sel = us[idx == b]
        t.append(float(edges[b] + width / 2))
        rate.append(float(len(sel) / width))
        p99.append(float(np.quantile(sel, 0.99)) if len(sel) else float("nan"))
        mx.append(float(sel.max()) if len(sel) else float("nan"))
    return {"t_s": t, "rate_hz": rate, "p99_us": p99, "max_us": mx}


def noop(x: Any, out: Any) -> None:
    """What the noise-floor loop calls: nothing, through the same call the variant gets."""


@dataclass
class SlidingTiming:
    """Raw outcome of :func:`sliding_loop`: per-tick ``push_into`` and ``prepare`` latency and
    per-call full-window ``predict_into`` latency (ns)."""

    push_ns: np.ndarray
    prepare_ns: np.ndarray
    full_ns: np.ndarray
    wall_s: float
    interrupted: bool = False


def sliding_loop(push: Fn, prepare: Callable[[], None], full: Fn, steps: Sequence[np.ndarray],
                 out_step: np.ndarray, xs: Sequence[np.ndarray], out: np.ndarray, n: int,
                 max_s: float, warmup: int = 0, rounds: int = 5,
                 bar: ProgressBar | None = None) -> SlidingTiming:
    """``rounds`` rounds of: ``n / rounds`` ticks (``push(steps[i], out_step)`` timed, then
    ``prepare()`` timed apart), then ``n / rounds`` full windows (``full(xs[j], out)``).
    ``steps`` are cycled, so every tick pushes a new step, not one repeated."""
    k = len(steps)
    clock = time.perf_counter_ns
    warm_stop = clock() + int(max_s * 0.25e9)  # a slow target (ref) warms up in bounded time
    for j in range(warmup):
        push(steps[j % k], out_step)
        prepare()
        if clock() > warm_stop:
            warmup = j + 1
            break
    for j in range(min(warmup, 50)):
        full(xs[j % len(xs)], out)
        if clock() > warm_stop + int(max_s * 0.1e9):
            break
    per = max(n // max(rounds, 1), 1)
    push_ns = np.empty(per * rounds, np.int64)
    prep_ns = np.empty(per * rounds, np.int64)
    full_ns = np.empty(per * rounds, np.int64)
    kf = len(xs)
    i = f = 0
    s = warmup  # the next step to push: the window keeps sliding on from the warm-up
    interrupted = False
    gc_was = gc.isenabled()
    gc.disable()
    start = clock()
    stop = start + int(max_s * 1e9)
    # Each round gets max_s / rounds, half for the ticks and half for the full windows, so a
    # slow target still has both measured, interleaved, within its time.
    share = int(max_s * 1e9 / max(rounds, 1) / 2)
    try:
        for r in range(rounds):
            half = min(start + (2 * r + 1) * share, stop)
            for _ in range(per):
                x = steps[s % k]
                s += 1
                t0 = clock()
                push(x, out_step)
                t1 = clock()
                prepare()
                t2 = clock()
                push_ns[i] = t1 - t0
                prep_ns[i] = t2 - t1
                i += 1
                if t2 > half:  # a slow target stops mid-round, not rounds late
                    break
            for _ in range(per):
                x = xs[f % kf]
                t0 = clock()
                full(x, out)
                t1 = clock()
                full_ns[f] = t1 - t0
                f += 1
                if t1 > half + share:
                    break
            if bar:
                bar.update(i)
            if clock() > stop:
                break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if gc_was:
            gc.enable()
    return SlidingTiming(push_ns[:i], prep_ns[:i], full_ns[:f], (clock() - start) / 1e9,
                         interrupted)


Push = Callable[[int, np.ndarray, np.ndarray], None]


@dataclass
class StreamsTiming:
    """Raw outcome of :func:`streams_loop` / :func:`streams_open_loop` (ns): per tick, the
    ``push_into`` (closed loop) or the tick's latency from its scheduled arrival (open loop),
    and the ``prepare()`` after it; open loops add each push's own service time."""

    latency_ns: np.ndarray
    prepare_ns: np.ndarray
    wall_s: float
    interrupted: bool = False
    service_ns: np.ndarray | None = None


def streams_loop(push: Push, prepare: Callable[[], None], steps: Sequence[np.ndarray],
                 out: np.ndarray, streams: int, n: int, max_s: float, warmup: int = 0,
                 bar: ProgressBar | None = None) -> StreamsTiming:
    """Closed loop over ``streams`` windows: ``n`` ticks round-robin (tick ``j`` to window
    ``j % streams``, a new step each), ``push(i, step, out)`` timed, then ``prepare()`` timed
    apart (stopping early after ``max_s``)."""
    k = len(steps)
    for j in range(min(warmup, k)):
        push(j % streams, steps[j], out)
        prepare()
    clock = time.perf_counter_ns
    lat = np.empty(n, np.int64)
    prep = np.empty(n, np.int64)
    i = 0
    s = warmup
    interrupted = False
    gc_was = gc.isenabled()
    gc.disable()
    start = clock()
    stop = start + int(max_s * 1e9)
    try:
        while i < n:
            x = steps[s % k]
            w = s % streams
            s += 1
            t0 = clock()
            push(w, x, out)
            t1 = clock()
            prepare()
            t2 = clock()
            lat[i] = t1 - t0
            prep[i] = t2 - t1
            i += 1
            if not i & 255:
                if bar:
                    bar.update(i)
                if t2 > stop:
                    break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if gc_was:
            gc.enable()
    return StreamsTiming(lat[:i], prep[:i], (clock() - start) / 1e9, interrupted)


def streams_open_loop(push: Push, prepare: Callable[[], None], steps: Sequence[np.ndarray],
                      out: np.ndarray, arrivals_s: np.ndarray, ids: np.ndarray, max_s: float,
                      bar: ProgressBar | None = None) -> StreamsTiming:
    """Open loop over several windows: tick ``j`` arrives at ``arrivals_s[j]`` for window
    ``ids[j]`` whatever the variant does; one server answers them in order, each push followed
    by the ``prepare()`` the next tick needs (a tick that arrives during a prepare waits for
    it). Latency = the push's completion − the tick's *scheduled* arrival, as
    :func:`open_loop`."""
    k = len(steps)
    clock = time.perf_counter_ns
    m = len(arrivals_s)
    lat = np.empty(m, np.int64)
    svc = np.empty(m, np.int64)
    prep = np.empty(m, np.int64)
    wid = [int(i) for i in ids]
    i = 0
    interrupted = False
    gc_was = gc.isenabled()
    gc.disable()
    start, sched, stop = schedule(arrivals_s, max_s)
    try:
        while i < m:
            s = int(sched[i])
            if clock() < s:
                wait_until(s)
            x = steps[i % k]
            t0 = clock()
            push(wid[i], x, out)
            t1 = clock()
            prepare()
            t2 = clock()
            lat[i] = t1 - s
            svc[i] = t1 - t0
            prep[i] = t2 - t1
            i += 1
            if not i & 63:
                if bar:
                    bar.update(i)
                if t2 > stop:
                    break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if gc_was:
            gc.enable()
    return StreamsTiming(lat[:i], prep[:i], (clock() - start) / 1e9, interrupted, svc[:i])
