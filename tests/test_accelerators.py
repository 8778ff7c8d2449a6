"""Accelerator targets: tpu.xla (XLA CPU backend here), tpu.edgetpu (int8 CPU emulation here),
gpu.torch and gpu.tensorrt (run where CUDA exists, skip with the reason elsewhere)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.errors import InputError, UnavailableError, UnsupportedError
from hwbackends.specs import Mode

ZOO = ("mlp", "lstm", "conv1d", "signal", "mlp_torch", "lstm_torch")
REPO = Path(__file__).resolve().parents[1]


def _target(name: str):
    return hwb.get_registry().target(name)


def _need_source(name: str) -> None:
    """Keras zoo models need TensorFlow (and tf2onnx for the ONNX path); a GPU box may lack it."""
    from hwb_plugins._util import importable
    if not name.endswith("_torch") and not (importable("tensorflow") and importable("tf2onnx")):
        pytest.skip(f"zoo {name!r} is a Keras model and TensorFlow/tf2onnx are not installed")


def _need_usable(target: str) -> None:
    a = _target(target).probe()
    if not a.usable:
        pytest.skip(f"{target} unavailable: {a.reason}")


# -- tpu.xla ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_xla_every_zoo_model_end_to_end(compiled, zoo_model, name):
    _need_source(name)
    cm = compiled(name, "tpu.xla", "fp32")
    probe = _target("tpu.xla").probe()
    assert cm.mode is probe.mode
    if probe.mode is Mode.EMULATED:  # no TPU here: the device that ran it is named
        assert cm.availability.device.startswith("XLA:")
        assert "instead of a TPU" in cm.availability.reason
    f = cm.fidelity
    assert f is not None and f.n >= 256
    assert f.max_abs < 1e-4 and f.corr > 0.99999, f
    assert set(cm.artifact.meta["platforms"]) == {"cpu", "cuda", "tpu"}
    # the hot path on a batch of one agrees with the source framework
    x = zoo_model(name).representative(1, seed=5)
    out = np.zeros(cm.output.batched(1), np.float32)
    cm.predict_into(x, out)
    np.testing.assert_allclose(out, zoo_model(name).reference(x), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ("mlp", "lstm_torch"))
def test_xla_bf16_is_close_but_not_exact(compiled, name):
    _need_source(name)
    cm = compiled(name, "tpu.xla", "bf16")
    f = cm.fidelity
    assert cm.artifact.meta["compute_dtype"] == "bfloat16"
    assert f.corr > 0.999 and f.rel_err < 0.05, f
    assert f.max_abs > 1e-5  # really computed in bfloat16, not silently fp32


# That a second compile of tpu.xla's mlp fp32 is a cached load with identical outputs (and a
# corrupted file of it is rebuilt) is the kit's store_roundtrip (tests/test_conformance.py).


@pytest.mark.slow
def test_xla_bad_input_is_a_clear_error(compiled):
    _need_source("mlp")
    cm = compiled("mlp", "tpu.xla", "fp32")
    out = np.zeros((1, 3), np.float32)
    with pytest.raises(InputError, match="shape"):
        cm.predict_into(np.zeros((1, 63), np.float32), out)
    with pytest.raises(InputError, match="out has shape"):
        cm.predict_into(np.zeros((1, 64), np.float32), np.zeros((1, 4), np.float32))
    with pytest.raises(InputError, match="dtype"):  # JAX would cast it silently
        cm.predict_into(np.zeros((1, 64), np.float64), out)
    cm.predict_into(np.zeros((1, 64), np.float32), out)  # still serving


def _erf_model():
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Erf", ["input"], ["output"], name="the_erf")], "g",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return hwb.load_model(m, name="erf")


def test_xla_unsupported_op_is_named(store_dir):
    with pytest.raises(UnsupportedError, match=r"tpu\.xla.*Erf"):
        hwb.compile(_erf_model(), "tpu.xla", store=store_dir)


def test_xla_probe_never_claims_a_tpu_without_one():
    a = _target("tpu.xla").probe()
    from hwb_plugins.tpu_xla.target import predicted_platform
    plat, _ = predicted_platform()
    assert (a.mode is Mode.HARDWARE) == (plat == "tpu")
    if plat != "tpu":
        assert a.device == f"XLA:{plat}"


# -- tpu.edgetpu --------------------------------------------------------------------------------
def _edgetpu_absent() -> bool:
    import shutil

    from hwb_plugins.tpu_edgetpu.target import find_device
    return shutil.which("edgetpu_compiler") is None and find_device() is None


def test_edgetpu_reason_without_compiler_or_device():
    _need_usable("tpu.edgetpu")  # without TensorFlow it is unavailable for that reason instead
    if not _edgetpu_absent():
        pytest.skip("an Edge TPU compiler or device is present on this machine")
    a = _target("tpu.edgetpu").probe()
    assert a.mode is Mode.EMULATED
    assert a.reason == "edgetpu_compiler not on PATH; no Edge TPU device (/dev/apex_0 absent)"


@pytest.mark.slow
@pytest.mark.parametrize("name,corr,sign", [("mlp", 0.995, 0.99), ("lstm", 0.99, 0.95),
                                            ("signal", 0.995, 0.98)])
def test_edgetpu_int8_end_to_end(compiled, zoo_model, name, corr, sign):
    _need_usable("tpu.edgetpu")
    cm = compiled(name, "tpu.edgetpu", "int8")
    f = cm.fidelity
    assert f.corr > corr and f.sign_agree > sign, f
    assert f.max_abs > 1e-4  # really integer arithmetic
    meta = cm.artifact.meta
    assert "FULLY_CONNECTED" in meta["ops"]
    if cm.mode is Mode.EMULATED:
        assert cm.availability.device == "CPU LiteRT interpreter (int8)"
        if meta["edgetpu_file"] is None:
            assert "not on PATH" in meta["edgetpu_compiler"]
    else:  # a real Edge TPU: the compiler's log says what it mapped
        assert meta["edgetpu_mapping"].get("on_edgetpu", 0) > 0


@pytest.mark.slow
def test_edgetpu_int8_io(compiled, zoo_model, store_dir):
    _need_usable("tpu.edgetpu")
    cm = hwb.compile(zoo_model("signal"), "tpu.edgetpu", "int8", options={"int8_io": True},
                     store=store_dir)
    assert cm.executor.int8_io and cm.artifact.meta["int8_io"]
    ref = compiled("signal", "tpu.edgetpu", "int8")
    x = zoo_model("signal").representative(64, seed=9)
    a, b = cm.predict(x), ref.predict(x)
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.99
    assert cm.fidelity.corr > 0.99, cm.fidelity


def test_edgetpu_rejects_bad_option(store_dir, zoo_model):
    _need_usable("tpu.edgetpu")
    with pytest.raises(UnsupportedError, match="int8_io"):
        hwb.compile(zoo_model("signal"), "tpu.edgetpu", options={"int8_io": "yes"},
                    store=store_dir, isolate_compile=False)


# -- GPU targets --------------------------------------------------------------------------------
GPU_TARGETS = ("gpu.torch", "gpu.tensorrt")


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_gpu_targets_say_why_they_are_unavailable(target, zoo_model, store_dir):
    a = _target(target).probe()
    if a.usable:
        pytest.skip(f"{target} is available here ({a.device})")
    assert a.reason  # a person can act on it
    assert any(k in a.reason for k in ("GPU", "CUDA", "torch", "tensorrt", "cuda-python"))
    with pytest.raises(UnavailableError, match=target.replace(".", r"\.")):
        hwb.compile(zoo_model("mlp_torch"), target, store=store_dir)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ("mlp_torch", "lstm_torch"))
@pytest.mark.parametrize("precision", ("fp32", "fp16"))
def test_gpu_torch_end_to_end(compiled, zoo_model, name, precision):
    _need_usable("gpu.torch")
    cm = compiled(name, "gpu.torch", precision)
    assert cm.mode is Mode.HARDWARE
    assert cm.executor.graph is not None  # replayed as a CUDA graph
    f = cm.fidelity
    assert f.corr > (0.99999 if precision == "fp32" else 0.999), f
    x = zoo_model(name).representative(1, seed=4)
    out = np.zeros(cm.output.batched(1), np.float32)
    for _ in range(3):  # replays reuse the same buffers
        cm.predict_into(x, out)
    np.testing.assert_allclose(out, zoo_model(name).reference(x),
                               atol=1e-4 if precision == "fp32" else 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ("mlp", "lstm_torch"))
@pytest.mark.parametrize("precision", ("fp32", "fp16", "int8"))
def test_gpu_tensorrt_end_to_end(compiled, name, precision):
    _need_usable("gpu.tensorrt")
    _need_source(name)
    cm = compiled(name, "gpu.tensorrt", precision)
    assert cm.mode is Mode.HARDWARE
    assert cm.artifact.meta["bound_to"]["gpu"] == cm.toolchain["gpu"]
    lim = {"fp32": 0.99999, "fp16": 0.999, "int8": 0.98}[precision]
    assert cm.fidelity.corr > lim, cm.fidelity


def test_torch_executor_code_path_on_cpu(tmp_path, zoo_model):
    """The gpu.torch load path (torch.export artifact → module → fixed buffers → hot path) run
    on the CPU without torch.compile or a CUDA graph: checks the plumbing, measures nothing,
    and is not a GPU result (the target itself is unavailable without CUDA)."""
    import torch

    from hwb_plugins.gpu_torch.target import ARTIFACT, TorchCudaExecutor, static_program

    m = zoo_model("lstm_torch")
    torch.export.save(static_program(m.obj, m.input.batched(2)), tmp_path / ARTIFACT)
    ex = TorchCudaExecutor(tmp_path / ARTIFACT, 2, m.input, m.output, "fp32", mode="none",
                           cuda_graph=False, device="cpu")
    x = m.representative(2, seed=2)
    out = np.zeros(m.output.batched(2), np.float32)
    ex.predict_into(x, out)
    np.testing.assert_allclose(out, m.reference(x), atol=1e-6)
    with pytest.raises(InputError):
        ex.predict_into(x[:1], out)


# -- the GPU box may have no TensorFlow ---------------------------------------------------------
BLOCK_TF = textwrap.dedent("""
    import sys

    # Pretend TensorFlow is not installed, as on a GPU box with only torch and JAX. A None entry
    # in sys.modules is what "absent" looks like to both `import` (ModuleNotFoundError) and
    # importlib.util.find_spec (None), which torch's dynamo and our probes call.
    sys.modules["tensorflow"] = None

    class _NoTensorFlow:
        def find_spec(self, name, path=None, target=None):
            if name.startswith("tensorflow."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, _NoTensorFlow())
