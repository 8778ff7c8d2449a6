"""Each test reproduces one finding and shows it fixed.

3. swapping in a backend that is already serving never runs its executor on two threads;
5. a router lane with ``timeout_us`` never hands a call another call's reply;
7. client input (a bad or too-small deadline, over the API or gRPC) never opens the breaker
   other clients share;
9. a swap whose factory hangs ends at its timeout and frees the engine for the next swap.

Everything runs the real LiteRT / ONNX Runtime variants of zoo:signal; the wrappers only add
the misbehaviour (a stall) the finding needs.
"""
from __future__ import annotations

import math
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from hwbackends.breaker import Breaker, BreakerState
from hwbackends.config import MAX_COUNT, RouterConfig
from hwbackends.errors import InputError
from hwbackends.router import Lane, NoRouteError
from hwbackends.serve import Engine, EngineConfig, Unavailable


@pytest.fixture(scope="module")
def litert(compiled):
    return compiled("signal", "cpu.litert")


@pytest.fixture(scope="module")
def xs(zoo_model):
    # distinct inputs: a mixed-up answer can never pass as the right one by accident
    return np.ascontiguousarray(zoo_model("signal").validation_data[:512], dtype=np.float32)


@pytest.fixture(scope="module")
def ref(litert, xs):
    return litert.predict(xs)


# -- the breaker itself ---------------------------------------------------------------------
def test_breaker_states() -> None:
    now = [0.0]
    b = Breaker(3, 1.0, clock=lambda: now[0])
    assert b.state is BreakerState.CLOSED and b.allows()
    assert not b.failure() and not b.failure()
    b.success()  # a success restarts the count
    assert [b.failure() for _ in range(3)] == [False, False, True]
    assert b.state is BreakerState.OPEN and not b.allows()
    now[0] = 1.0
    assert b.state is BreakerState.HALF_OPEN and b.allows()
    assert b.failure() and b.state is BreakerState.OPEN  # one failure re-opens a half-open one
    now[0] = 2.5
    b.success()
    assert b.state is BreakerState.CLOSED
    with pytest.raises(ValueError):
        Breaker(0, 1.0)


# -- 3: one thread per executor -------------------------------------------------------------
def test_swap_of_a_backend_already_serving_gives_no_wrong_answer(litert, xs, ref):
    """Repro: ``eng.swap(v1)`` while v1 serves three threads gave outputs equal to f(zeros)
    (the warm-up ran on the interpreter the serving thread was using) and the shadow check
    rejected the identical model."""
    cfg = EngineConfig.preset("latency", shadow_samples=64, warmup=2000)
    bad: list[tuple[int, object]] = []
    stop = threading.Event()

    def client(i: int) -> None:
        j = 0
        while not stop.is_set():
            k = (i * 131 + j) % len(xs)
            y = eng.predict(xs[k])
            if not isinstance(y, np.ndarray) or not np.array_equal(y, ref[k]):
                bad.append((k, y))
            j += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # GIL hand-overs between "set input" and "invoke" are likely
    try:
        with Engine(litert, cfg) as eng:
            ts = [threading.Thread(target=client, args=(i,)) for i in range(3)]
            for t in ts:
                t.start()
            try:
                results = [eng.swap(litert, nice=0) for _ in range(3)]
            finally:
                stop.set()
                for t in ts:
                    t.join(30)
    finally:
        sys.setswitchinterval(old)
    assert not bad, f"{len(bad)} wrong answers, e.g. input {bad[0][0]}"
    assert all(r.accepted for r in results), [r.reason for r in results]
    assert all(r.fidelity.max_abs == 0.0 for r in results)  # the same model: identical outputs


# -- 5: lane hand-offs carry sequence ids ---------------------------------------------------
class _Hiccup:
    """A real compiled model that stalls past the lane's deadline every ``every``-th call."""

    def __init__(self, cm, every: int, stall_s: float):
        self.cm, self.every, self.stall_s, self.n = cm, every, stall_s, 0

    def predict_into(self, x, out):
        self.n += 1
        if self.n % self.every == 0:
            time.sleep(self.stall_s)
        self.cm.predict_into(x, out)


