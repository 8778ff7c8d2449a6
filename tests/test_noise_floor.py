"""Every open-loop scenario (server, burst) also runs the same loop over a
no-op in the same run and reports that floor beside its figures; the measured thread gets a
core of its own when there are two."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from hwbackends.bench import BenchResults, Burst, LatencyProfile, Server, measure
from hwbackends.bench.profile import FLOOR_FACTOR, table
from hwbackends.cli import main


def _spin(us: float, seen: list | None = None):
    ns = int(us * 1e3)

    def fn(x: np.ndarray, out: np.ndarray) -> None:
        if seen is not None:
            seen.append(frozenset(os.sched_getaffinity(0)))
        end = time.perf_counter_ns() + ns
        while time.perf_counter_ns() < end:
            pass
    return fn


def test_bench_server_and_burst_rows_carry_the_floor(store_dir, tmp_path: Path, capsys) -> None:
    out, html = tmp_path / "res.json", tmp_path / "r.html"
    rc = main(["bench", "zoo:signal", "-t", "cpu.onnxruntime", "-p", "fp32",
               "-s", "server:rate_hz=2000,n=300", "-s", "burst:duration=0.3", "-s",
               "single-stream:n=100", "-o", str(out), "--cache-dir", str(store_dir),
               "--report", str(html)])
    assert rc == 0
    text = capsys.readouterr().out
    res = BenchResults.load(out)
    by = {p.scenario: p for p in res.profiles}
    for sc in ("server", "burst"):
        f = by[sc].noise_floor
        assert f is not None and f["n"] == by[sc].n  # the same arrivals, all of them
        assert 0 < f["p50_us"] <= f["p90_us"] <= f["p99_us"] <= f["p999_us"] <= f["max_us"]
        assert f"cpu.onnxruntime:fp32 {sc}: no-op floor p50" in text
    assert by["single-stream"].noise_floor is None  # closed loop: no floor of its own
    assert "open_loop" in res.machine and "pinned_by" in res.machine["open_loop"]
    page = html.read_text()
    assert "no-op floor p99" in page and "No-op floor" in page


def test_a_slow_service_is_not_at_the_floor_and_the_floor_is_a_noop(compiled) -> None:
    """A 20 ms service at 20/s: its p99 is the service, far above the no-op's."""
    cm = compiled("signal", "cpu.onnxruntime", "fp32")
    prof = measure(cm, Server(rate_hz=20, n=30, warmup=2, max_s=10), predict_into=_spin(20_000))
    assert prof.p50_us >= 20_000
    assert prof.noise_floor["p50_us"] < 2_000  # the floor did not run the service
    assert not prof.at_noise_floor


def test_at_noise_floor_rule() -> None:
    base = dict(variant="v", target="t", precision="fp32", batch_size=1, scenario="server",
                params={}, mode="hardware", n=10, p50_us=1.0, p90_us=2.0, p999_us=50.0,
                max_us=60.0, mean_us=2.0, min_us=0.5, throughput=1.0, duration_s=1.0)
    at = LatencyProfile(**base, p99_us=FLOOR_FACTOR * 20.0, noise_floor={"p99_us": 20.0, "p50_us": 1.0})
    above = LatencyProfile(**base, p99_us=FLOOR_FACTOR * 20.0 + 1, noise_floor={"p99_us": 20.0})
    none = LatencyProfile(**base, p99_us=1.0)
    assert at.at_noise_floor and not above.at_noise_floor and not none.at_noise_floor
    assert "(p99 at the noise floor)" in table([at]) and "at the noise floor" not in table([above])


def test_open_loop_measures_on_a_core_of_its_own(compiled) -> None:
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("os.sched_setaffinity not available on this OS")
    cpus = os.sched_getaffinity(0)
    seen: list = []
    cm = compiled("signal", "cpu.onnxruntime", "fp32")
    prof = measure(cm, Burst(duration_s=0.2, warmup=0), predict_into=_spin(1, seen))
    aff = prof.params["affinity"]
    assert os.sched_getaffinity(0) == cpus  # restored after the loop
    if len(cpus) < 2:
        assert aff["pinned_by"].startswith("nobody") and set(seen) == {frozenset(cpus)}
    else:
        assert aff["measured_cpus"] == [max(cpus)] and aff["other_cpus"] == sorted(cpus - {max(cpus)})
        assert set(seen) == {frozenset({max(cpus)})}
