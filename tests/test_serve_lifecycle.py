"""Hot swap under concurrent load (zero failures), a swap the shadow comparison rejects (a model
with different weights), rollback."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from hwbackends.context import RunContext
from hwbackends.fidelity import Tolerance
from hwbackends.serve import Engine, EngineConfig, SwapError, Unavailable


@pytest.fixture(scope="module")
def xs(zoo_model):
    return np.ascontiguousarray(zoo_model("signal").validation_data[:512], dtype=np.float32)


@pytest.fixture(scope="module")
def perturbed(zoo_model, store_dir):
    """zoo:signal with its output layer's weights changed: same shapes, another function."""
    import keras

    import hwbackends as hwb
    from hwbackends.models import load_model

    src = zoo_model("signal").obj
    m = keras.models.clone_model(src)
    w = [np.array(a) for a in src.get_weights()]
    w[-2] = -w[-2]  # flip the output layer: the signal's sign flips
    m.set_weights(w)
    return hwb.compile(load_model(m, name="signal-flipped"), "cpu.litert", store=store_dir)


class _Load:
    """Threads calling predict until stopped; every result is kept."""

    def __init__(self, eng: Engine, xs: np.ndarray, threads: int = 3):
        self.eng, self.xs = eng, xs
        self.stop = threading.Event()
        self.results: list[list[tuple[int, object]]] = [[] for _ in range(threads)]
        self.errors: list[BaseException] = []
        self.ts = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def _run(self, i: int) -> None:
        j = 0
        while not self.stop.is_set() and j < 200_000:
            k = (i * 97 + j) % len(self.xs)
            try:
                self.results[i].append((k, self.eng.predict(self.xs[k])))
            except BaseException as exc:  # would be a lost request
                self.errors.append(exc)
            j += 1

    def __enter__(self) -> "_Load":
        for t in self.ts:
            t.start()
        return self

    def __exit__(self, *a) -> None:
        self.stop.set()
        for t in self.ts:
            t.join(30)


def test_swap_under_load_loses_and_fails_no_request(compiled, xs):
    old = compiled("signal", "cpu.litert")
    new = compiled("signal", "cpu.onnxruntime")
    with Engine(old, EngineConfig.preset("latency", shadow_samples=128)) as eng:
        with _Load(eng, xs) as load:
            res = eng.swap(lambda: new)  # built, warmed, shadowed in the background
            served_after = sum(len(r) for r in load.results)
            while sum(len(r) for r in load.results) < served_after + 300:
                pass
        assert res.accepted, res.reason
        assert res.version == 2 and eng.version == 2 and eng.variant == "cpu.onnxruntime:fp32"
        assert res.shadow_samples == 128 and res.fidelity.corr > 0.9999
        assert load.errors == []
        flat = [(k, y) for r in load.results for k, y in r]
        assert len(flat) > 400
        bad = [y for _, y in flat if isinstance(y, Unavailable)]
        assert bad == []
        ref_old, ref_new = old.predict(xs), new.predict(xs)
        for k, y in flat:  # every answer came from one of the two versions
            assert (np.allclose(y, ref_old[k], atol=1e-6) or np.allclose(y, ref_new[k], atol=1e-6))
        st = eng.stats()
        assert st["swaps"] == {"accepted": 1}
        # rollback is atomic and serves the old version's outputs again
        assert eng.rollback() == 1 and eng.variant == "cpu.litert:fp32"
        np.testing.assert_array_equal(eng.predict(xs[5]), old.predict(xs[5]))