""")


@pytest.mark.slow
def test_core_and_accelerators_import_and_compile_without_tensorflow(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_TF)  # the compile worker inherits it too
    script = textwrap.dedent("""
        import sys
        import hwbackends as hwb
        from hwbackends import zoo
        import hwb_plugins.tpu_xla.target, hwb_plugins.gpu_torch.target
        import hwb_plugins.gpu_tensorrt.target, hwb_plugins.tpu_edgetpu.target
        targets = hwb.targets()
        assert "tpu.xla" in targets and "gpu.torch" in targets, sorted(targets)
        assert not targets["cpu.litert"].probe().usable  # it needs TensorFlow: says so
        cm = hwb.compile(zoo.get("mlp_torch"), "tpu.xla", "fp32", store=sys.argv[1])
        assert cm.fidelity.corr > 0.99999, cm.fidelity
        loaded = [k for k, v in sys.modules.items() if k.split(".")[0] in ("tensorflow", "keras") and v is not None]
        assert not loaded, loaded
        print("OK", cm.availability.device, cm.fidelity)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]),
               HWB_CACHE_DIR=str(tmp_path / "store"))
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "store")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
    probe = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr  # the blocker works


def test_tensorrt_engine_for_another_gpu_is_refused_not_loaded(tmp_path):
    """An engine records what it was built for; load refuses a mismatch before touching
    TensorRT (the core then evicts the artifact and rebuilds)."""
    from hwb_plugins.gpu_tensorrt.target import ENGINE, TensorRTTarget, current_binding
    from hwbackends.specs import TensorSpec
    from hwbackends.target import Artifact, CompileOptions

    (tmp_path / ENGINE).write_bytes(b"not an engine")
    other = dict(current_binding(), gpu="NVIDIA A100-SXM4-80GB", tensorrt="9.0.0")
    art = Artifact(tmp_path, "k", "gpu.tensorrt", "fp16", "fp", 1, [TensorSpec("input", (64,))],
                   [TensorSpec("output", (3,))], meta={"bound_to": other})
    with pytest.raises(UnavailableError, match="built for .*A100.*rebuilding"):
        TensorRTTarget().load(art, CompileOptions("fp16"))


