"""Hot swap under concurrent load (zero failures), a swap the shadow comparison rejects (a model
with different weights), rollback."""
from __future__ import annotations

import threading

import numpy as np
import pytest

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
