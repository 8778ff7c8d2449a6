"""Models exported with a fixed batch compile and run on every ONNX target."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixed_batch_models import keras_batch1_onnx, run_original, torch_fixed_onnx

import hwbackends as hwb
from hwbackends.batchdim import FIXED_BATCH_MAX

TARGETS = ("cpu.onnxruntime", "tpu.xla", "ref")
pytest.importorskip("torch")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("fixed-batch")
    return {
        "torch4096": torch_fixed_onnx(d / "torch4096.onnx", 4096),
        "baked64": torch_fixed_onnx(d / "baked64.onnx", 64, reshape="baked"),
        "mixing64": torch_fixed_onnx(d / "mixing64.onnx", 64, reshape="mixing"),
    }


EXPECTED = {"torch4096": ("symbolic", 4096), "baked64": ("symbolic", 64), "mixing64": ("fixed", 64)}


def test_fixed_batch_is_detected_and_made_symbolic_where_the_graph_allows(files):
    m = hwb.load_model(files["baked64"])
    assert m.meta["batch"]["exported"] == 64 and m.meta["batch"]["handling"] == "symbolic"
    assert "Reshape" in m.meta["batch"]["detail"]  # names the rewritten node
    assert "fixed_batch" not in m.meta
    mix = hwb.load_model(files["mixing64"])
    assert mix.meta["fixed_batch"] == 64 and mix.meta["batch"]["handling"] == "fixed"
    assert "Reshape" in mix.meta["batch"]["detail"]
    x = np.random.default_rng(3).standard_normal((5, 4, 4)).astype(np.float32)
    for name in files:  # the reference (ref's and fidelity's) equals the file run as exported
        np.testing.assert_allclose(hwb.load_model(files[name]).reference(x),
                                   run_original(files[name], x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixed_batch_models_compile_with_defaults(files, store_dir, target, name):
    cm = hwb.compile(files[name], target, store=store_dir)
    handling, exported = EXPECTED[name]
    want_batch = exported if handling == "fixed" else 1
    assert cm.batch_size == want_batch
    meta = cm.describe()["meta"]["batch"]
    assert meta["handling"] == handling and meta["exported"] == exported and meta["how"]
    f = cm.fidelity
    assert f.corr > 0.99999 and f.max_abs < 1e-4, f
    x = np.random.default_rng(7).standard_normal((5, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(cm.predict(x), run_original(files[name], x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(cm.predict(x[0]), run_original(files[name], x[:1])[0],
                               rtol=1e-4, atol=1e-5)


def test_fixed_batch_other_than_the_model_s_is_refused_with_the_fix(files, store_dir):
    with pytest.raises(hwb.UnsupportedError, match="exported batch of 64.*batch_size=64.*dynamic_axes"):
        hwb.compile(files["mixing64"], "cpu.onnxruntime", batch_size=8, store=store_dir)


def test_huge_fixed_batch_is_refused_with_what_to_reexport(tmp_path, store_dir):
    big = FIXED_BATCH_MAX + 2
    path = torch_fixed_onnx(tmp_path / "huge.onnx", big, reshape="mixing")
    for target in TARGETS:
        with pytest.raises(hwb.UnsupportedError, match=f"fixed batch of {big}.*dynamic_axes"):
            hwb.compile(path, target, store=store_dir)


def test_cli_compiles_a_fixed_batch_model(files, store_dir):
    r = subprocess.run([sys.executable, "-m", "hwbackends", "compile", str(files["baked64"]),
                        "-t", "cpu.onnxruntime", "--json", "--cache-dir", str(store_dir)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["meta"]["batch"]["handling"] == "symbolic" and d["fidelity"]["corr"] > 0.99999


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_keras_tf2onnx_batch1_export(tmp_path_factory, store_dir, target):
    path = tmp_path_factory.getbasetemp() / "keras_b1.onnx"
    if not path.exists():
        keras_batch1_onnx(path)
    cm = hwb.compile(path, target, store=store_dir)
    assert cm.describe()["meta"]["batch"]["handling"] == "symbolic"
    assert cm.fidelity.kind == "probabilities" and cm.fidelity.corr > 0.99999
    x = np.random.default_rng(1).standard_normal((9, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(cm.predict(x), run_original(path, x), rtol=1e-4, atol=1e-5)
    if target == "cpu.onnxruntime":
        r = subprocess.run([sys.executable, "-m", "hwbackends", "compile", str(path), "-t", target,
                            "--json", "--cache-dir", str(store_dir)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
