"""Live re-routing with hysteresis: when every candidate's tail exceeds the
budget at once (a noisy moment on the machine), the lane does not flap between them, and it
never moves traffic to a candidate that is measured worse than the one serving.

The candidates are plain callables with a controllable busy-wait, so every live window is
measured; their bench p99s are the inputs a routing decision would hand the lane.
"""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from hwbackends.config import RouterConfig
from hwbackends.router import Lane, NoRouteError
from hwbackends.specs import TensorSpec

SWITCHES = ("re-route", "breaker-open", "retry", "retry-failed")


class _Fake:
    """``predict_into`` that spins for the shared ``delay_us`` (or its own, when set)."""

    batch_size = 1
    input, output = TensorSpec("x", (1,)), TensorSpec("y", (1,))
    inputs, outputs = [input], [output]

    def __init__(self, clock: dict[str, float], own: str):
        self.clock, self.own = clock, own

    def warmup(self, n: int = 1) -> None:
        pass

    def predict_into(self, x: np.ndarray, out: np.ndarray) -> None:
        us = self.clock.get(self.own, self.clock["all"])
        end = time.perf_counter_ns() + int(us * 1e3)
        while time.perf_counter_ns() < end:
            pass
        out[0, 0] = x[0, 0]


def _lane(clock: dict[str, float], bench: dict[str, float], **kw) -> Lane:
    order = [SimpleNamespace(variant=n, mode="hardware", cm=_Fake(clock, n), p99_us=p)
             for n, p in bench.items()]
    opts = dict(window=100, sample_every=1, switch_after=2, retry_after_s=0.05)
    return Lane("s", order, 100.0, RouterConfig(**(opts | kw)))


def _drive(lane: Lane, seconds: float) -> None:
    x = np.ones((1, 1), np.float32)
    out = np.zeros((1, 1), np.float32)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            lane.predict_into(x, out)


def _drive_until(lane: Lane, done, cap_s: float = 20.0) -> None:
    """Call until ``done()`` holds (checked after every call), at most ``cap_s``: what the
    lane does is asserted, not how much of it fits in a fixed time on a loaded machine."""
    x = np.ones((1, 1), np.float32)
    out = np.zeros((1, 1), np.float32)
    end = time.monotonic() + cap_s
    while not done():
        assert time.monotonic() < end, [(e["event"], e["from"], e["to"]) for e in lane.events]
        lane.predict_into(x, out)


def test_no_flapping_when_every_candidate_exceeds_the_budget() -> None:
    # Bench p99s of 10/20/30 µs against a 100 µs budget; then every call takes ≥ 300 µs (the
    # whole machine is slow). Before the fix the lane walked down the list and kept probing
    # and switching (Python and C++ clients saw different precisions).
    clock = {"all": 0.0}
    lane = _lane(clock, {"a:fp32": 10.0, "a:int8": 20.0, "b:fp32": 30.0}, retry_after_s=0.1)
    clock["all"] = 300.0
    _drive(lane, 1.5)  # ≈ 50 windows, 15× retry_after_s
    switches = [e for e in lane.events if e["event"] in SWITCHES]
    assert len(switches) <= 2, [(e["event"], e["from"], e["to"]) for e in lane.events]
    assert any(e["event"] == "hold" for e in lane.events)
    # Once every candidate has been measured over budget, the lane stays where it is. On a
    # busy machine a preempted call or two can lift the serving window's p99 past 1.25× the
    # others' estimates; one move that the rule below allows is then right (a full-suite
    # run of 2026-12-01 saw one), a second is flapping.
    before = len(lane.events)
    serving = lane.serving
    _drive(lane, 0.5)
    late = [e for e in lane.events[before:] if e["event"] in SWITCHES]
    assert len(late) <= 1, [(e["event"], e["from"], e["to"]) for e in late]
    assert lane.serving == serving or late
    # Each switch that happened was to a candidate estimated better than the one it left.
    for e in switches + late:
        if e["event"] in ("re-route", "retry-failed"):
            left = e["window_p99_us"]
            left = min(left) if isinstance(left, list) else left
            assert e["estimates_us"][e["to"]] < left * 0.8


def test_never_switches_to_a_candidate_measured_worse() -> None:
    clock = {"all": 0.0}
    lane = _lane(clock, {"a:fp32": 10.0, "b:fp32": 20.0})
    # b served a moment ago at 5 s p99 (its live measurement); a is now at ≥ 300 µs. 5 s, not
    # 5 ms: on a loaded machine a's own window p99 reached milliseconds (preemption), and a
    # switch to a b measured better than that would be right, not the bug under test.
    b = lane.variants[1]
    b.window_p99_us.append(5e6)
    b.live_at = time.monotonic()
    clock["all"] = 300.0
    _drive(lane, 0.5)
    assert lane.serving == "a:fp32"
    assert not [e for e in lane.events if e["event"] in SWITCHES]
    hold = next(e for e in lane.events if e["event"] == "hold")
    assert hold["estimates_us"]["b:fp32"] == 5e6


