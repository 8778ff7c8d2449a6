"""Load-test client: replay a tick trace against the in-process engine, the shared-memory or
the gRPC endpoint, open loop, and report p50/p99/p99.9.

Arrivals come from ``sim.ticks.generate`` (seeded quiet periods and bursts). Latency counts
from each tick's *scheduled* time, not from when a worker got to it, so a server that falls
behind cannot hide its queue (no coordinated omission, as MLPerf LoadGen). Bounded: at most
``max_requests`` ticks and ``max_seconds`` of wall time; network endpoints must be loopback.

    python -m hwbackends.serve.loadtest --grpc 127.0.0.1:50051 --token-file t --cert c.pem
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from ..errors import ConfigError
from .engine import Unavailable

Call = Callable[[np.ndarray], Any]   # one sample → outputs or Unavailable (may raise)


@dataclass
class LoadReport:
    endpoint: str
    offered: int
    completed: int
    unavailable: int
    errors: int
    duration_s: float
    p50_us: float
    p99_us: float
    p999_us: float
    max_us: float
    achieved_qps: float
    trace: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return (f"{self.endpoint}: {self.completed}/{self.offered} ok, {self.unavailable} "
                f"unavailable, {self.errors} errors; p50 {self.p50_us:.0f} µs, p99 "
                f"{self.p99_us:.0f} µs, p99.9 {self.p999_us:.0f} µs, max {self.max_us:.0f} µs "
                f"({self.achieved_qps:.0f}/s)")


def replay(make_call: Callable[[], Call], xs: np.ndarray, *, trace: Any = None,
           duration_s: float = 2.0, seed: int = 0, workers: int = 4, max_requests: int = 20_000,
           max_seconds: float = 30.0, endpoint: str = "engine",
           time_scale: float = 1.0) -> LoadReport:
    """Replay ``trace`` (default: ``sim.ticks.generate(duration_s, seed)``) with ``workers``
    threads, each with its own ``make_call()`` client (a shared-memory slot, a channel …).
    ``time_scale`` > 1 compresses the trace (a higher offered load)."""
    if trace is None:
        from hwb_sim.ticks import generate
        trace = generate(duration_s=duration_s, seed=seed)
    ts = np.asarray(trace.timestamps, float)[:max_requests] / time_scale
    n = len(ts)
    if n == 0:
        raise ConfigError("the trace has no ticks")
    lat = np.full(n, np.nan)
    outcome = np.zeros(n, np.int8)   # 0 ok, 1 unavailable, 2 error
    nxt = [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + max_seconds
    start = [0.0]
    ready = threading.Barrier(workers + 1)

    def work() -> None:
        call = make_call()
        ready.wait()
        clock = time.perf_counter
        t0 = start[0]
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n or clock() > stop_at:
                break
            due = t0 + ts[i]
            while True:  # sleep until ~80 µs before the tick (timer slack), then spin
                d = due - clock()
                if d <= 0:
                    break
                # spinning threads fight the server for the GIL: keep the spin short
                time.sleep(d - 8e-5 if d > 1e-4 else 0)
            try:
                r = call(xs[i % len(xs)])
                outcome[i] = 1 if isinstance(r, Unavailable) else 0
            except Exception:
                outcome[i] = 2
            lat[i] = clock() - due  # from the scheduled arrival
        close = getattr(call, "close", None)
        if close:
            close()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    start[0] = time.perf_counter() + 0.05
    ready.wait()
    for t in threads:
        t.join(max_seconds + 10)
    wall = time.perf_counter() - start[0]
    done = ~np.isnan(lat)
    ok = done & (outcome == 0)
    l_ok = lat[ok] * 1e6 if ok.any() else np.array([np.nan])
    return LoadReport(endpoint, n, int(ok.sum()), int((done & (outcome == 1)).sum()),
                      int((done & (outcome == 2)).sum()), wall,
                      float(np.percentile(l_ok, 50)), float(np.percentile(l_ok, 99)),
                      float(np.percentile(l_ok, 99.9)), float(np.max(l_ok)),
                      float(ok.sum() / wall) if wall > 0 else 0.0,
                      trace.describe() if hasattr(trace, "describe") else {})


def _shm_call(name: str) -> Callable[[], Call]:
    from .shm import ShmClient

    def make() -> Call:
        c = ShmClient(name)
        out = np.empty(c.out_shape, np.float32)
        def call(x: np.ndarray) -> Any:
            return c.try_predict_into(x, out)
        call.close = c.close  # type: ignore[attr-defined]
        return call
    return make


def _grpc_call(address: str, strategy: str, token: str | None, cert: bytes | None,
               insecure: bool) -> Callable[[], Call]:
    from .grpc_server import GrpcClient, is_loopback

    if not is_loopback(address.rsplit(":", 1)[0]):
        raise ConfigError(f"the load test only targets loopback addresses; got {address}")

    def make() -> Call:
        c = GrpcClient(address, token=token, root_cert=cert, insecure=insecure)

        def call(x: np.ndarray) -> Any:
            return c.predict(strategy, x)
        call.close = c.close  # type: ignore[attr-defined]
        return call
    return make


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hwbackends.serve.loadtest",
                                description="replay a seeded tick trace against a serving endpoint")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--shm", help="shared-memory endpoint name")
    g.add_argument("--grpc", help="HOST:PORT (loopback only)")
    p.add_argument("--strategy", default="")
    p.add_argument("--token-file")
    p.add_argument("--cert", help="PEM of the server certificate to trust")
    p.add_argument("--insecure-loopback", action="store_true")
    p.add_argument("--features", type=int, default=32, help="features per sample (random inputs)")
    p.add_argument("--duration", type=float, default=2.0, help="trace length, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--max-requests", type=int, default=20_000)
    p.add_argument("--max-seconds", type=float, default=30.0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    xs = np.random.default_rng(a.seed).standard_normal((256, a.features)).astype(np.float32)
    if a.shm:
        make, ep = _shm_call(a.shm), f"shm:{a.shm}"
    else:
        token = open(a.token_file).read().strip() if a.token_file else None
        cert = open(a.cert, "rb").read() if a.cert else None
        make, ep = _grpc_call(a.grpc, a.strategy, token, cert, a.insecure_loopback), f"grpc:{a.grpc}"
    rep = replay(make, xs, duration_s=a.duration, seed=a.seed, workers=a.workers,
                 max_requests=a.max_requests, max_seconds=a.max_seconds, endpoint=ep)
    print(json.dumps(rep.to_dict(), indent=2) if a.json else rep.line())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