def test_edgetpu_compiler_log_summary():
    from hwb_plugins.tpu_edgetpu.target import mapping_summary

    log = ("Edge TPU Compiler version 16.0.384591198\nModel compiled successfully in 41 ms.\n"
           "Number of Edge TPU subgraphs: 1\nTotal number of operations: 7\n"
           "Number of operations that will run on Edge TPU: 5\n"
           "Number of operations that will run on CPU: 2\n")
    assert mapping_summary(log) == {"on_edgetpu": 5, "on_cpu": 2}
    assert mapping_summary("") == {}


def _torch_mixed():
    """Conv1d + BatchNorm + pooling + GRU + bidirectional LSTM + clip: ops beyond the zoo."""
    import torch
    from torch import nn

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn, self.pool = nn.Conv1d(8, 12, 3, padding=1), nn.BatchNorm1d(12), nn.MaxPool1d(2)
            self.gru = nn.GRU(12, 16, batch_first=True)
            self.lstm = nn.LSTM(16, 8, batch_first=True, bidirectional=True)
            self.avg = nn.AvgPool1d(2, padding=1, count_include_pad=False)
            self.head = nn.Linear(16, 2)

        def forward(self, x):  # [b, 16 ticks, 8 features]
            y = self.pool(nn.functional.leaky_relu(self.bn(self.conv(x.transpose(1, 2)))))
            y, _ = self.gru(y.transpose(1, 2))
            y, _ = self.lstm(y)
            y = self.avg(y.transpose(1, 2)).mean(-1)
            return torch.sigmoid(self.head(y)).clamp(0.1, 0.9)

    torch.manual_seed(0)
    m = Mixed().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return hwb.load_model(m, name="mixed_torch", input_shape=(16, 8))


def _keras_rnn(kind: str):
    import keras

    layer = {"gru": keras.layers.GRU(16, return_sequences=True), "rnn": keras.layers.SimpleRNN(16)}[kind]
    layers = [keras.Input((16, 8)), layer] + ([keras.layers.SimpleRNN(8)] if kind == "gru" else [])
    km = keras.Sequential(layers + [keras.layers.Dense(1)], name=f"keras_{kind}")
    return hwb.load_model(km, name=f"keras_{kind}")


@pytest.mark.slow
@pytest.mark.parametrize("build", ["torch_mixed", "keras_gru", "keras_rnn"])
def test_xla_beyond_the_zoo(build, store_dir):
    """Keras GRU/SimpleRNN reach ONNX as a Loop (unrolled at trace time); torch's GRU,
    bidirectional LSTM, Conv1d, pooling, Clip map directly."""
    if build.startswith("keras"):
        _need_source("keras")
        model = _keras_rnn(build.split("_")[1])
    else:
        model = _torch_mixed()
    cm = hwb.compile(model, "tpu.xla", "fp32", store=store_dir)
    assert cm.fidelity.max_abs < 1e-5 and cm.fidelity.corr > 0.99999, cm.fidelity
