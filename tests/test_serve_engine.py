"""The serving engine on real compiled variants of zoo:signal: batching, padding to allowed
sizes, the inference cache, deadlines and the breaker, pinning, bad input."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from hwbackends.errors import ConfigError, InputError
from hwbackends.serve import DEADLINE, BatchPolicy, Engine, EngineConfig, InferenceCache, Unavailable


@pytest.fixture(scope="module")
def litert(compiled):
    return compiled("signal", "cpu.litert")


@pytest.fixture(scope="module")
def xs(zoo_model):
    return np.ascontiguousarray(zoo_model("signal").validation_data[:256], dtype=np.float32)


def _hammer(eng: Engine, xs: np.ndarray, threads: int, per: int) -> list[list]:
    res: list[list] = [[] for _ in range(threads)]
    go = threading.Barrier(threads)

    def work(i: int) -> None:
        go.wait()
        for j in range(per):
            res[i].append((j, eng.predict(xs[(i * 31 + j) % len(xs)])))
    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return res


def test_single_requests_match_the_compiled_model(litert, xs):
    with Engine(litert, EngineConfig.preset("single")) as eng:
        for x in xs[:20]:
            y = eng.predict(x)
            assert isinstance(y, np.ndarray)
            np.testing.assert_array_equal(y, litert.predict(x))
        out = np.empty(litert.output.shape, np.float32)
        assert eng.try_predict_into(xs[3], out) is True
        np.testing.assert_array_equal(out, litert.predict(xs[3]))
        assert eng.stats()["batch_sizes"] == {1: 21}


def test_batching_merges_concurrent_requests_and_pads_to_allowed_sizes(compiled, zoo_model, xs):
    variants = {s: compiled("signal", "cpu.litert", batch_size=s) if s > 1 else compiled("signal", "cpu.litert")
                for s in (1, 2, 4, 8)}
    cfg = EngineConfig(policy=BatchPolicy(8, 3000.0, (1, 2, 4, 8)))
    with Engine(variants, cfg) as eng:
        assert eng.stats()["batch_sizes_allowed"] == [1, 2, 4, 8]
        res = _hammer(eng, xs, threads=6, per=60)
        st = eng.stats()
    ref = variants[1]
    for i, rows in enumerate(res):
        assert len(rows) == 60
        for j, y in rows:
            assert isinstance(y, np.ndarray), y
            np.testing.assert_allclose(y, ref.predict(xs[(i * 31 + j) % len(xs)]), atol=1e-5)
    assert sum(k * v for k, v in st["batch_sizes"].items()) == 360
    # six callers within a 3 ms window: most requests ride in a shared batch
    merged = sum(v * k for k, v in st["batch_sizes"].items() if k > 1)
    assert merged / 360 > 0.5, st["batch_sizes"]
    assert max(st["batch_sizes"]) <= 8


def test_full_batch_runs_without_waiting_for_the_timeout(litert, xs):
    # A 2 s timeout: four concurrent callers fill max_batch_size=4 and run at once.
    cfg = EngineConfig(policy=BatchPolicy(4, 2_000_000.0))
    with Engine(litert, cfg) as eng:
        t0 = time.perf_counter()
        res = _hammer(eng, xs, threads=4, per=1)
        took = time.perf_counter() - t0
        assert all(isinstance(y, np.ndarray) for r in res for _, y in r)
        assert eng.stats()["batch_sizes"] == {4: 1}
    assert took < 1.0


def test_a_lone_request_is_never_held_past_the_batch_timeout(litert, xs):
    timeout_us = 20_000.0
    with Engine(litert, EngineConfig(policy=BatchPolicy(16, timeout_us))) as eng:
        for x in xs[:5]:
            t0 = time.perf_counter()
            assert isinstance(eng.predict(x), np.ndarray)
            took = time.perf_counter() - t0
            # it waits for company up to the timeout, then runs alone (+ scheduling slack)
            assert 0.8 * timeout_us * 1e-6 <= took < timeout_us * 1e-6 + 0.15
        qw = eng.stats()["queue_wait_us"]
        assert qw["p99"] <= timeout_us + 50_000


def test_cache_hit_returns_identical_result_and_respects_bounds(litert, xs):
    cfg = EngineConfig.preset("single", cache_entries=8, cache_bytes=1 << 20)
    with Engine(litert, cfg) as eng:
        a = eng.predict(xs[0])
        b = eng.predict(xs[0].copy())       # equal bytes, different object
        np.testing.assert_array_equal(a, b)
        assert eng.cache.stats().hits == 1 and eng.cache.stats().misses == 1
        for x in xs[1:40]:
            eng.predict(x)
        cs = eng.cache.stats()
        assert cs.entries == 8 and cs.evictions == 40 - 8
        near = xs[0].copy()
        near[0] = np.nextafter(near[0], np.float32(np.inf))  # one ulp: a different key
        eng.predict(near)
        assert eng.cache.stats().misses == 41
        st = eng.stats()
        assert st["cache_hits"] == 1 and st["batches"] == 41  # the hit never reached the model


def test_cache_byte_bound_and_version_key():
    c = InferenceCache(max_entries=1000, max_bytes=2000)
    for i in range(100):
        c.put(InferenceCache.key(np.full(32, i, np.float32), 1), np.zeros(16, np.float32), 1)
    s = c.stats()
    assert s.bytes <= 2000 and s.entries < 100 and s.evictions == 100 - s.entries
    x = np.ones(32, np.float32)
    assert InferenceCache.key(x, 1) != InferenceCache.key(x, 2)
    y = np.arange(3, dtype=np.float32)
    c.put(InferenceCache.key(x, 1), y, 1)
    hit = c.get(InferenceCache.key(x, 1))
    assert hit is c.get(InferenceCache.key(x, 1)) and not hit.flags.writeable
    with pytest.raises(ConfigError):
        InferenceCache(0, 10)


def test_deadline_returns_unavailable_not_an_exception(litert, xs):
    with Engine(litert, EngineConfig.preset("single", breaker_failures=1000)) as eng:
        r = eng.predict(xs[0], deadline_us=1)
        assert isinstance(r, Unavailable) and not r and r.reason == "deadline"
        out = np.zeros(litert.output.shape, np.float32)
        assert eng.try_predict_into(xs[0], out, deadline_us=1) is DEADLINE
        assert eng.stats()["deadline_misses"] == 2
        # a generous deadline is met
        assert isinstance(eng.predict(xs[0], deadline_us=5e6), np.ndarray)


class _Stalling:
    """The real compiled model behind a switch that stalls it (a hung accelerator call)."""

    def __init__(self, cm):
        self.cm, self.input, self.output, self.batch_size = cm, cm.input, cm.output, cm.batch_size
        self.stall = 0.0
        self.variant = cm.variant

    def predict_into(self, x, out):
        if self.stall:
            time.sleep(self.stall)
        self.cm.predict_into(x, out)


def test_stalled_backend_misses_deadlines_and_opens_the_breaker(litert, xs):
    b = _Stalling(litert)
    cfg = EngineConfig.preset("single", deadline_us=20_000, breaker_failures=3, breaker_reset_s=0.3,
                              warmup=1)
    with Engine(b, cfg) as eng:
        assert isinstance(eng.predict(xs[0]), np.ndarray)
        b.stall = 0.1
        outcomes = [eng.predict(xs[i]) for i in range(5)]
        reasons = [o.reason for o in outcomes if isinstance(o, Unavailable)]
        assert reasons[:3] == ["deadline"] * 3 and reasons[3:] == ["breaker-open"] * 2
        assert eng.stats()["breaker_open"]
        b.stall = 0.0
        time.sleep(0.6)  # the breaker half-opens; the stalled calls have drained
        y = eng.predict(xs[1])
        assert isinstance(y, np.ndarray)
        np.testing.assert_array_equal(y, litert.predict(xs[1]))
        st = eng.stats()
        assert st["deadline_misses"] == 3 and st["breaker_rejects"] == 2 and not st["breaker_open"]


def test_backend_error_is_unavailable_and_engine_keeps_serving(litert, xs):
    class Failing(_Stalling):
        fail = False

        def predict_into(self, x, out):
            if self.fail:
                raise RuntimeError("device lost")
            self.cm.predict_into(x, out)
    b = Failing(litert)
    with Engine(b, EngineConfig.preset("single", breaker_failures=100, warmup=1)) as eng:
        b.fail = True
        r = eng.predict(xs[0])
        assert isinstance(r, Unavailable) and "device lost" in r.reason
        b.fail = False
        assert isinstance(eng.predict(xs[0]), np.ndarray)
        assert eng.stats()["errors"] == 1


def test_bad_input_raises_clear_errors_and_engine_survives(litert, xs):
    with Engine(litert, EngineConfig.preset("single")) as eng:
        with pytest.raises(InputError, match=r"shape \(5,\).*\(32,\)"):
            eng.predict(np.zeros(5, np.float32))
        with pytest.raises(InputError, match="NaN"):
            eng.predict(np.full(32, np.nan, np.float32))
        with pytest.raises(InputError, match="dtype"):
            eng.predict(np.array(["a"] * 32))
        with pytest.raises(InputError, match="float32"):  # refused, not cast (serving.md)
            eng.predict(xs[0].astype(np.float64))
    assert eng.predict(xs[0]).reason == "engine-stopped"


def test_pinning_serving_thread_is_reported(litert, xs):
    core = sorted(os.sched_getaffinity(0))[-1]
    with Engine(litert, EngineConfig.preset("single", pin_cores=(core,))) as eng:
        assert isinstance(eng.predict(xs[0]), np.ndarray)
        assert eng.stats()["pinned_cores"] == [core]
    assert os.sched_getaffinity(0) != {core} or os.cpu_count() == 1  # only the thread was pinned
    with pytest.raises(ConfigError, match="not available"):
        Engine(litert, EngineConfig.preset("single", pin_cores=(10_000,)))


def test_policy_validation():
    with pytest.raises(ConfigError, match="largest allowed"):
        BatchPolicy(8, 100.0, (1, 2, 4))
    with pytest.raises(ConfigError, match="increasing"):
        BatchPolicy(4, 100.0, (4, 2))
    with pytest.raises(ConfigError, match="unknown preset"):
        EngineConfig.preset("fastest")


def test_inline_mode_runs_in_the_caller_thread(litert, xs):
    cfg = EngineConfig.preset("single", inline=True)
    with Engine(litert, cfg) as eng:
        seen = []
        orig = eng.batcher.run

        def spy(batch):
            seen.append(threading.current_thread() is threading.main_thread())
            orig(batch)
        eng.batcher.run = spy
        for x in xs[:10]:
            np.testing.assert_array_equal(eng.predict(x), litert.predict(x))
        assert seen == [True] * 10  # no hand-off
        # a call with a deadline still goes through the (preemptible) serving thread
        assert isinstance(eng.predict(xs[0], deadline_us=5e6), np.ndarray)
        assert seen[-1] is False
        assert eng.predict(xs[0], deadline_us=1).reason == "deadline"
        res = _hammer(eng, xs, threads=4, per=50)  # concurrent inline callers are serialised
        assert all(np.allclose(y, litert.predict(xs[(i * 31 + j) % len(xs)]))
                   for i, r in enumerate(res) for j, y in r)
    with pytest.raises(ConfigError, match="max_batch_size=1"):
        Engine(litert, EngineConfig.preset("latency", inline=True))
