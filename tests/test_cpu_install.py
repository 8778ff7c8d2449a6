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
import textwrap
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


def test_a_torch_zoo_model_says_which_extra_it_needs(hwb_cli, cache: Path):
    if os.environ.get("HWB_CPU_INSTALL") != "1":
        pytest.skip("HWB_CPU_INSTALL=1 only in the .[cpu] venv of .ci/run (torch is here)")
    rc, _, err = hwb_cli("compile", "zoo:lstm_torch", "-t", "cpu.native", "--cache-dir", str(cache))
    assert rc == 1 and "Traceback" not in err
    assert "zoo:lstm_torch is built with torch" in err and "pip install 'hwbackends[torch]'" in err


@pytest.mark.parametrize("target", ["cpu.native", "cpu.onnxruntime"])
def test_zoo_mlp_runs_on_every_install(hwb_cli, cache: Path, target: str):
    """zoo:mlp is Keras where Keras is installed, else its ONNX twin (same seeded weights)."""
    rc, out, err = hwb_cli("compile", "zoo:mlp", "-t", target, "--cache-dir", str(cache), "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["fidelity_gate"]["passed"] is True
    from hwbackends import zoo
    from hwbackends.models import load_model

    want = "keras" if zoo.keras_available() else "onnx"
    assert load_model("zoo:mlp").format == want


# -- the bundled zoo without Keras: the ONNX twins (hwbackends.zoo_onnx) --------------------------
#: Run first in a process (a sitecustomize on PYTHONPATH, so the compile worker gets it too):
#: Keras and TensorFlow look not installed, to ``import`` and to importlib.util.find_spec alike.
BLOCK_KERAS = textwrap.dedent("""
    import sys

    _REFUSED = ("keras", "tensorflow", "tf_keras")
    for _name in _REFUSED:
        sys.modules[_name] = None  # None: "absent" to import and find_spec

    class _NoKeras:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in _REFUSED:
                raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)", name=name)
            return None

    sys.meta_path.insert(0, _NoKeras())
""")


@pytest.fixture(scope="module")
def no_keras(tmp_path_factory) -> dict[str, str]:
    """The environment of an ``hwb`` without Keras: in the `.[cpu]` venv as it is; in the full
    venv with :data:`BLOCK_KERAS` first on PYTHONPATH. Checked, not assumed."""
    env = dict(os.environ)
    if importlib.util.find_spec("keras") is not None:
        site = tmp_path_factory.mktemp("no-keras-site")
        (site / "sitecustomize.py").write_text(BLOCK_KERAS)
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    r = subprocess.run([sys.executable, "-c", "import importlib.util, sys\n"
                        "from hwbackends import zoo\n"
                        "assert not zoo.keras_available() and importlib.util.find_spec('tensorflow') is None\n"
                        "try:\n    import keras\nexcept ImportError:\n    sys.exit(0)\nsys.exit(1)"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"Keras is still importable: {r.stderr}"
    return env


def _hwb_json(env: dict[str, str], *args: str) -> dict:
    r = subprocess.run([HWB, *args, "--json"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("target", ["cpu.native", "cpu.onnxruntime"])
@pytest.mark.parametrize("name", ["lstm", "conv1d", "signal"])
def test_the_keras_zoo_compiles_without_keras(no_keras, tmp_path: Path, name: str, target: str):
    """``hwb compile zoo:NAME`` where Keras is not installed: the ONNX twin is built, compiled
    and passes the fidelity gate; it is the twin (its fingerprint), and the signal is the
    NumPy-trained one, kept signed in the zoo directory, validated on its bundled data."""
    from hwbackends import zoo
    from hwbackends.models import load_model

    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    env = no_keras | {"HWB_CACHE_DIR": str(store)}  # the zoo directory is the store's
    d = _hwb_json(env, "compile", f"zoo:{name}", "-t", target)
    assert d["variant"] == f"{target}:fp32" and d["mode"] == "hardware"
    assert d["fidelity_gate"]["passed"] is True, d["fidelity_gate"]
    assert d["fidelity"]["corr"] > 0.9999, d["fidelity"]
    twin = {"lstm": zoo.onnx_lstm, "conv1d": zoo.onnx_conv1d, "signal": zoo.numpy_signal}[name]
    assert d["fingerprint"] == load_model(twin(), name=name).fingerprint
    if name == "signal":
        assert (store / "zoo" / f"signal-{zoo.SIGNAL_VERSION}-numpy.onnx").is_file()
        assert d["data"]["validation"]["kind"] == "model", d["data"]
        # a second compile: from the store, the model from its memo (keyed by that file)
        again = _hwb_json(env, "compile", f"zoo:{name}", "-t", target)
        assert again["cached"] is True and again["fingerprint"] == d["fingerprint"]


def test_the_multi_io_and_stac_zoo_without_keras(no_keras, tmp_path: Path):
    """two_head (two inputs, two outputs: the multi_io targets) and lstm_a, as ONNX twins."""
    store = str(tmp_path / "store")
    d = _hwb_json(no_keras, "compile", "zoo:two_head", "-t", "cpu.onnxruntime", "--cache-dir", store)
    assert d["fidelity_gate"]["passed"] is True and [o["name"] for o in d["outputs"]] == [
        "signal", "confidence"], d["outputs"]
    d = _hwb_json(no_keras, "compile", "zoo:lstm_a", "-t", "cpu.native", "--cache-dir", store)
    assert d["fidelity_gate"]["passed"] is True and d["fidelity"]["corr"] > 0.9999


def test_the_onnx_mlp_is_the_keras_mlp():
    pytest.importorskip("keras")
    from hwbackends import zoo
    from hwbackends.models import load_model

    k, o = load_model(zoo.keras_mlp(), name="mlp"), load_model(zoo.onnx_mlp(), name="mlp")
    x = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    np.testing.assert_allclose(o.reference(x), k.reference(x), atol=1e-6)