def test_a_variant_that_alone_slows_down_is_still_left() -> None:
    # Hysteresis must not stop a real re-route: only a:fp32 slows down; b:fp32 is fine.
    clock = {"all": 0.0, "a:fp32": 1000.0}
    lane = _lane(clock, {"a:fp32": 10.0, "b:fp32": 20.0}, window=20)
    # Until the first switch, not for a fixed time: a's retries (0.05 s later) serve a again
    # for a moment, and under load a fixed 0.3 s could end inside one.
    _drive_until(lane, lambda: any(e["event"] in SWITCHES for e in lane.events))
    assert lane.serving == "b:fp32"
    ev = next(e for e in lane.events if e["event"] in SWITCHES)
    assert ev["event"] == "re-route"
    assert ev["from"] == "a:fp32" and ev["to"] == "b:fp32"
    assert lane.failovers >= 1
    # a's retries fail while it is slow: the rest before the next one doubles.
    _drive(lane, 0.6)
    _drive_until(lane, lambda: any(e["event"] == "retry-failed" for e in lane.events))
    failed = [e for e in lane.events if e["event"] == "retry-failed"]
    assert failed and failed[0]["retry_in_s"] == 0.1
    if len(failed) > 1:
        assert failed[1]["retry_in_s"] == 0.2
    clock.pop("a:fp32")  # a recovers: a retry takes the traffic back
    _drive_until(lane, lambda: lane.events[-1]["event"] == "recovered")
    assert lane.serving == "a:fp32"


def test_served_label_and_failovers_follow_the_router(monkeypatch) -> None:
    """The latency histogram's ``variant`` label names the variant that served, and
    ``hwb_serve_failovers`` counts the re-route, at scrape time (no stats() call)."""
    pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
    from hwbackends.serve import Engine, EngineConfig, RouterStrategy
    from hwbackends.serve.metrics import PromMetrics

    clock = {"all": 0.0, "a:fp32": 1000.0}
    lane = _lane(clock, {"a:fp32": 10.0, "b:fp32": 20.0}, window=20, retry_after_s=60.0)
    tol = SimpleNamespace(tolerance=lambda kind=None: None)
    strategy = SimpleNamespace(fidelity=tol, output_kind=None)
    router = SimpleNamespace(lane=lambda n: lane, handle=lambda n: lane.predict_into,
                             config=SimpleNamespace(strategies={"s": strategy}))
    prom = PromMetrics()
    x = np.ones(1, np.float32)
    with Engine(RouterStrategy(router, "s"), EngineConfig.preset("single", warmup=1),
                strategy="s", prom=prom) as eng:
        while lane.serving == "a:fp32":
            eng.predict(x)
        for _ in range(10):
            eng.predict(x)
        text = prom.text().decode()
    assert 'variant="router:s→b:fp32"' in text
    b = [ln for ln in text.splitlines() if ln.startswith("hwb_serve_request_latency_seconds_count")
         and "b:fp32" in ln]
    assert b and float(b[0].rsplit(" ", 1)[1]) >= 10
    fo = [ln for ln in text.splitlines() if ln.startswith("hwb_serve_failovers{")]
    assert fo and float(fo[0].rsplit(" ", 1)[1]) == 1.0


class _Counting:
    """An executor that counts how many threads are inside it at once."""

    batch_size = 1
    input, output = TensorSpec("x", (1,)), TensorSpec("y", (1,))
    inputs, outputs = [input], [output]

    def __init__(self) -> None:
        self.inside = self.most = 0
        self.stall_s = 0.0
        self.guard = threading.Lock()

    def predict_into(self, x: np.ndarray, out: np.ndarray) -> None:
        with self.guard:
            self.inside += 1
            self.most = max(self.most, self.inside)
        time.sleep(self.stall_s)
        out[...] = x
        with self.guard:
            self.inside -= 1


@pytest.mark.parametrize("wait_s", [1.0, 0.05], ids=["the-call-ends", "still-stuck"])
def test_a_lane_built_during_an_abandoned_call_never_runs_beside_it(monkeypatch, wait_s) -> None:
    """A deadline lane abandons a stalled call, which runs on in its worker thread; a direct
    lane built over the same executor meanwhile (a re-plan, a new router) must not call it
    at once, beside that call (the other call's answer would come back). It waits for the
    call to end, or, when the executor is still stuck after ABANDONED_WAIT_S, calls it under
    its lock."""
    from hwbackends.router import runtime

    monkeypatch.setattr(runtime, "ABANDONED_WAIT_S", wait_s)
    ex = _Counting()
    order = [SimpleNamespace(variant="a:fp32", mode="hardware", cm=ex)]
    x, out = np.full((1, 1), 7.0, np.float32), np.zeros((1, 1), np.float32)
    ex.stall_s = 0.4
    old = Lane("old", order, 1e9, timeout_us=1000.0)
    with pytest.raises(NoRouteError, match="deadline"):
        old.predict_into(x, out)  # abandoned: it sleeps on in old's worker thread
    ex.stall_s = 0.0
    new = Lane("new", order, 1e9)
    new.predict_into(x, out)
    assert out[0, 0] == 7.0
    assert ex.most == 1  # never two threads in the executor
