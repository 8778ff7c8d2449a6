"""Prometheus metrics on an opt-in 127.0.0.1 port, and the bounded load-test client against
the engine and the shared-memory endpoint."""
from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest

pytest.importorskip("prometheus_client", reason="the serve extra (prometheus-client) is not installed")

from hwbackends.serve import Engine, EngineConfig  # noqa: E402
from hwbackends.serve.loadtest import replay  # noqa: E402
from hwbackends.serve.metrics import PromMetrics  # noqa: E402
from hwbackends.serve.shm import ShmServer  # noqa: E402


@pytest.fixture(scope="module")
def xs(zoo_model):
    return np.ascontiguousarray(zoo_model("signal").validation_data[:128], dtype=np.float32)


def _value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in metrics")


def test_prometheus_endpoint_reports_engine_metrics(compiled, xs):
    import os
    prom = PromMetrics()
    core = sorted(os.sched_getaffinity(0))[0]
    cm = compiled("signal", "cpu.litert")
    cfg = EngineConfig.preset("latency", cache_entries=100, pin_cores=(core,))
    server, port = prom.serve_http(0)
    try:
        with Engine(cm, cfg, strategy="mom", prom=prom) as eng:
            for x in xs[:20]:
                eng.predict(x)
            eng.predict(xs[0])  # a cache hit
            eng.predict(xs[50], deadline_us=1)  # a deadline miss (not cached)
            eng.stats()
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert server.server_address[0] == "127.0.0.1"
        assert _value(text, "hwb_serve_requests_total", strategy="mom", outcome="ok") == 21
        assert _value(text, "hwb_serve_cache_hits_total", strategy="mom") == 1
        assert _value(text, "hwb_serve_cache_misses_total", strategy="mom") == 21  # incl. the miss
        assert _value(text, "hwb_serve_deadline_misses_total", strategy="mom") == 1
        assert _value(text, "hwb_serve_request_latency_seconds_count", strategy="mom",
                      variant="cpu.litert:fp32") == 21
        assert _value(text, "hwb_serve_batch_size_count", strategy="mom") >= 1
        assert _value(text, "hwb_serve_queue_wait_seconds_count", strategy="mom") >= 20
        assert _value(text, "hwb_serve_pinned_cores", strategy="mom", cores=str(core)) == 1
        assert _value(text, "hwb_serve_model_version", strategy="mom") == 1
        assert _value(text, "hwb_serve_failovers", strategy="mom") == 0
        types = dict(re.findall(r"^# TYPE (hwb_\S+) (\w+)", text, re.M))
        assert all(k.startswith("hwb_serve_") for k in types)
        assert all(k.endswith("_seconds") for k, t in types.items() if t == "histogram"
                   and k != "hwb_serve_batch_size")
    finally:
        server.shutdown()


def test_loadtest_replays_a_trace_against_engine_and_shm(compiled, xs):
    cm = compiled("signal", "cpu.litert")
    with Engine(cm, EngineConfig.preset("latency")) as eng:
        rep = replay(lambda: (lambda x: eng.predict(x)), xs, duration_s=0.5, seed=3, workers=2,
                     max_requests=600, max_seconds=10, endpoint="engine")
        assert rep.offered <= 600 and rep.completed + rep.unavailable + rep.errors == rep.offered
        assert rep.errors == 0 and rep.completed > 0.9 * rep.offered
        assert 0 < rep.p50_us <= rep.p99_us <= rep.p999_us <= rep.max_us
        from hwbackends.serve.loadtest import _shm_call
        with ShmServer(eng, slots=2) as srv:
            rep2 = replay(_shm_call(srv.name), xs, duration_s=0.5, seed=3, workers=2,
                          max_requests=600, max_seconds=10, endpoint="shm")
        assert rep2.errors == 0 and rep2.completed > 0.9 * rep2.offered
        assert rep2.trace["ticks"] >= rep2.offered
