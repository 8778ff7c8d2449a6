"""The CPU desk install, ``pip install '.[cpu]'``: no TensorFlow, torch, JAX, Ray or hls4ml,
and an ONNX model still compiles, predicts, benches and compares through ``hwb`` on
cpu.onnxruntime and cpu.native. ``.ci/run`` runs this module (and the other ``cpu_install``
tests) in a fresh venv of that install; here it runs in the full one too."""
from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hwbackends.cli import main

pytestmark = pytest.mark.cpu_install

HWB = str(Path(sys.executable).with_name("hwb"))


def _mlp_onnx(path: Path) -> Path:
    """A 16 -> 8 -> 2 MLP (Gemm, Relu, Gemm, Tanh) written with onnx.helper: no framework."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(0)
    w1, b1 = rng.standard_normal((16, 8)).astype(np.float32) * 0.3, np.zeros(8, np.float32)
    w2, b2 = rng.standard_normal((8, 2)).astype(np.float32) * 0.3, np.full(2, 0.1, np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))]
    nodes = [helper.make_node("Gemm", ["features", "w1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("Gemm", ["hr", "w2", "b2"], ["z"]),
             helper.make_node("Tanh", ["z"], ["signal"])]
    g = helper.make_graph(nodes, "desk_mlp",
                          [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["n", 16])],
                          [helper.make_tensor_value_info("signal", TensorProto.FLOAT, ["n", 2])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    save(m, str(path))
    return path


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory) -> Path:
    return _mlp_onnx(tmp_path_factory.mktemp("desk") / "desk_mlp.onnx")


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "store"


def test_the_cpu_install_holds_no_heavy_framework():
    """Meaningful in the `.[cpu]` venv (.ci/run); in the full venv the frameworks are there."""
    if os.environ.get("HWB_CPU_INSTALL") != "1":
        pytest.skip("HWB_CPU_INSTALL=1 only in the .[cpu] venv of .ci/run")
    for mod in ("tensorflow", "keras", "torch", "jax", "ray", "hls4ml"):
        assert importlib.util.find_spec(mod) is None, f"{mod} is installed by .[cpu]"


@pytest.mark.parametrize("target", ["cpu.onnxruntime", "cpu.native"])
def test_compile_and_predict_an_onnx_model(hwb_cli, onnx_model: Path, tmp_path: Path, cache: Path,
                                           target: str):
    rc, out, err = hwb_cli("compile", str(onnx_model), "-t", target, "--cache-dir", str(cache), "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["variant"] == f"{target}:fp32" and d["mode"] == "hardware"
    assert d["fidelity_gate"]["passed"] is True
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    rc, out, err = hwb_cli("predict", str(onnx_model), "-t", target, "-i", str(tmp_path / "x.npy"),
                           "-o", str(tmp_path / "y.npy"), "--cache-dir", str(cache))
    assert rc == 0, err
    y = np.load(tmp_path / "y.npy")
    assert y.shape == (3, 2) and np.all(np.abs(y) <= 1)


def test_bench_csv_and_compare_without_frameworks(onnx_model: Path, tmp_path: Path, cache: Path):
    """The installed ``hwb`` (a subprocess, as CI runs it): bench two targets, CSV, compare."""
    env = os.environ | {"HWB_CACHE_DIR": str(cache)}
    base = tmp_path / "base.json"
    r = subprocess.run([HWB, "bench", str(onnx_model), "-t", "cpu.onnxruntime,cpu.native", "-p", "fp32",
                        "--n", "200", "-o", str(base), "--csv"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert sorted(row["variant"] for row in rows) == ["cpu.native:fp32", "cpu.onnxruntime:fp32"]
    assert all(float(row["p95_us"]) <= float(row["p99_us"]) for row in rows)
    r = subprocess.run([HWB, "compare", str(base), str(base), "--max-p99", "1", "--max-corr-drop", "0"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all 2 row(s) within the thresholds" in r.stdout


def test_the_report_without_frameworks(onnx_model: Path, tmp_path: Path, cache: Path, capsys):
    out = tmp_path / "r.json"
    assert main(["bench", str(onnx_model), "-t", "cpu.onnxruntime", "-p", "fp32", "--n", "100", "-q",
                 "-o", str(out), "--report", str(tmp_path / "r.html"), "--cache-dir", str(cache)]) == 0
    capsys.readouterr()
    html = (tmp_path / "r.html").read_text()
    assert "desk_mlp" in html and "<svg" in html and "cpu.onnxruntime:fp32" in html


def test_a_zoo_model_says_which_extra_it_needs(hwb_cli, cache: Path):
    if os.environ.get("HWB_CPU_INSTALL") != "1":
        pytest.skip("HWB_CPU_INSTALL=1 only in the .[cpu] venv of .ci/run (Keras is here)")
    rc, _, err = hwb_cli("compile", "zoo:lstm", "-t", "cpu.native", "--cache-dir", str(cache))
    assert rc == 1 and "Traceback" not in err
    assert "zoo:lstm is built with keras" in err and "pip install 'hwbackends[keras]'" in err


@pytest.mark.parametrize("target", ["cpu.native", "cpu.onnxruntime"])
def test_zoo_mlp_runs_on_every_install(hwb_cli, cache: Path, target: str):
    """zoo:mlp is Keras where Keras is installed, else its ONNX twin (same seeded weights)."""
    rc, out, err = hwb_cli("compile", "zoo:mlp", "-t", target, "--cache-dir", str(cache), "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["fidelity_gate"]["passed"] is True
    from hwbackends.models import load_model

    want = "onnx" if importlib.util.find_spec("keras") is None else "keras"
    assert load_model("zoo:mlp").format == want


def test_the_onnx_mlp_is_the_keras_mlp():
    pytest.importorskip("keras")
    from hwbackends import zoo
    from hwbackends.models import load_model

    k, o = load_model(zoo.keras_mlp(), name="mlp"), load_model(zoo.onnx_mlp(), name="mlp")
    x = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    np.testing.assert_allclose(o.reference(x), k.reference(x), atol=1e-6)
