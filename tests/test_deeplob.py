"""zoo:deeplob — DeepLOB reconstructed from its paper (random weights; hwbackends/zoo.py) — on
every CPU target through ``hwb.compile``: cpu.native (its generated C), cpu.onnxruntime (the
Keras model through tf2onnx) and cpu.litert (through the TFLite converter) in fp32, each
within 1e-5 of Keras' answers' scale on fresh inputs (the compile's own fp32 gate passed on
held-out ones), cpu.native's (4, 1), (3, 1) and (5, 1) convs by Winograd (its default), and
its ONNX twin through cpu.native's ONNX reader; cpu.native's int8 within
its gate; and the sliding window (one (40, 1) event a
tick) answering what ``predict_into`` answers for the window ending at that event.

One module-scope compile per target (about a minute in all on the loaded 2-core dev machine:
gcc, tf2onnx, the TFLite converter)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends import layer_ir, zoo
from hwbackends.fidelity import TOLERANCES, compare

pytest.importorskip("keras")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")]

TARGETS = ("cpu.native", "cpu.onnxruntime", "cpu.litert")
FP32_BOUND = 1e-5


def _book(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *zoo.DEEPLOB_SHAPE)).astype(np.float32)


@pytest.fixture(scope="module")
def deeplob():
    return zoo.get("deeplob", deferred=False)


@pytest.fixture(scope="module")
def fresh(deeplob) -> tuple[np.ndarray, np.ndarray]:
    x = _book(48, 7)
    return x, np.asarray(deeplob.reference(x), np.float64)


@pytest.fixture(scope="module")
def compiled(deeplob, tmp_path_factory):
    store = tmp_path_factory.mktemp("deeplob-store")
    pytest.importorskip("onnxruntime")
    return {t: hwb.compile(deeplob, t, "fp32", store=store, isolate_compile=False,
                           validation_data=_book(64, 3)) for t in TARGETS}


def test_deeplob_has_the_papers_layers(deeplob) -> None:
    """100 events × 40 features × 1 channel; nine convs of 32 filters ((1, 2) stride (1, 2) or
    (1, 10), then two (4, 1) 'same'), each with LeakyReLU(0.01); an inception module of three
    64-filter branches concatenated to 192 channels; LSTM(64); Dense(3, softmax)."""
    assert tuple(deeplob.input.shape) == (100, 40, 1) and tuple(deeplob.output.shape) == (3,)
    net = layer_ir.extract(deeplob, "cpu.native")
    kinds = [type(x).__name__ for x in net.layers]
    assert kinds == ["Conv2D", "Act"] * 9 + ["Concat", "Reshape", "Recurrent", "Dense", "Act"]
    convs = [x for x in net.layers if isinstance(x, layer_ir.Conv2D)]
    assert [c.w.shape[:2] for c in convs] == [(1, 2), (4, 1), (4, 1)] * 2 + [(1, 10), (4, 1), (4, 1)]
    assert {c.w.shape[3] for c in convs} == {32} and [c.stride for c in convs[:4:3]] == [(1, 2)] * 2
    assert {(a.kind, a.alpha) for a in net.layers if isinstance(a, layer_ir.Act)} == {
        ("leaky_relu", 0.01), ("softmax", 0.0)}
    inc = next(x for x in net.layers if isinstance(x, layer_ir.Concat))
    assert [[type(x).__name__ for x in b] for b in inc.branches] == [
        ["Conv2D", "Act", "Conv2D", "Act"]] * 2 + [["Pool2D", "Conv2D", "Act"]]
    assert net.shapes()[net.layers.index(inc)] == (100, 1, 192)
    lstm = next(x for x in net.layers if isinstance(x, layer_ir.Recurrent))
    assert (lstm.cell, lstm.units, lstm.return_sequences) == ("lstm", 64, False)


@pytest.mark.parametrize("target", TARGETS)
def test_deeplob_fp32_on_every_cpu_target(compiled, fresh, target: str) -> None:
    cm = compiled[target]
    assert not TOLERANCES["fp32"].violations(cm.fidelity), cm.fidelity
    x, want = fresh
    assert float(want.std(axis=0).min()) > 0.01, "a near-constant output would compare nothing"
    err = float(np.abs(cm.predict(x) - want).max()) / float(np.abs(want).max())
    assert err <= FP32_BOUND, f"{target}: off by {err:.3g} of the output scale"


def test_deeplob_native_convs_by_winograd(compiled, fresh) -> None:
    """The default conv_algorithm (auto) computes the six (4, 1) trunk convs and the
    inception's (3, 1) and (5, 1) by Winograd, the (1, 2), (1, 10) and 1×1 ones directly;
    the answers stay within the fp32 bound of Keras' (max seen 1.5e-6 of the scale)."""
    cm = compiled["cpu.native"]
    taken = {w["layer"]: tuple(w["kernel"]) for w in cm.describe()["meta"]["winograd"]}
    want_layers = {name: k for name, _, k, _, _ in zoo.DEEPLOB_TRUNK if k[0] > 1}
    want_layers |= {name: k for br in zoo.DEEPLOB_BRANCHES for name, f, k, _, _ in br if f and k[0] > 1}
    assert taken == want_layers, taken
    x, want = fresh
    err = float(np.abs(cm.predict(x) - want).max()) / float(np.abs(want).max())
    assert err <= FP32_BOUND, f"Winograd DeepLOB off by {err:.3g} of the output scale"


def test_deeplob_onnx_twin_on_cpu_native(fresh, tmp_path) -> None:
    """The ONNX twin (hwbackends/zoo_onnx.py: NCHW Conv, LeakyRelu, MaxPool, Concat, LSTM)
    through cpu.native's ONNX reader: the same answers as Keras'."""
    pytest.importorskip("onnxruntime")
    twin = hwb.load_model(zoo.onnx_deeplob(), name="deeplob")
    cm = hwb.compile(twin, "cpu.native", "fp32", store=tmp_path, isolate_compile=False, fidelity=False)
    x, want = fresh
    assert float(np.abs(cm.predict(x) - want).max()) <= FP32_BOUND * float(np.abs(want).max())


def test_deeplob_int8_on_cpu_native_within_its_gate(deeplob, fresh, tmp_path) -> None:
    """Every conv window, the LSTM's gates and the head through the int8 matmul (calibrated
    per layer on 96 inputs); the gate on held-out inputs, then fresh ones."""
    cm = hwb.compile(deeplob, "cpu.native", "int8", store=tmp_path, isolate_compile=False,
                     calibration_data=_book(96, 11), validation_data=_book(64, 12))
    assert cm.artifact.meta["int8_kernel"] and cm.fidelity.n == 64
    assert cm.artifact.meta["winograd"] == []  # Winograd is fp32's
    x, want = fresh
    f = compare(want, cm.predict(x))
    assert not TOLERANCES["quantized"].violations(f), f


def test_deeplob_sliding_window_answers_its_window(compiled) -> None:
    """One event a tick: each push answers what predict_into answers for the 100 events
    ending at it (zeros before the first), over more ticks than the window holds."""
    cm = compiled["cpu.native"]
    win = cm.sliding()
    events = _book(1, 21)[0]
    ticks = np.concatenate([events, _book(1, 22)[0][:8]])  # 108 events
    ring = np.zeros((100, 40, 1), np.float32)
    out, want = np.zeros(3, np.float32), np.zeros((1, 3), np.float32)
    for t, e in enumerate(ticks):
        win.push_into(e, out)
        ring = np.concatenate([ring[1:], e[None]])
        if t % 9 == 0 or t >= 98:
            cm.predict_into(ring[None], want)
            assert np.array_equal(out, want[0]), t
