"""``cm.sliding()`` through the public API on a target without an incremental form
(cpu.onnxruntime: the recompute fallback), and its refusals. The incremental C of cpu.native
is tested in tests/test_sliding_native.py; the kit's ``sliding`` check runs on every target
in tests/test_conformance.py."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sliding_ref import window_answers

from hwbackends.errors import InputError, UnsupportedError

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def lstm_ort(compiled):
    return compiled("lstm", "cpu.onnxruntime")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), seed=st.integers(0, 2**16), resets=st.sets(st.integers(1, 39), max_size=2),
       auto=st.booleans(), prepare_every=st.integers(0, 3))
def test_recompute_window_is_predict_into_on_the_window(lstm_ort, n, seed, resets, auto, prepare_every):
    """Every tick's answer is predict_into's on that window: zero-filled at first, full after
    16 steps, emptied by reset(); prepare() between ticks or not changes nothing."""
    cm = lstm_ort
    xs = np.random.default_rng(seed).normal(size=(n, *cm.input.shape[1:])).astype(np.float32)
    w = cm.sliding(auto_prepare=auto)
    assert w.form == "recompute" and w.window == 16 and w.step_shape == (8,)
    got = np.zeros((n, *cm.output.shape), np.float32)
    out = np.zeros(cm.output.shape, np.float32)
    for i in range(n):
        if i in resets:
            w.reset()
        w.push_into(xs[i], out)
        got[i] = out
        if prepare_every and i % prepare_every == 0:
            w.prepare()
    np.testing.assert_array_equal(got, window_answers(cm, xs, {r for r in resets if r < n}))


def test_window_of_a_batch_compiled_model(compiled):
    """A variant compiled for batch 3 slides through row 0 of a staging batch."""
    cm = compiled("lstm", "cpu.onnxruntime", batch_size=3)
    xs = np.random.default_rng(1).normal(size=(20, 8)).astype(np.float32)
    w = cm.sliding()
    out = np.zeros(cm.output.shape, np.float32)
    got = []
    for x in xs:
        w.push_into(x, out)
        got.append(out.copy())
    np.testing.assert_array_equal(np.array(got), window_answers(cm, xs))


def test_push_into_refuses_wrong_arrays(lstm_ort):
    w = lstm_ort.sliding()
    out = np.zeros((1,), np.float32)
    ro = np.zeros(1, np.float32)
    ro.setflags(write=False)
    for x, o, msg in [(np.zeros((1, 8), np.float32), out, r"x_t has shape \(1, 8\); expected \(8,\)"),
                      (np.zeros(8), out, "x_t has dtype float64"),
                      ([0.0] * 8, out, "x_t must be a numpy.ndarray"),
                      (np.zeros(8, np.float32), np.zeros((1, 1), np.float32), r"out has shape \(1, 1\)"),
                      (np.zeros(8, np.float32), ro, "out is read-only")]:
        with pytest.raises(InputError, match=msg):
            w.push_into(x, o)
    w.push_into(np.zeros(8, np.float32), out)  # a right call afterwards works


def test_streaming_and_multi_io_are_refused_with_the_reason(lstm_ort, compiled):
    with pytest.raises(UnsupportedError, match="no streaming form"):
        lstm_ort.streaming()
    two = compiled("two_head", "cpu.onnxruntime")
    with pytest.raises(UnsupportedError, match="one input and one output"):
        two.sliding()
