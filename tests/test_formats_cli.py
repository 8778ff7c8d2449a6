"""Model files of every supported format, and the `hwb` CLI end to end."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import hwbackends as hwb

pytestmark = pytest.mark.slow


def test_keras_h5_and_keras_files_load_with_the_same_fingerprint(tmp_path: Path, zoo_model):
    km = zoo_model("mlp").obj
    km.save(tmp_path / "m.keras")
    km.save(tmp_path / "m.h5")
    a, b = hwb.load_model(tmp_path / "m.keras"), hwb.load_model(tmp_path / "m.h5")
    x = a.representative(3)
    np.testing.assert_allclose(a.reference(x), b.reference(x), atol=1e-6)
    assert a.fingerprint == zoo_model("mlp").fingerprint


def test_torch_export_and_torchscript_files(tmp_path: Path, store_dir: Path, zoo_model):
    import torch

    from hwbackends import zoo

    module = zoo.torch_lstm()
    ex = torch.zeros(2, 16, 8)
    dyn = ({0: torch.export.Dim("batch")},)
    torch.export.save(torch.export.export(module, (ex,), dynamic_shapes=dyn), tmp_path / "lstm.pt2")
    torch.export.save(torch.export.export(module, (ex,)), tmp_path / "static.pt2")
    with pytest.raises(hwb.UnsupportedError, match="exported batch of 2.*batch_size=2"):
        hwb.compile(tmp_path / "static.pt2", "cpu.onnxruntime", batch_size=1, store=store_dir)
    static = hwb.compile(tmp_path / "static.pt2", "cpu.onnxruntime", store=store_dir)
    assert static.batch_size == 2 and static.fidelity.corr > 0.99999
    torch.jit.trace(module, ex).save(str(tmp_path / "lstm.pt"))
    want = zoo_model("lstm")  # the Keras twin: same weights
    x = want.representative(8, seed=4)
    for f in ("lstm.pt2", "lstm.pt"):  # TorchScript carries no input spec: say it
        m = hwb.load_model(tmp_path / f, input_shape=(16, 8) if f.endswith(".pt") else None)
        assert m.format == "torch" and m.input.shape == (16, 8)
        cm = hwb.compile(m, "cpu.onnxruntime", "fp32", store=store_dir)
        np.testing.assert_allclose(cm.predict(x), want.reference(x), atol=2e-5)


# hwb's main() in this process (the conftest's hwb_cli), as a user's shell would run it but
# without a TensorFlow import per call (~6.5 s each in a subprocess); only output is checked.
def test_cli_compile_and_predict(tmp_path: Path, store_dir: Path, zoo_model, hwb_cli):
    rc, out, err = hwb_cli("compile", "zoo:signal", "-t", "cpu.litert", "-p", "int8", "--json",
                           "--cache-dir", str(store_dir))
    assert rc == 0, err[-2000:]
    d = json.loads(out)
    assert d["variant"] == "cpu.litert:int8" and d["mode"] == "hardware"
    assert d["fidelity"]["corr"] > 0.999
    x = zoo_model("signal").validation_data[:5]
    np.save(tmp_path / "x.npy", x)
    rc, out, err = hwb_cli("predict", "zoo:signal", "-t", "cpu.onnxruntime", "--input",
                           str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"),
                           "--cache-dir", str(store_dir))
    assert rc == 0, err[-2000:]
    y = np.load(tmp_path / "y.npy")
    np.testing.assert_allclose(y, zoo_model("signal").reference(x), atol=1e-5)
    assert "cpu.onnxruntime:fp32" in out


def test_cli_errors_are_one_clear_line(tmp_path: Path, store_dir: Path, hwb_cli):
    np.save(tmp_path / "bad.npy", np.zeros((2, 7), np.float32))
    rc, _, err = hwb_cli("predict", "zoo:signal", "--input", str(tmp_path / "bad.npy"),
                         "--cache-dir", str(store_dir))
    assert rc == 1 and "InputError" in err and "expected (32,)" in err
    rc, _, err = hwb_cli("compile", str(tmp_path / "none.keras"))
    assert rc == 1 and "model file not found" in err
    rc, _, err = hwb_cli("compile", "zoo:mlp", "-t", "cpu.litert", "-p", "int3")
    assert rc == 2 and "fp32, fp16, int8-dynamic, int8" in err  # a usage error (README's table)
    assert "Traceback" not in err
