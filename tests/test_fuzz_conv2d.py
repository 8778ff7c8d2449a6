"""A differential fuzz of cpu.native's 2-D layers: random models of Conv2D (kernel, stride,
dilation, valid/same/explicit padding, groups), LeakyReLU, BatchNormalization, zero padding,
max/average pooling, inception blocks (a Concatenate of branches from one tensor) and a
Flatten/global-pool/LSTM head (tests/fuzz_conv2d.py) in Keras (channels-last), torch and ONNX
(channels-first inputs), each compared with its own framework:

* the IR reader: ``layer_ir.extract`` then the IR's float64 reference, max error ≤ 1e-5 of
  the output's scale;
* the generated C through ``hwb.compile`` (in-process build, fp32): the same bound;
* int8 within its gate (``TOLERANCES["quantized"]``) on fresh inputs whenever the compile's
  own fidelity check passed it (a variant that check refuses is counted as refused);
* Winograd (hwb_plugins/cpu_native/winograd.py): models whose conv is eligible and pays —
  a (r, 1) kernel, r 2..6, stride 1, ``c_in`` past the threshold, row counts that
  leave a partial last tile, 'same'/'valid'/explicit padding, at the native ISA and at
  x86-64-v3 (AVX2) — compiled with the default ``conv_algorithm``: the artifact must name
  the conv as Winograd's (so the direct path is never what is tested) and answer within
  the fp32 bound.

A refusal must be an ``UnsupportedError`` naming the layer or op; anything else fails. The
default run is a small fixed budget (derandomized); ``HWB_FUZZ_EXAMPLES=N`` (``make fuzz``)
draws N models per IR test, N/4 per fp32 C test and N/10 per int8 one, fresh each run;
``HWB_FUZZ_REPORT`` names a JSON file for the counts (``make fuzz``: fuzz_conv2d.json).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fuzz_conv2d import FRONTENDS, Spec2D, build, load, reference, specs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hwbackends as hwb
from hwbackends.errors import FidelityGateError, UnsupportedError
from hwbackends.fidelity import TOLERANCES, compare

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

EXAMPLES = int(os.environ.get("HWB_FUZZ_EXAMPLES", "0") or 0)
LONG = EXAMPLES > 0
FP32_BOUND = 1e-5
COUNTS: Counter = Counter()


def _settings(n_default: int, share: int) -> settings:
    return settings(max_examples=max(EXAMPLES // share, 1) if LONG else n_default, deadline=None,
                    derandomize=not LONG, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def _tally(key: str) -> None:
    COUNTS[key] += 1
    path = os.environ.get("HWB_FUZZ_REPORT")
    if path:
        Path(path).write_text(json.dumps(dict(sorted(COUNTS.items())), indent=1) + "\n")


def _frontend(fe: str) -> None:
    if fe == "keras":
        pytest.importorskip("keras")
    else:
        pytest.importorskip("torch")
    if fe == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")


def _inputs(spec: Spec2D, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *spec.input_shape)).astype(np.float32)


def _scale(want: np.ndarray) -> float:
    return max(float(np.abs(want).max()), 1e-3)


def _refused(spec: Spec2D, exc: UnsupportedError, what: str) -> None:
    msg = str(exc)
    assert "cpu.native" in msg and re.search(r"'[^']+'", msg), f"{spec.describe()}: unnamed refusal: {msg}"
    named = re.search(r"\(op ([^)]+)\)|layer '[^']*' \((\w+)\)", msg)
    _tally(f"{what} refused: {(named.group(1) or named.group(2)) if named else msg[:60]}")


def _check_ir(spec: Spec2D) -> None:
    from hwbackends import layer_ir

    obj = build(spec)
    _tally(f"{spec.frontend} ir tried")
    try:
        net = layer_ir.extract(load(obj, spec), "cpu.native")
    except UnsupportedError as exc:
        _refused(spec, exc, f"{spec.frontend} ir")
        return
    x = _inputs(spec, 16, spec.seed)
    want = reference(obj, spec, x)
    err = float(np.abs(layer_ir.forward(net, x)[-1] - want).max()) / _scale(want)
    assert err <= FP32_BOUND, f"{spec.describe()}: IR reference off by {err:.3g} of the output scale"
    _tally(f"{spec.frontend} ir right")


def _compile(m, precision: str, calibration=None, validation=None, options=None):
    with tempfile.TemporaryDirectory(prefix="hwb-fuzz2d-") as store:
        return hwb.compile(m, "cpu.native", precision, store=store, isolate_compile=False,
                           fidelity=validation is not None, calibration_data=calibration,
                           validation_data=validation, options=options)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_ir_reader_matches_the_framework(frontend: str) -> None:
    _frontend(frontend)

    @_settings(10, 1)
    @given(specs(frontend))
    def check(spec: Spec2D) -> None:
        _check_ir(spec)

    check()


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_generated_c_fp32_matches_the_framework(frontend: str) -> None:
    _frontend(frontend)

    @_settings(4, 4)
    @given(specs(frontend))
    def check(spec: Spec2D) -> None:
        obj = build(spec)
        _tally(f"{frontend} fp32 tried")
        try:
            cm = _compile(load(obj, spec), "fp32")
        except UnsupportedError as exc:
            _refused(spec, exc, f"{frontend} fp32")
            return
        x = _inputs(spec, 32, spec.seed + 1)
        want = reference(obj, spec, x)
        err = float(np.abs(cm.predict(x) - want).max()) / _scale(want)
        assert err <= FP32_BOUND, f"{spec.describe()}: C off by {err:.3g} of the output scale"
        _tally(f"{frontend} fp32 right")

    check()


@_settings(2, 10)
@given(specs("keras"))
def test_generated_c_int8_within_its_gate(spec: Spec2D) -> None:
    _frontend("keras")
    obj = build(spec)
    _tally("int8 tried")
    try:
        cm = _compile(load(obj, spec), "int8", _inputs(spec, 128, spec.seed + 2),
                      validation=_inputs(spec, 128, spec.seed + 4))
    except UnsupportedError as exc:
        _refused(spec, exc, "int8")
        return
    except FidelityGateError as exc:  # the compile's own gate refused it: nobody is served it
        assert exc.violations, exc
        _tally("int8 refused by its fidelity gate")
        return
    x = _inputs(spec, 128, spec.seed + 3)
    want, got = reference(obj, spec, x), cm.predict(x)
    if float(want.std()) < 0.02 * _scale(want):  # near-constant: judged by its error bound
        err = float(np.abs(got - want).max()) / _scale(want)
        assert err <= 0.05, f"{spec.describe()}: int8 off by {err:.3g} of the output scale"
        _tally("int8 right (near-constant output)")
        return
    bad = TOLERANCES["quantized"].violations(compare(want, got))
    assert not bad, f"{spec.describe()}: int8 {bad}"
    _tally("int8 right")


#: The largest error of a Winograd draw relative to its output's scale (printed with -s).
WINO_MAX = [0.0]


@st.composite
def winograd_specs(draw, fe: str) -> tuple[Spec2D, str]:
    """One conv that ``conv_algorithm=auto`` computes by Winograd (a (r, 1) kernel, stride 1,
    c_in >= winograd.MIN_IN_CHANNELS), odd row counts so the last tile is partial,
    maybe a BatchNormalization or LeakyReLU around it; and the ISA to build for."""
    from hwb_plugins.cpu_native import winograd

    r = draw(st.integers(2, 6))
    ci, co = draw(st.integers(winograd.MIN_IN_CHANNELS, 40)), draw(st.integers(1, 40))
    pad = draw(st.sampled_from(["same", "valid"] if fe == "keras" else ["valid", 1, 2]))
    p = 0 if pad == "valid" else None
    rows = 2 * draw(st.integers(winograd.ROWS[r] // 2 + r, 12)) + 1
    cols = draw(st.integers(1, 3))
    oh = rows if p is None else rows + 2 * (0 if pad == "valid" else pad) - r + 1
    assert oh >= winograd.ROWS[r]
    act = draw(st.sampled_from(["linear", "relu"]))
    layers: list[tuple] = [("conv", co, (r, 1), (1, 1), (1, 1), pad, 1, act)]
    if draw(st.booleans()):
        layers.insert(0, ("bn",))
    if act == "linear" and draw(st.booleans()):
        layers.append(("lrelu", draw(st.sampled_from([0.01, 0.2]))))
    head = (draw(st.sampled_from(["flatten", "gpool"])), "avg", draw(st.integers(1, 4)))
    isa = draw(st.sampled_from(["native", "x86-64-v3"]))
    return Spec2D(fe, (rows, cols, ci), tuple(layers), head, draw(st.integers(0, 2 ** 16))), isa


@pytest.mark.parametrize("frontend", ["keras", "torch"])
def test_winograd_convs_match_the_framework(frontend: str) -> None:
    _frontend(frontend)
    from hwb_plugins.cpu_native import build as native_build

    @_settings(3, 4)
    @given(winograd_specs(frontend))
    def check(drawn: tuple[Spec2D, str]) -> None:
        spec, isa = drawn
        if isa != "native" and native_build.arch() != "x86_64":
            isa = "native"
        obj = build(spec)
        cm = _compile(load(obj, spec), "fp32", options={"isa": isa})
        taken = cm.describe()["meta"]["winograd"]
        r = spec.layers[-1 if spec.layers[-1][0] == "conv" else -2][2][0]
        assert [w["kernel"] for w in taken] == [[r, 1]], f"{spec.describe()}: Winograd not taken: {taken}"
        x = _inputs(spec, 32, spec.seed + 5)
        want = reference(obj, spec, x)
        err = float(np.abs(cm.predict(x) - want).max()) / _scale(want)
        WINO_MAX[0] = max(WINO_MAX[0], err)
        assert err <= FP32_BOUND, f"{spec.describe()} isa={isa}: Winograd off by {err:.3g} of the output scale"
        _tally(f"{frontend} winograd right")

    check()
    print(f"winograd {frontend}: max error {WINO_MAX[0]:.3g} of the output scale")


def test_conv_algorithm_option_is_checked() -> None:
    """A value the option does not take, and Winograd asked of int8, are refused by name
    before anything is built; ``direct`` keeps every conv direct."""
    _frontend("keras")
    spec = Spec2D("keras", (9, 1, 16), (("conv", 16, (3, 1), (1, 1), (1, 1), "same", 1, "linear"),),
                  ("flatten", "avg", 2))
    m = load(build(spec), spec)
    with pytest.raises(UnsupportedError, match=r"conv_algorithm='fast'.*auto, direct, winograd"):
        _compile(m, "fp32", options={"conv_algorithm": "fast"})
    with pytest.raises(UnsupportedError, match=r"conv_algorithm='winograd'.*'fp32'.*int8"):
        _compile(m, "int8", _inputs(spec, 16, 0), options={"conv_algorithm": "winograd"})
    direct = _compile(m, "fp32", options={"conv_algorithm": "direct"})
    wino = _compile(m, "fp32", options={"conv_algorithm": "winograd"})
    assert direct.artifact.meta["winograd"] == [] and len(wino.artifact.meta["winograd"]) == 1
    x = _inputs(spec, 8, 1)
    assert float(np.abs(direct.predict(x) - wino.predict(x)).max()) <= FP32_BOUND * _scale(direct.predict(x))


def test_winograd_in_a_model_with_two_inputs() -> None:
    """A Winograd conv in one input's chain of a two-input, two-output Keras model (the
    generated names of such a model, x0/x1 and y0/y1, beside Winograd's own)."""
    keras = pytest.importorskip("keras")
    L = keras.layers
    a, b = keras.Input((11, 2, 16)), keras.Input((5,))
    y = L.Flatten()(L.LeakyReLU(negative_slope=0.01)(L.Conv2D(20, (3, 1), padding="same")(a)))
    z = L.Concatenate()([y, L.Dense(4)(b)])
    km = keras.Model([a, b], [L.Dense(3)(z), L.Dense(2)(z)])
    cm = _compile(hwb.load_model(km), "fp32")
    assert [w["kernel"] for w in cm.artifact.meta["winograd"]] == [[3, 1]]
    rng = np.random.default_rng(3)
    xs = (rng.standard_normal((8, 11, 2, 16)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32))
    for got, want in zip(cm.predict(xs), km(list(xs)), strict=True):
        want = np.asarray(want, np.float64)
        assert float(np.abs(got - want).max()) <= FP32_BOUND * _scale(want)