def test_swap_is_rejected_when_the_shadow_comparison_fails(compiled, perturbed, xs):
    old = compiled("signal", "cpu.litert")
    with Engine(old, EngineConfig.preset("single", shadow_samples=64)) as eng:
        with _Load(eng, xs, threads=2) as load:
            res = eng.swap(perturbed)
        assert not res.accepted
        assert "shadow comparison" in res.reason and any("corr" in v for v in res.violations)
        assert res.fidelity is not None and res.fidelity.corr < 0
        assert eng.version == 1 and eng.variant == "cpu.litert:fp32"
        assert not any(isinstance(y, Unavailable) for r in load.results for _, y in r)
        np.testing.assert_array_equal(eng.predict(xs[7]), old.predict(xs[7]))
        assert eng.stats()["swaps"] == {"rejected": 1}
        with pytest.raises(SwapError, match="no previous version"):
            eng.rollback()
        # explicitly switching without validation is possible (a retrained model)
        res2 = eng.swap(perturbed, tolerance=None)
        assert res2.accepted and eng.version == 3
        np.testing.assert_array_equal(eng.predict(xs[7]), perturbed.predict(xs[7]))


def test_swap_rejects_without_traffic_or_with_other_shapes(compiled, xs):
    old = compiled("signal", "cpu.litert")
    with Engine(old, EngineConfig.preset("single", shadow_timeout_s=0.3)) as eng:
        res = eng.swap(compiled("signal", "cpu.onnxruntime"))
        assert not res.accepted and "shadow saw 0 live request" in res.reason
        res = eng.swap(compiled("mlp", "cpu.litert"), tolerance=Tolerance())
        assert not res.accepted and "takes (64,)" in res.reason

        def broken():
            raise RuntimeError("compile exploded")
        res = eng.swap(broken)
        assert not res.accepted and "compile exploded" in res.reason
        assert eng.version == 1 and isinstance(eng.predict(xs[0]), np.ndarray)


def test_swap_factory_runs_at_lower_priority(compiled, xs):
    import os

    from hwbackends import isolate

    old, new = compiled("signal", "cpu.litert"), compiled("signal", "cpu.onnxruntime")
    seen = {}

    def factory():
        tid = threading.get_native_id()
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, tid)
        seen["worker"] = os.getpriority(os.PRIO_PROCESS, isolate.worker()._proc.pid)
        return new
    base = os.getpriority(os.PRIO_PROCESS, 0)
    with Engine(old, EngineConfig.preset("single", shadow_samples=32)) as eng:
        with _Load(eng, xs, threads=1):
            res = eng.swap(factory, nice=5)
        assert res.accepted, res.reason
    assert seen["thread"] == base + 5  # only the swap thread was lowered
    assert seen["worker"] >= 5
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base


def test_router_strategy_is_served_and_swaps_with_its_tolerance(tmp_path, store_dir, compiled, xs):
    from hwbackends.bench import ProfileCache
    from hwbackends.router import Router
    from hwbackends.serve import RouterStrategy

    cfg = tmp_path / "strategies.toml"
    cfg.write_text("""
[tiers.t]
p99_us = 100000

[router.bench]
n = 200
warmup = 10

[strategies.mom]
model = "zoo:signal"
tier = "t"
targets = ["cpu.litert"]
precisions = ["fp32"]
fidelity = { corr_min = 0.9999, max_abs = 1e-4 }
""")
    router = Router.from_config(cfg,
                                context=RunContext.at(store_dir,
                                                      profiles=ProfileCache(tmp_path / "profiles")))
    rs = RouterStrategy(router, "mom")
    assert rs.tolerance.max_abs == 1e-4
    lit = compiled("signal", "cpu.litert")
    with Engine(rs, EngineConfig.preset("latency", shadow_samples=32), strategy="mom") as eng:
        assert eng.variant.startswith("router:mom→cpu.litert")
        for x in xs[:10]:
            np.testing.assert_array_equal(eng.predict(x), lit.predict(x))
        assert eng.stats()["failovers"] == 0
        with _Load(eng, xs, threads=1):
            res = eng.swap(compiled("signal", "cpu.onnxruntime"))
        # the strategy's own tolerance (max_abs 1e-4) judged the shadow comparison
        assert res.accepted == (res.fidelity.max_abs <= 1e-4), res.reason
