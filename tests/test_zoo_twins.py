"""The zoo's ONNX twins (hwbackends.zoo_onnx): each Keras zoo model written as an ONNX graph from
the same seeded weights computes the same function, and the NumPy-trained signal (what
``zoo:signal`` is without Keras) is a real, deterministic, trained model of the same
architecture. Needs Keras (both sides of the comparison); the no-Keras path itself runs
through ``hwb`` in tests/test_cpu_install.py."""
from __future__ import annotations

import numpy as np
import pytest

from hwbackends import zoo, zoo_onnx
from hwbackends.models import load_model

keras = pytest.importorskip("keras")

#: name → samples compared (lstm_b is large: 100 ticks × 250 features, LSTM 200 ×3)
SAMPLES = {"mlp": 256, "lstm": 256, "conv1d": 256, "two_head": 256, "lstm_a": 64, "lstm_b": 16,
           "deeplob": 16}


def _outputs(m, x) -> tuple[np.ndarray, ...]:
    y = m.reference(x)
    return tuple(y) if isinstance(y, (tuple, list)) else (y,)


@pytest.mark.parametrize("name", list(SAMPLES))
def test_the_onnx_twin_computes_the_keras_model(name: str) -> None:
    keras_build, onnx_build = zoo.TWINS[name]
    k, o = load_model(keras_build(), name=name), load_model(onnx_build(), name=name)
    assert (k.format, o.format) == ("keras", "onnx")
    assert [s.shape for s in o.inputs] == [s.shape for s in k.inputs]
    assert [s.shape for s in o.outputs] == [s.shape for s in k.outputs]
    if name != "mlp":  # the mlp twin keeps its published names (features → probs)
        assert [s.name for s in o.inputs] == [s.name for s in k.inputs]
        assert [s.name for s in o.outputs] == [s.name for s in k.outputs]
    rng = np.random.default_rng(5)
    x = tuple(rng.standard_normal((SAMPLES[name], *s.shape)).astype(np.float32) for s in k.inputs)
    x = x if len(x) > 1 else x[0]
    for yk, yo in zip(_outputs(k, x), _outputs(o, x), strict=True):
        scale = float(np.abs(yk).max())
        assert scale > 1e-3 and np.std(yk) > 1e-4, "a degenerate output would compare nothing"
        assert float(np.abs(yo - yk).max()) <= 1e-5 * max(scale, 1.0), (name, scale)
    assert o.fingerprint != k.fingerprint  # another model file: its own fingerprint


def test_the_lstm_twin_maps_every_gate() -> None:
    """A gate mapped to the wrong ONNX block would still pass with gates that look alike;
    here each Keras gate block in turn is scaled up, and the twin must follow each."""
    base = zoo.lstm_weights()
    u = 32
    x = np.random.default_rng(2).standard_normal((64, 16, 8)).astype(np.float32)
    for gate in range(4):
        ws = [w.copy() for w in base]
        ws[0][:, gate * u:(gate + 1) * u] *= 3.0
        ws[2][gate * u:(gate + 1) * u] += 0.5
        km = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(u), keras.layers.Dense(1)])
        km.set_weights(ws)
        o = load_model(zoo_onnx.lstm_stack("g", 16, 8, ws), name="g")
        yk = np.asarray(km.predict(x, verbose=0))
        np.testing.assert_allclose(o.reference(x), yk, atol=1e-5 * max(1.0, np.abs(yk).max()))


