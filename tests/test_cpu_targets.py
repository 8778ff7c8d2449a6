"""End to end through the real LiteRT, ONNX Runtime, TensorFlow, tf2onnx and PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.errors import CompileError, InputError

pytestmark = pytest.mark.slow

KERAS_ZOO = ("mlp", "lstm", "conv1d", "signal")
# (min correlation, max abs error relative to the output range) per precision
TOL = {"fp32": (0.999999, 1e-5), "fp16": (0.9999, 2e-3), "int8-dynamic": (0.999, 0.05),
       "int8": (0.995, 0.12)}


@pytest.mark.parametrize("name", KERAS_ZOO)
@pytest.mark.parametrize("target,precision", [
    ("cpu.litert", "fp32"), ("cpu.litert", "fp16"), ("cpu.litert", "int8-dynamic"),
    ("cpu.litert", "int8"), ("cpu.onnxruntime", "fp32"), ("cpu.onnxruntime", "int8-dynamic"),
    ("cpu.onnxruntime", "int8")])
def test_zoo_compiles_with_fidelity(compiled, zoo_model, name, target, precision):
    cm = compiled(name, target, precision)
    corr_min, rel_max = TOL[precision]
    f = cm.fidelity
    assert f is not None and f.n >= 256
    assert f.corr >= corr_min, f"{cm.variant} on {name}: {f}"
    assert f.rel_err <= rel_max, f"{cm.variant} on {name}: {f}"
    m = zoo_model(name)
    x = m.representative(4, seed=9)
    np.testing.assert_allclose(cm.predict(x), m.reference(x), atol=rel_max * 10 + 1e-6)
    out = np.empty(cm.output.batched(1), np.float32)
    cm.predict_into(x[:1], out)
    np.testing.assert_allclose(out, cm.predict(x[:1]), rtol=0, atol=0)
    d = cm.describe()
    assert d["mode"] == "hardware" and d["fingerprint"] == m.fingerprint
    assert d["toolchain"] and d["artifact_bytes"] > 0


@pytest.mark.parametrize("name", ("mlp_torch", "lstm_torch"))
def test_torch_models_via_onnx_match_their_keras_twins(compiled, zoo_model, name):
    cm = compiled(name, "cpu.onnxruntime", "fp32")
    assert cm.fidelity.max_abs < 1e-5
    twin = zoo_model(name.replace("_torch", ""))
    x = twin.representative(16, seed=3)
    np.testing.assert_allclose(cm.predict(x), twin.reference(x), atol=2e-5)
    ref = compiled(name, "ref")
    np.testing.assert_allclose(ref.predict(x), twin.reference(x), atol=2e-5)


# A second identical compile is a cached load with the same key and outputs, and a corrupted
# artifact file is detected and rebuilt with the same outputs: the kit's store_roundtrip checks
# both on cpu.litert's mlp fp32 (tests/test_conformance.py), the build the tests here share.


def test_batch_size_and_predict_chunking(zoo_model, store_dir):
    m = zoo_model("signal")
    cm = hwb.compile(m, "cpu.litert", "fp32", batch_size=4, store=store_dir)
    x = m.representative(10, seed=5)
    np.testing.assert_allclose(cm.predict(x), m.reference(x), atol=1e-5)  # 4+4+2 padded
    out = np.empty((4, 1), np.float32)
    cm.predict_into(x[:4], out)
    with pytest.raises(InputError, match=r"compiled for \(4, 32\)"):
        cm.predict_into(x[:1], np.empty((1, 1), np.float32))


def test_bad_inputs_get_clear_errors(compiled):
    cm = compiled("signal", "cpu.litert", "fp32")
    with pytest.raises(InputError, match=r"expected \(32,\)"):
        cm.predict(np.zeros((2, 31), np.float32))
    with pytest.raises(InputError, match="NaN/Inf"):
        cm.predict(np.full((1, 32), np.nan, np.float32))
    with pytest.raises(InputError, match="dtype"):
        cm.predict(np.array([["a"] * 32]))
    out = np.empty((1, 1), np.float32)
    # predict_into refuses what numpy would silently cast or broadcast (conformance kit rule;
    # predict() is the converting entry point)
    x64 = np.linspace(-1, 1, 32)[None]
    with pytest.raises(InputError, match="dtype float64"):
        cm.predict_into(x64, out)
    with pytest.raises(InputError, match="shape"):
        cm.predict_into(np.zeros((1, 1), np.float32), out)  # would broadcast into the buffer
    with pytest.raises(InputError, match="dtype <U1"):
        cm.predict_into(np.array([["a"] * 32]), out)
    with pytest.raises(InputError, match="shape"):
        cm.predict_into(np.zeros((1, 16), np.float32), out)
    # still serving after the errors
    assert cm.predict(np.zeros(32, np.float32)).shape == (1,)


def test_nan_policy_pass_lets_values_through(zoo_model, store_dir):
    cm = hwb.compile(zoo_model("signal"), "cpu.onnxruntime", "fp32", nan_policy="pass",
                     fidelity=False, store=store_dir)
    y = cm.predict(np.full(32, np.inf, np.float32))
    assert y.shape == (1,)


def test_crashing_converter_raises_compile_error_and_process_survives(zoo_model, store_dir,
                                                                     private_worker):
    """TF 2.21's full-int8 converter segfaults on a Keras LSTM left as a WHILE loop (in this
    test's own worker: the crash ends it, the session's stays warm)."""
    m = zoo_model("lstm")
    with pytest.raises(CompileError) as info:
        hwb.compile(m, "cpu.litert", "int8", options={"recurrent": "loop"}, store=store_dir)
    e = info.value
    assert e.target == "cpu.litert" and e.precision == "int8"
    assert "crashed the compile process" in str(e) and "SIGSEGV" in str(e)
    assert not any((store_dir / "objects").rglob("*.tmp"))
    # the worker was replaced: the next compile works
    cm = hwb.compile(m, "cpu.litert", "fp32", options={"recurrent": "loop"}, store=store_dir)
    assert "WHILE" in cm.artifact.meta["ops"] and cm.fidelity.max_abs < 1e-5


def test_unsupported_layer_names_layer_and_target(tmp_path):
    import keras

    @keras.saving.register_keras_serializable(package="hwbtest")
    class Det(keras.layers.Layer):
        def call(self, x):
            return keras.ops.expand_dims(keras.ops.det(keras.ops.reshape(x, (-1, 4, 4))), -1)

    inp = keras.Input((16,))
    km = keras.Model(inp, Det(name="det_layer")(keras.layers.Dense(16, name="d")(inp)), name="uns")
    with pytest.raises(hwb.UnsupportedError, match="cpu.litert.*det_layer.*MatrixDeterminant"):
        hwb.compile(km, "cpu.litert", "fp32", store=tmp_path, isolate_compile=False)
    assert not any((tmp_path / "objects").rglob("*")) if (tmp_path / "objects").exists() else True


def test_compile_timeout_kills_the_worker(zoo_model, tmp_path, private_worker):
    with pytest.raises(CompileError, match="timed out"):
        hwb.compile(zoo_model("conv1d"), "cpu.onnxruntime", "int8", store=tmp_path, timeout=0.05)
    cm = hwb.compile(zoo_model("mlp"), "cpu.litert", "fp32", store=tmp_path)
    assert cm.fidelity.max_abs < 1e-5
