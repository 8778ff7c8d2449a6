"""cpu.native fp32 LSTM over a long window: the input projections in chunks.

An LSTM's input projections K·x_t are one blocked product ahead of the time loop, so each step
reads only the recurrent kernel. A window whose products would not fit the stack bound took
the stacked [x_t, h] matvec per step instead (zoo:lstm_b: 1.48x ONNX Runtime's time); it now
takes the products in chunks of steps. This checks the chunked form through the public API
(Keras, whose reader is quick on a long window), against Keras.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import hwbackends as hwb

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")


def test_long_window_lstm_is_right_in_fp32(store_dir) -> None:
    """LSTM(64, sequences) -> LSTM(64) -> Dense(1) over (700, 2): 1 KiB of gate products a
    step, 700 KiB a window, past the 256 KiB the emitter holds at once: a loop over two
    chunks of 240 steps, then one of 220 (checked in the generated C), within 1e-5."""
    keras = pytest.importorskip("keras")
    keras.utils.set_random_seed(0)
    km = keras.Sequential([keras.Input((700, 2)), keras.layers.LSTM(64, return_sequences=True),
                           keras.layers.LSTM(64), keras.layers.Dense(1)], name="long_lstm")
    cm = hwb.compile(km, "cpu.native", "fp32", store=store_dir, fidelity=False)
    code = cm.artifact.file("model.c").read_text()
    assert code.count("t0 < 480; t0 += 240") == 2 and code.count("t < 480 + 220") == 2
    x = np.random.default_rng(1).standard_normal((8, 700, 2)).astype(np.float32)
    want = np.asarray(km(x), np.float64)
    err = float(np.abs(cm.predict(x) - want).max()) / max(float(np.abs(want).max()), 1e-3)
    assert err <= 1e-5, f"off by {err:.3g} of the output scale"