def test_the_numpy_signal_is_trained_deterministic_and_of_the_keras_architecture() -> None:
    a, b = zoo.numpy_signal(), zoo.numpy_signal()
    assert a.SerializeToString() == b.SerializeToString()  # the same bytes each time
    o = load_model(a, name="signal")
    assert [s.shape for s in o.inputs] == [(32,)] and [s.shape for s in o.outputs] == [(1,)]
    # the graph is the Keras signal architecture holding the NumPy-trained weights
    from onnx import numpy_helper

    ws = [numpy_helper.to_array(t) for t in a.graph.initializer]
    km = keras.Sequential([keras.Input((32,)), keras.layers.Dense(32, activation="relu"),
                           keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(1, activation="tanh")])
    km.set_weights(ws)
    xv, yv = zoo.orderbook_features(2048, seed=1)
    yo = o.reference(xv)
    np.testing.assert_allclose(yo, np.asarray(km.predict(xv, verbose=0)), atol=1e-5)
    np.testing.assert_allclose(yo, zoo_onnx.signal_forward(ws, xv), atol=1e-5)
    # and it learned the signal (Keras' training reaches about 0.85 here; untrained is ~0)
    corr = float(np.corrcoef(yo.ravel(), yv.ravel())[0, 1])
    untrained = float(np.corrcoef(zoo_onnx.signal_forward(zoo.signal_init(), xv).ravel(),
                                  yv.ravel())[0, 1])
    assert corr > 0.8 and corr - untrained > 0.3, (corr, untrained)


def test_train_signal_follows_the_loss_gradient() -> None:
    """One Adam step from the start moves every weight against the MSE gradient (checked by
    finite differences), so the training is a descent, not a random walk."""
    x, y = zoo.orderbook_features(256, seed=3)
    init = zoo.signal_init()

    def loss(ws: list[np.ndarray]) -> float:
        return float(np.mean((zoo_onnx.signal_forward(ws, x) - y) ** 2))

    after = zoo_onnx.train_signal(init, x, y, epochs=1, batch=256, lr=1e-3)
    assert loss(after) < loss(init)
    rng = np.random.default_rng(0)
    for j, w in enumerate(init):
        idx = tuple(int(rng.integers(0, d)) for d in w.shape)
        bumped = [v.astype(np.float64) for v in init]
        bumped[j][idx] += 1e-4
        g = (loss(bumped) - loss(init)) / 1e-4
        if abs(g) > 1e-4:  # Adam's first step is -lr·sign(g)
            assert np.sign(after[j][idx] - init[j][idx]) == -np.sign(g), (j, idx, g)


def test_the_memo_tells_the_twin_from_the_keras_build(tmp_path, monkeypatch) -> None:
    """Keras installed but refused (as the cpu_install tests do it) must not reuse the Keras
    build's memo, nor the other way round: the memo key names the source."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("HWB_CACHE_DIR", str(root))
    k = zoo.get("lstm")
    assert k.format == "keras" and zoo._memo_key("lstm")
    with monkeypatch.context() as mp:
        mp.setattr(zoo, "keras_available", lambda: False)
        key = zoo._memo_key("lstm")
        o = zoo.get("lstm")
        assert o.format == "onnx" and o.fingerprint != k.fingerprint and "obj" in vars(o)  # built
        again = zoo.get("lstm")  # now from its own memo
        assert again.format == "onnx" and "obj" not in vars(again)
    assert zoo._memo_key("lstm") != key
    m = zoo.get("lstm")
    assert m.format == "keras" and m.fingerprint == k.fingerprint


def test_a_planted_numpy_signal_is_retrained(tmp_path, monkeypatch) -> None:
    """The no-Keras signal file is under the same trust rule as the Keras one: a file put
    there unsigned (here another model) or edited after signing is trained again."""
    root = tmp_path / "cache"
    (root / "zoo").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    monkeypatch.setenv("HWB_CACHE_DIR", str(root))
    monkeypatch.setattr(zoo, "keras_available", lambda: False)
    planted = root / "zoo" / f"signal-{zoo.SIGNAL_VERSION}-numpy.onnx"
    planted.write_bytes(zoo.onnx_conv1d().SerializeToString())
    trained = zoo.numpy_signal().SerializeToString()
    assert zoo.signal_path() == planted and planted.read_bytes() == trained
    planted.write_bytes(trained + b"\0")
    zoo.signal_path()
    assert planted.read_bytes() == trained
    assert zoo.get("signal").format == "onnx"
