"""``hwb.compile`` never hands out a variant that fails its precision's fidelity gate: it raises
:class:`hwbackends.FidelityGateError` carrying the figures and the variant, unless the caller
asks for ungated variants with ``gate=False``. The check is the one ``hwb compile`` exits 3 on
(:func:`hwbackends.compiler.fidelity_gate`)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.cli import main
from hwbackends.compiler import fidelity_gate

pytest.importorskip("onnxruntime")


def _skewed_data(rng: np.random.Generator, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Calibration a thousand times smaller than validation: ONNX Runtime's static int8
    scales then clip almost every validation input, so the variant is built but fails the
    quantized gate."""
    tiny = (rng.standard_normal((64, d)) * 1e-3).astype(np.float32)
    val = (rng.standard_normal((128, d)) * 3).astype(np.float32)
    return tiny, val


def test_a_failed_gate_raises_with_the_figures_and_the_variant(zoo_model, tmp_path) -> None:
    m = zoo_model("mlp")
    tiny, val = _skewed_data(np.random.default_rng(1), m.inputs[0].shape[-1])
    with pytest.raises(hwb.FidelityGateError) as info:
        hwb.compile(m, "cpu.onnxruntime", "int8", calibration_data=tiny, validation_data=val,
                    store=tmp_path, isolate_compile=False)
    err = info.value
    assert isinstance(err, hwb.HwbError) and err.family == "quantized"
    assert err.fidelity is err.variant.fidelity and err.fidelity.corr < 0.98
    assert any(v.startswith("corr") for v in err.violations), err.violations
    assert f"corr {err.fidelity.corr:.6f} < 0.98" in str(err) and "gate=False" in str(err)
    assert err.variant.variant == "cpu.onnxruntime:int8"  # loaded, for inspection
    assert err.variant.predict(val[:2]).shape[0] == 2

    # the caller who asks for ungated variants gets the same one (from the store), figures on it
    cm = hwb.compile(m, "cpu.onnxruntime", "int8", calibration_data=tiny, validation_data=val,
                     store=tmp_path, isolate_compile=False, gate=False)
    assert cm.artifact.cached and cm.fidelity.corr == err.fidelity.corr
    assert fidelity_gate(cm) == {"passed": False, "family": "quantized", "violations": err.violations}
    # nothing measured, nothing gated
    assert hwb.compile(m, "cpu.onnxruntime", "int8", calibration_data=tiny, store=tmp_path,
                       isolate_compile=False, fidelity=False).fidelity is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
def test_a_passing_variant_is_returned(zoo_model, tmp_path) -> None:
    cm = hwb.compile(zoo_model("mlp"), "cpu.native", "fp32", store=tmp_path, isolate_compile=False)
    assert fidelity_gate(cm)["passed"] and cm.fidelity.corr > 0.99999


def test_hwb_compile_still_prints_the_failed_gate_and_exits_3(zoo_model, tmp_path, capsys) -> None:
    """The command takes the variant ungated and says why it failed (exit 3), one check."""
    m = zoo_model("mlp")
    tiny, val = _skewed_data(np.random.default_rng(1), m.inputs[0].shape[-1])
    np.save(tmp_path / "tiny.npy", tiny)
    np.save(tmp_path / "val.npy", val)
    rc = main(["compile", "zoo:mlp", "-t", "cpu.onnxruntime", "-p", "int8", "--calibration-data",
               str(tmp_path / "tiny.npy"), "--validation-data", str(tmp_path / "val.npy"),
               "--cache-dir", str(tmp_path / "store")])
    out = capsys.readouterr().out
    assert rc == 3 and "! FIDELITY GATE FAILED (quantized precision): corr" in out, out
