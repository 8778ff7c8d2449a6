"""A differential fuzz of cpu.native's 2-D layers: random models of Conv2D (kernel, stride,
dilation, valid/same/explicit padding, groups), LeakyReLU, BatchNormalization, zero padding,
max/average pooling, inception blocks (a Concatenate of branches from one tensor) and a
Flatten/global-pool/LSTM head (tests/fuzz_conv2d.py) in Keras (channels-last), torch and ONNX
(channels-first inputs), each compared with its own framework:

* the IR reader: ``layer_ir.extract`` then the IR's float64 reference, max error ≤ 1e-5 of
  the output's scale;
* the generated C through ``hwb.compile`` (in-process build, fp32): the same bound;
* int8 within its gate (``TOLERANCES["quantized"]``) on fresh inputs whenever the compile's
  own fidelity check passed it (a variant that check refuses is counted as refused).

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


def _compile(m, precision: str, calibration=None, validation=None):
    with tempfile.TemporaryDirectory(prefix="hwb-fuzz2d-") as store:
        return hwb.compile(m, "cpu.native", precision, store=store, isolate_compile=False,
                           fidelity=validation is not None, calibration_data=calibration,
                           validation_data=validation)


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
