"""Calibrated (static) int8 for models with several inputs: ``cpu.onnxruntime`` (ORT
``quantize_static``, one dict per calibration batch keyed by input name) and ``cpu.litert``
(full-int8 TFLite, ``representative_dataset`` lists in the converter's input order), with the
real runtimes; the core passes calibration tuples and refuses targets that do not declare
``multi_io_calibrated``."""
from __future__ import annotations

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.config import FidelityConfig
from hwbackends.errors import InputError, UnsupportedError
from hwbackends.registry import build_registry
from hwbackends.target import Target

CALIBRATED = ("cpu.onnxruntime", "cpu.litert")
#: The int8 correlation gate of the single-IO zoo tests (tests/test_cpu_targets.py).
INT8_CORR = 0.995


def _int8_ops(cm) -> bool:
    ops = set(cm.artifact.meta["ops"])
    return bool(ops & {"QuantizeLinear", "QLinearMatMul", "MatMulInteger", "QUANTIZE"})


@pytest.mark.slow  # converts with TensorFlow and quantizes
@pytest.mark.parametrize("target", CALIBRATED)
def test_two_head_int8_with_the_default_calibration(target, compiled):
    """Default arguments: the core's calibration split (256 samples) reaches the plugin as a
    tuple; the graph is int8 and both outputs meet the int8 gate of the single-IO models."""
    cm = compiled("two_head", target, "int8", batch_size=4)
    assert cm.multi_io and _int8_ops(cm), cm.artifact.meta["ops"]
    f = cm.fidelity
    assert f.outputs is not None and set(f.outputs) == {"signal", "confidence"}
    assert f.corr >= INT8_CORR, str(f)
    assert f.outputs["confidence"].argmax_agree == 1.0 and f.outputs["signal"].sign_agree > 0.99


@pytest.mark.slow  # converts with TensorFlow and quantizes
@pytest.mark.parametrize("target", CALIBRATED)
def test_two_head_int8_passes_the_default_gate_with_1024_calibration_samples(target, two_head_cal,
                                                                            store_dir):
    """``calibration_data`` as a dict keyed by input name (ordered by the core): with 1024
    samples MinMax covers the validation tails and every output passes the default gate."""
    m, cal = two_head_cal
    cm = hwb.compile(m, target, "int8", calibration_data={"state": cal[1], "features": cal[0]},
                     store=store_dir)
    assert _int8_ops(cm)
    tol = FidelityConfig().tolerance()
    assert tol.passes(cm.fidelity), f"{target}: {cm.fidelity} ({tol.violations(cm.fidelity)})"


@pytest.fixture(scope="module")
def two_head_cal(zoo_model):
    m = zoo_model("two_head")
    return m, m.representative(1024, seed=5)


def _zeta_alpha():
    """Two same-shape inputs named so that sorting by name reverses them, with scales 400×
    apart: calibration fed in the wrong order quantizes ``zeta`` (σ 20) into ``alpha``'s range
    (σ 0.05) and the outputs collapse."""
    import keras

    rng = np.random.default_rng(3)
    zeta, alpha = keras.Input((4,), name="zeta"), keras.Input((4,), name="alpha")
    scaled = keras.layers.Concatenate()([keras.layers.Rescaling(0.05)(zeta),
                                         keras.layers.Rescaling(20.0)(alpha)])
    h = keras.layers.Dense(16, activation="relu")(scaled)
    out = [keras.layers.Dense(1, name="score")(h),
           keras.layers.Dense(1, activation="sigmoid", name="prob")(h)]
    km = keras.Model([zeta, alpha], out, name="zeta_alpha")
    km.set_weights([rng.normal(0, 0.5, w.shape).astype(np.float32) for w in km.get_weights()])
    n = 1536
    val = (rng.normal(0, 20, (n, 4)).astype(np.float32),
           rng.normal(0, 0.05, (n, 4)).astype(np.float32))
    return hwb.load_model(km, name="zeta_alpha", validation_data=val), val


