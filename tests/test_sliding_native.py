"""cpu.native's incremental sliding window and stream (hwb_plugins/cpu_native/sliding.py), through
the public API: random recurrent Keras models (LSTM/GRU stacks, both GRU forms, a per-step
activation before them, a Dense head) compiled, then ``sliding().push_into`` against
``predict_into`` on the same window over many ticks, with resets and prepare patterns; the
stream against the layer IR's float64 reference over a sequence longer than the window.
``HWB_SLIDING_EXAMPLES`` raises the number of random models (default 3)."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sliding_ref import check_drawn_ticks, push_all, seeded_weights, window_answers

import hwbackends as hwb
from hwbackends.errors import InputError, UnsupportedError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
EXAMPLES = int(os.environ.get("HWB_SLIDING_EXAMPLES", "3"))
#: The issue's bound on |push_into - predict_into| in fp32, over the answers' scale.
FP32_ERR = 1e-5

cells = st.lists(st.tuples(st.sampled_from(["lstm", "gru", "gru_v1"]), st.integers(1, 12)),
                 min_size=1, max_size=3)


def recurrent_model(seed: int, window: int, features: int, stack, prefix: bool, head: int):
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((window, features), name="window")]
    if prefix:
        layers.append(keras.layers.Activation("tanh", name="squash"))
    for i, (kind, units) in enumerate(stack):
        seq = i + 1 < len(stack)
        if kind == "lstm":
            layers.append(keras.layers.LSTM(units, return_sequences=seq, name=f"rec{i}"))
        else:
            layers.append(keras.layers.GRU(units, return_sequences=seq, reset_after=kind == "gru",
                                           name=f"rec{i}"))
    if head:
        layers.append(keras.layers.Dense(head, activation="relu", name="hidden"))
    layers.append(keras.layers.Dense(2, name="signal"))
    return seeded_weights(keras.Sequential(layers, name="sliding_rand"), seed)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), window=st.integers(1, 9), features=st.integers(1, 6), stack=cells,
       prefix=st.booleans(), head=st.sampled_from([0, 5]), data=st.data())
def test_incremental_window_equals_predict_into_on_the_window(store_dir, seed, window, features, stack,
                                                              prefix, head, data):
    km = recurrent_model(seed, window, features, stack, prefix, head)
    cm = hwb.compile(km, "cpu.native", store=store_dir, fidelity=False)
    assert cm.artifact.meta["sliding"]["form"] == "incremental"
    xs, auto, every = check_drawn_ticks(cm, data, seed, features, window, FP32_ERR)
    # the stream: state never reset; after `window` pushes it is the window from zero state
    s = cm.streaming(auto_prepare=auto)
    long = np.concatenate([xs, xs[::-1]])
    got_s = push_all(s, long, tuple(cm.output.shape), prepare_every=every)
    ref = _ir_reference(km, long)
    np.testing.assert_allclose(got_s, ref, atol=FP32_ERR * max(1.0, np.abs(ref).max()), rtol=0)


def _ir_reference(km, seq: np.ndarray) -> np.ndarray:
    """The float64 layer-IR model on every prefix of ``seq`` (the stream's answers)."""
    from hwbackends import layer_ir

    net = layer_ir.extract(hwb.load_model(km), "test")
    return np.array([layer_ir.forward(net, seq[None, :i + 1])[-1][0] for i in range(len(seq))],
                    np.float32)


@pytest.fixture(scope="module")
def lstm_native(compiled):
    return compiled("lstm", "cpu.native")


def test_zoo_lstm_over_many_ticks(lstm_native):
    """2,000 ticks of the zoo LSTM (window 16): every answer within 1e-5 of predict_into's."""
    cm = lstm_native
    xs = np.random.default_rng(7).normal(size=(2000, 8)).astype(np.float32)
    got = push_all(cm.sliding(), xs, (1,))
    want = window_answers(cm, xs)
    assert np.abs(got - want).max() <= FP32_ERR * max(1.0, np.abs(want).max())


def test_a_second_window_takes_over_and_the_first_says_so(lstm_native):
    a = lstm_native.sliding()
    out = np.zeros(1, np.float32)
    a.push_into(np.ones(8, np.float32), out)
    b = lstm_native.sliding()
    with pytest.raises(UnsupportedError, match="replaced"):
        a.push_into(np.ones(8, np.float32), out)
    b.push_into(np.ones(8, np.float32), out)  # the new one starts from an empty window
    np.testing.assert_array_equal(out, window_answers(lstm_native, np.ones((1, 8), np.float32))[0])


def test_native_push_refuses_wrong_arrays(lstm_native):
    w = lstm_native.sliding()
    out = np.zeros(1, np.float32)
    for x, o, msg in [(np.zeros((1, 8), np.float32), out, r"x_t has shape \(1, 8\)"),
                      (np.zeros(8), out, "dtype float64"),
                      (np.zeros(16, np.float32)[::2], out, "C-contiguous"),
                      (np.zeros(8, np.float32), np.zeros(2, np.float32), r"out has shape \(2,\)")]:
        with pytest.raises(InputError, match=msg):
            w.push_into(x, o)


def test_models_without_an_incremental_form_recompute_in_c(compiled):
    """The mlp (a window of 64 scalars) takes the recompute form in C: predict's own function
    on the ring, so equal bit for bit; no stream. (A conv stack takes sliding_conv.py's
    incremental form: tests/test_sliding_conv.py, which also checks a conv it refuses.)"""
    for name, step in (("mlp", ()),):
        cm = compiled(name, "cpu.native")
        assert cm.artifact.meta["sliding"]["form"] == "recompute"
        xs = np.random.default_rng(3).normal(size=(cm.input.shape[0] + 9, *step)).astype(np.float32)
        w = cm.sliding()
        assert w.form == "recompute"
        np.testing.assert_array_equal(push_all(w, xs, tuple(cm.output.shape)), window_answers(cm, xs))
        with pytest.raises(UnsupportedError, match="no streaming form"):
            cm.streaming()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler (g++)")
def test_cpp_example_answers_equal_pythons_bit_for_bit(lstm_native, tmp_path):
    """examples/sliding_push.cpp on the exported library (hwb_model_push, then prepare, per tick)
    gives Python's sliding().push_into answers, bit for bit."""
    import subprocess
    from pathlib import Path

    from hwbackends.registry import get_registry

    cm = lstm_native
    lib = tmp_path / "lib"
    get_registry().target("cpu.native").export(cm.artifact, "c", lib)
    header = (lib / "hwb_model.h").read_text()
    assert "int hwb_model_push(const float *x_t, float *y);" in header and '"incremental"' in header
    exe = tmp_path / "sliding_push"
    src = Path(__file__).resolve().parents[1] / "examples" / "sliding_push.cpp"
    subprocess.run(["g++", "-O2", "-std=c++17", "-Wall", "-Werror", f"-I{lib}", str(src),
                    str(lib / "libhwb_model.so"), f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True, timeout=120)
    xs = np.random.default_rng(11).normal(size=(300, 8)).astype(np.float32)
    xs.tofile(tmp_path / "x.f32")
    subprocess.run([str(exe), str(tmp_path / "x.f32"), str(tmp_path / "y.f32")], check=True, timeout=60)
    got = np.fromfile(tmp_path / "y.f32", np.float32).reshape(len(xs), 1)
    assert got.tobytes() == push_all(cm.sliding(), xs, (1,)).tobytes()
    bench = subprocess.run([str(exe), "--bench", "300"], capture_output=True, text=True, check=True, timeout=60)
    assert "hwb_model_push p50" in bench.stdout


@pytest.mark.parametrize("isa", ["native", "x86-64-v3"])
def test_blocked_input_projection_matches_the_reference_and_the_push(store_dir, isa):
    """The LSTM's input projections over all steps as one blocked product (emit.py's
    input_gemm: tiles of 8 steps, here 11 steps so a 3-step tail, 4·13 = 52 gate outputs so a
    partial vector) at AVX-512's and AVX2's vector shapes: the full window within 1e-5 of the
    layer IR's float64 reference, and the sliding push, which sums K·x_t with the same tile
    code, equal to predict_into bit for bit."""
    from hwb_plugins.cpu_native import build

    if isa != "native" and (build.arch() != "x86_64" or "avx2" not in build.host_flags()):
        pytest.skip("x86-64-v3 needs an x86-64 CPU with AVX2")
    t = 11
    km = recurrent_model(5, t, 11, [("lstm", 13), ("lstm", 13)], prefix=False, head=0)
    cm = hwb.compile(km, "cpu.native", store=store_dir, fidelity=False, options={"isa": isa})
    xs = np.random.default_rng(9).normal(0, 1.5, (40, 11)).astype(np.float32)
    want = window_answers(cm, xs)
    wins = np.stack([np.concatenate([np.zeros((max(0, t - 1 - i), 11), np.float32), xs[max(0, i - t + 1):i + 1]])
                     for i in range(len(xs))])
    from hwbackends import layer_ir

    net = layer_ir.extract(hwb.load_model(km), "test")
    ref = np.stack([layer_ir.forward(net, w[None])[-1][0] for w in wins]).astype(np.float32)
    np.testing.assert_allclose(want, ref, atol=FP32_ERR * max(1.0, np.abs(ref).max()), rtol=0)
    assert push_all(cm.sliding(), xs, tuple(cm.output.shape)).tobytes() == want.tobytes()