def test_lane_with_timeout_never_returns_another_calls_reply(compiled, xs):
    """Repro: under a short GIL switch interval, 7 of 20,000 answers were the previous call's
    (a late reply to an abandoned call was taken as the next call's)."""
    lit, onx = compiled("signal", "cpu.litert"), compiled("signal", "cpu.onnxruntime")
    want = onx.predict(xs)
    first = _Hiccup(lit, every=40, stall_s=0.005)
    order = [SimpleNamespace(variant="litert-hiccup", mode="hardware",
                             cm=SimpleNamespace(predict_into=first.predict_into, input=lit.input,
                                                output=lit.output, inputs=lit.inputs,
                                                outputs=lit.outputs, batch_size=1)),
             SimpleNamespace(variant="onnxruntime", mode="hardware", cm=onx)]
    # no breaker trip and no window end within the test: the settings' largest values
    lane = Lane("s", order, 1e9, RouterConfig(breaker_failures=MAX_COUNT, window=MAX_COUNT),
                timeout_us=2000)
    out = np.zeros((1, 1), np.float32)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    wrong = unserved = 0
    try:
        for i in range(20_000):
            k = i % len(xs)
            out[0, 0] = np.nan
            try:
                lane.predict_into(xs[k][None], out)
            except NoRouteError:  # both missed the deadline on this busy machine: no answer,
                unserved += 1     # which is allowed; a wrong answer is not
                continue
            wrong += not math.isclose(out[0, 0], want[k, 0], abs_tol=1e-4)
    finally:
        sys.setswitchinterval(old)
    assert lane.variants[0].timeouts > 0  # the stalls did happen and were abandoned
    assert wrong == 0
    assert unserved < 10_000  # most calls were answered (the check above saw them)


# -- 7: client input never opens a breaker --------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 1e-6, float("nan"), float("inf"), 0.0, "soon"])
def test_invalid_deadline_is_input_error_and_never_counts(litert, xs, bad):
    with Engine(litert, EngineConfig.preset("single", breaker_failures=1)) as eng:
        for _ in range(3):
            with pytest.raises(InputError, match="deadline_us"):
                eng.predict(xs[0], deadline_us=bad)
        assert eng.stats()["breaker_state"] == "closed"
        assert isinstance(eng.predict(xs[1]), np.ndarray)


def test_config_deadlines_are_checked() -> None:
    from hwbackends.errors import ConfigError

    for bad in (-5, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="deadline_us"):
            EngineConfig(deadline_us=bad)
    with pytest.raises(ConfigError, match="swap_timeout_s"):
        EngineConfig(swap_timeout_s=0)


def test_a_clients_too_small_budget_does_not_open_the_shared_breaker(litert, xs, ref):
    cfg = EngineConfig.preset("single", breaker_failures=2, breaker_reset_s=5.0)
    with Engine(litert, cfg) as eng:
        assert eng.breaker_min_deadline_us >= 200
        misses = [eng.predict(xs[i], deadline_us=1) for i in range(50)]  # valid, but unmeetable
        assert all(isinstance(r, Unavailable) and r.reason == "deadline" for r in misses)
        st = eng.stats()
        assert st["client_deadline_misses"] == 50 and st["breaker_state"] == "closed"
        for i in range(20):  # everyone else is still served
            np.testing.assert_array_equal(eng.predict(xs[i], deadline_us=1e6), ref[i])
        assert eng.stats()["breaker_rejects"] == 0


def test_grpc_bad_deadlines_are_invalid_argument_and_others_are_served(litert, xs, ref):
    grpc = pytest.importorskip("grpc", reason="the serve extra (grpcio) is not installed")
    from hwbackends.serve.grpc_server import GrpcClient, GrpcServer

    cfg = EngineConfig.preset("single", breaker_failures=1, breaker_reset_s=5.0)
    with Engine(litert, cfg, strategy="mom") as eng, \
            GrpcServer(eng, insecure_loopback=True) as srv, \
            GrpcClient(srv.address, insecure=True) as attacker, \
            GrpcClient(srv.address, insecure=True) as innocent:
        for bad in (-1.0, 1e-6, float("nan"), float("inf")):
            with pytest.raises(grpc.RpcError) as e:
                attacker.predict("mom", xs[0], deadline_us=bad)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "deadline_us" in e.value.details()
        for _ in range(10):  # valid but unmeetable: the attacker's own misses
            r = attacker.predict("mom", xs[0], deadline_us=1)
            assert isinstance(r, Unavailable) and r.reason == "deadline"
        for i in range(20):
            np.testing.assert_array_equal(innocent.predict("mom", xs[i]), ref[i])
        assert eng.stats()["breaker_rejects"] == 0


# -- 9: swaps and factories time out --------------------------------------------------------
def test_a_hanging_swap_factory_times_out_and_frees_the_engine(litert, xs, ref):
    """Repro: a factory that never returned blocked every later swap (SwapError) forever."""
    release = threading.Event()

    def hangs():
        release.wait(60)
        return litert

    with Engine(litert, EngineConfig.preset("single", warmup=2)) as eng:
        v0 = eng.version
        t0 = time.perf_counter()
        r = eng.swap(hangs, tolerance=None, timeout_s=0.5, nice=0)
        assert time.perf_counter() - t0 < 5
        assert not r.accepted and "did not finish in 0.5 s" in r.reason and "build" in r.reason
        assert eng.version == v0
        r2 = eng.swap(litert, tolerance=None, nice=0)  # the engine is free for the next swap
        assert r2.accepted and eng.version == r2.version
        release.set()  # the abandoned factory returns now: it must never install
        time.sleep(0.5)
        assert eng.version == r2.version
        np.testing.assert_array_equal(eng.predict(xs[5]), ref[5])
        assert eng.stats()["swaps"].get("rejected") == 1
