"""Real models and a newcomer's first hour (issue 20): model shapes users actually have — a
Keras 2 functional JSON (hls4ml's KERAS_1layer), one input with two outputs, a PyTorch MLP on
the da4ml FPGA target, BatchNormalization before a softmax on hls4ml, a model whose output
is constant on synthetic inputs — and the advice given when a model file cannot be used.
Every model is built here, tiny, with a fixed seed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from legacy_models import numpy_mlp, write_keras2_functional

import hwbackends as hwb
from hwbackends.cli import main as hwb_main

X16 = np.random.default_rng(20).standard_normal((6, 16)).astype(np.float32)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = hwb_main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


# -- item 1: cpu.litert / tpu.edgetpu follow the structure of km.input ------------------------
@pytest.fixture(scope="module")
def keras1layer(tmp_path_factory) -> tuple[Path, list[np.ndarray]]:
    """hls4ml's KERAS_1layer shape: a Keras 2 functional JSON and its ``_weights.h5``."""
    return write_keras2_functional(tmp_path_factory.mktemp("k1"))


def test_keras2_functional_json_compiles_on_the_default_target(keras1layer, store_dir, capsys):
    """`hwb compile KERAS_1layer.json`: a new user's first command, on cpu.litert."""
    path, ws = keras1layer
    rc, out, err = _cli(capsys, "compile", str(path), "--cache-dir", str(store_dir))
    assert rc == 0, err
    assert "cpu.litert:fp32" in out
    m = hwb.load_model(path)
    assert isinstance(m.obj.input, list)  # the structure that broke static_clone
    cm = hwb.compile(m, "cpu.litert", store=store_dir)
    np.testing.assert_allclose(cm.predict(X16), numpy_mlp(X16, ws), atol=1e-5)


def test_keras2_functional_json_int8_and_edgetpu(keras1layer, store_dir):
    m = hwb.load_model(keras1layer[0])
    for target, precision in (("cpu.litert", "int8"), ("tpu.edgetpu", None)):
        cm = hwb.compile(m, target, precision, store=store_dir)
        assert cm.fidelity.argmax_agree > 0.9, (target, cm.fidelity)


@pytest.fixture(scope="module")
def one_in_two_out():
    import keras

    keras.utils.set_random_seed(3)
    x = keras.Input((6,), name="x")
    h = keras.layers.Dense(8, activation="relu", name="h")(x)
    km = keras.Model(x, [keras.layers.Dense(1, name="ret")(h),
                         keras.layers.Dense(3, activation="softmax", name="side")(h)])
    return hwb.load_model(km, name="one_in_two_out")


@pytest.mark.parametrize("target,precision", [("cpu.litert", "fp32"), ("cpu.litert", "int8"),
                                              ("tpu.edgetpu", None)])
def test_one_input_two_outputs(one_in_two_out, store_dir, target, precision):
    m = one_in_two_out
    cm = hwb.compile(m, target, precision, store=store_dir)
    x = np.random.default_rng(4).standard_normal((5, 6)).astype(np.float32)
    got, want = cm.predict(x), m.reference(x)
    assert [a.shape for a in got] == [(5, 1), (5, 3)]
    tol = 1e-5 if precision == "fp32" else 0.1
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=tol)