@pytest.mark.slow  # converts with TensorFlow and quantizes
@pytest.mark.parametrize("target", CALIBRATED)
def test_calibration_reaches_each_input_by_name_not_position(target, store_dir):
    m, val = _zeta_alpha()
    assert [s.name for s in m.inputs] == ["zeta", "alpha"]
    cm = hwb.compile(m, target, "int8", store=store_dir)
    assert cm.fidelity.corr >= INT8_CORR, str(cm.fidelity)
    # The same build with the two calibration arrays swapped: the check above can fail.
    swapped = hwb.compile(m, target, "int8", calibration_data=(val[1][:768], val[0][:768]),
                          store=store_dir)
    assert swapped.fidelity.corr < 0.9, str(swapped.fidelity)


def test_wrong_calibration_tuple_is_an_input_error(zoo_model, store_dir):
    m = zoo_model("two_head")
    with pytest.raises(InputError, match="features, state"):
        hwb.compile(m, "cpu.onnxruntime", "int8", calibration_data=(np.zeros((8, 16), np.float32),),
                    store=store_dir)


class _OneTensorCalibration(Target):
    """A multi-IO target whose calibrated precision takes one tensor (the default)."""

    name = "cpu.hwbt_onecal"
    family = "cpu"
    precisions = ("fp32", "int8")
    calibrated = ("int8",)
    formats = ("keras",)
    description = "test target: multi-IO, single-tensor calibration"
    multi_io = True

    def probe(self):  # pragma: no cover - refused before
        raise AssertionError("the core must refuse before probing")


def test_targets_without_multi_io_calibration_refuse_before_building(zoo_model, store_dir):
    import types

    from hwbackends.hookspecs import hookimpl

    reg = build_registry()
    plugin = types.ModuleType("hwbt_onecal")
    plugin.hwb_targets = hookimpl(lambda: [_OneTensorCalibration()])
    reg.register(plugin, "hwbt_onecal")
    with pytest.raises(UnsupportedError) as e:
        hwb.compile(zoo_model("two_head"), "cpu.hwbt_onecal", "int8", store=store_dir, registry=reg)
    msg = str(e.value)
    assert "calibrates on one input tensor" in msg and "fp32" in msg
    for able in ("cpu.onnxruntime:int8", "cpu.litert:int8"):
        assert able in msg, msg


def test_conformance_kit_refuses_multi_io_calibrated_without_multi_io(tmp_path):
    import types

    from hwbackends.hookspecs import hookimpl
    from hwbackends.testing.check_target import check_metadata
    from hwbackends.testing.context import Conformance, ConformanceError

    class Inconsistent(_OneTensorCalibration):
        name = "cpu.hwbt_inconsistent"
        multi_io = False
        multi_io_calibrated = True

    reg = build_registry(entry_points=False)
    plugin = types.ModuleType("hwbt_inconsistent")
    plugin.hwb_targets = hookimpl(lambda: [Inconsistent()])
    reg.register(plugin, "hwbt_inconsistent")
    with pytest.raises(ConformanceError, match="multi_io_calibrated is True but multi_io is False"):
        check_metadata(Conformance("cpu.hwbt_inconsistent", tmp_path, registry=reg))


@pytest.mark.slow  # converts with TensorFlow and quantizes
@pytest.mark.parametrize("int8_io", [False, True])
def test_edgetpu_int8_with_several_inputs_runs_emulated(int8_io, zoo_model, store_dir):
    """tpu.edgetpu shares the multi-IO conversion: the full-int8 model (float or int8 IO
    tensors) runs on the CPU interpreter here, labelled emulated (no Edge TPU on this machine);
    with int8 IO the executor quantizes every input and dequantizes every output."""
    if "tpu.edgetpu" not in hwb.get_registry().targets:
        pytest.skip("tpu.edgetpu is not installed here")
    m = zoo_model("two_head")
    cm = hwb.compile(m, "tpu.edgetpu", "int8", batch_size=4, options={"int8_io": int8_io},
                     store=store_dir)
    if cm.mode.value == "hardware":
        pytest.skip("an Edge TPU is attached: this checks the emulated path")
    assert cm.mode.value == "emulated" and cm.multi_io
    assert cm.executor.int8_io is int8_io
    assert cm.fidelity.corr >= INT8_CORR, str(cm.fidelity)
    xs = m.representative(4, seed=2)
    outs = tuple(np.full(s.batched(4), np.nan, np.float32) for s in cm.outputs)
    cm.predict_into(xs, outs)
    for o, w in zip(outs, m.reference(xs), strict=True):
        np.testing.assert_allclose(o, w, atol=0.15)
