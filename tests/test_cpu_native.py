"""cpu.native: generated C from the shared layer IR, entered through a per-artifact
CPython FASTCALL function, exported as a C library. Compared against the real Keras model,
not a mock; the conformance kit itself runs in tests/test_conformance.py (mlp) and with
``pytest --hwb-target cpu.native`` (every zoo model)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.errors import InputError, UnavailableError, UnsupportedError
from hwbackends.registry import get_registry
from hwbackends.target import check_io

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
ROOT = Path(__file__).resolve().parents[1]


def _keras_models():
    """Small models over every layer kind the IR takes that the zoo lacks (seeded)."""
    import keras

    keras.utils.set_random_seed(5)
    gru = keras.Sequential([
        keras.Input((12, 5), name="window"),
        keras.layers.GRU(10, return_sequences=True, name="gru_a"),
        keras.layers.GRU(6, reset_after=False, name="gru_b"),
        keras.layers.BatchNormalization(name="bn_free"),   # after a GRU: an affine layer
        keras.layers.LeakyReLU(name="leaky"),
        keras.layers.Dense(3, activation="softmax", name="probs"),
    ], name="native_gru")
    conv = keras.Sequential([
        keras.Input((20, 4), name="window"),
        keras.layers.Conv1D(9, 3, padding="same", dilation_rate=2, name="conv_same"),
        keras.layers.BatchNormalization(name="bn_folded"),  # folds into the conv
        keras.layers.Activation("tanh", name="tanh"),
        keras.layers.MaxPooling1D(2, name="maxpool"),
        keras.layers.Conv1D(5, 2, padding="causal", strides=2, activation="relu", name="conv_causal"),
        keras.layers.AveragePooling1D(2, 1, name="avgpool"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(2, activation="sigmoid", name="out"),
    ], name="native_conv")
    lstm = keras.Sequential([
        keras.Input((6, 3), name="window"),
        keras.layers.LSTM(9, return_sequences=True, name="lstm_seq"),
        keras.layers.GlobalMaxPooling1D(name="gmax"),
        keras.layers.Dense(1, name="signal"),
    ], name="native_lstm_seq")
    for m in (gru, conv):  # non-trivial batch-norm statistics
        for layer in m.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                n = layer.get_weights()[0].shape[0]
                rng = np.random.default_rng(1)
                layer.set_weights([rng.uniform(0.5, 1.5, n), rng.normal(0, 0.3, n),
                                   rng.normal(0, 0.3, n), rng.uniform(0.5, 2.0, n)])
    return [gru, conv, lstm]


@pytest.fixture(scope="module")
def layer_models():
    return _keras_models()


def test_registered_with_its_contract() -> None:
    t = get_registry().target("cpu.native")
    assert t.exports == ("c",) and "keras" in t.formats
    tc = t.toolchain()
    assert tc["isa"] == hwb.machine.isa() and tc["cc"] and tc["python_abi"]


@pytest.mark.parametrize("idx", [0, 1, 2], ids=["gru+bn+leaky+softmax", "conv-same/causal+pools", "lstm-seq+gmax"])
def test_every_layer_kind_matches_keras(layer_models, store_dir, idx) -> None:
    km = layer_models[idx]
    cm = hwb.compile(km, "cpu.native", store=store_dir, fidelity=False)
    x = np.random.default_rng(idx).standard_normal((64, *cm.input.shape)).astype(np.float32)
    want = km(x).numpy()
    got = cm.predict(x)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)


def test_int8_over_every_layer_kind(layer_models, store_dir) -> None:
    """int8 of the padded/strided convolutions (input quantised once, windows read in
    place), pooling, GRU and LSTM-sequence models: correlated with Keras."""
    for km in layer_models:
        x = np.random.default_rng(2).standard_normal((256, *km.inputs[0].shape[1:])).astype(np.float32)
        cm = hwb.compile(km, "cpu.native", "int8", store=store_dir, fidelity=False,
                         calibration_data=x[:128])
        want, got = km(x[128:]).numpy().ravel(), cm.predict(x[128:]).ravel()
        assert np.corrcoef(want, got)[0, 1] > 0.99, km.name


def test_ir_reference_is_the_keras_function(layer_models) -> None:
    """The IR's float64 NumPy reference (int8 calibration uses it) equals Keras."""
    from hwbackends import layer_ir

    for km in layer_models:
        m = hwb.load_model(km)
        net = layer_ir.extract(m, "test")
        x = np.random.default_rng(3).standard_normal((16, *m.input.shape)).astype(np.float32)
        np.testing.assert_allclose(layer_ir.forward(net, x)[-1], km(x).numpy(), atol=1e-5)


def test_zoo_fp32_fidelity_and_the_c_entry(compiled) -> None:
    for name in ("signal", "mlp", "conv1d", "lstm"):
        cm = compiled(name, "cpu.native")
        assert cm.fidelity.corr >= 0.99999 and cm.fidelity.rel_err <= 1e-5, (name, cm.fidelity)
        # matmuls are explicit vector code; the element-wise loops (relu, the LSTM's gates)
        # were vectorised by the compiler (-fopt-info-vec)
        assert cm.artifact.meta["vector_matvecs"] > 0 and cm.artifact.meta["vectorized_loops"] > 0
        # predict_into is the extension's builtin itself: no Python frame, no ctypes
        assert type(cm.predict_into).__name__ == "builtin_function_or_method"
        assert cm.predict_into.__self__[0].__func__.__name__ == "_fail"


@pytest.mark.parametrize("isa", ["native", pytest.param("x86-64-v3", marks=pytest.mark.slow)])
def test_int8_fidelity_and_kernel(zoo_model, store_dir, isa) -> None:
    """int8 (per-channel int8 weights, calibrated int8 activations, int32 accumulation) meets
    the int8 gate on the zoo; native uses VNNI where the CPU has it, x86-64-v3 (AVX2, no VNNI)
    the portable dot-product form."""
    from hwb_plugins.cpu_native import build

    if isa != "native" and build.arch() != "x86_64":
        pytest.skip("x86-64 ISA level")
    for name in ("signal", "mlp", "conv1d", "lstm"):
        cm = hwb.compile(zoo_model(name), "cpu.native", "int8", store=store_dir, options={"isa": isa})
        assert cm.fidelity.corr >= 0.999 and cm.fidelity.rel_err <= 0.05, (name, cm.fidelity)
        kernel = cm.artifact.meta["int8_kernel"]
        if isa == "x86-64-v3":
            assert kernel == "portable"
        elif "avx512_vnni" in build.host_flags():
            assert kernel == "vnni-512"
            assert "_mm512_dpbusd_epi32" in cm.artifact.file("model.c").read_text()


def test_bad_inputs_give_the_cores_messages(compiled) -> None:
    cm = compiled("signal", "cpu.native")
    spec_in, spec_out = cm.input, cm.output
    good_x = np.zeros(spec_in.batched(1), np.float32)
    good_out = np.zeros(spec_out.batched(1), np.float32)
    bad = [(good_x.astype(np.float64), good_out), (good_x[:, :-1], good_out),
           (good_x[0], good_out), (np.zeros((1, 64), np.float32)[:, ::2], good_out),
           (good_x, good_out.astype(np.float64)), (good_x, np.zeros((1, 2), np.float32)),
           (good_x.tolist(), good_out)]
    ro = good_out.copy()
    ro.flags.writeable = False
    bad.append((good_x, ro))
    for x, out in bad:
        with pytest.raises(InputError) as got:
            cm.predict_into(x, out)
        with pytest.raises(InputError) as want:
            check_io((x,), (out,), (spec_in,), (spec_out,), 1, contiguous=True)
        assert str(got.value) == str(want.value)
    with pytest.raises(TypeError, match="2 arguments"):
        cm.predict_into(good_x)
    cm.predict_into(good_x, good_out)  # still serves


def test_unsupported_layer_is_named(store_dir) -> None:
    import keras

    km = keras.Sequential([keras.Input((8, 4)), keras.layers.SimpleRNN(4, name="my_rnn"),
                           keras.layers.Dense(1)])
    with pytest.raises(UnsupportedError, match=r"my_rnn.*SimpleRNN"):
        hwb.compile(km, "cpu.native", store=store_dir, fidelity=False)


def test_missing_compiler_is_unavailable(monkeypatch, zoo_model, store_dir) -> None:
    monkeypatch.setenv("HWB_CC", "/nonexistent/cc")
    with pytest.raises(UnavailableError, match=r"C compiler '/nonexistent/cc' not found.*HWB_CC"):
        hwb.compile(zoo_model("mlp"), "cpu.native", store=store_dir, rebuild=True)


def test_bad_isa_option_is_refused(zoo_model, store_dir) -> None:
    with pytest.raises(UnsupportedError, match="x86-64-v9"):
        hwb.compile(zoo_model("mlp"), "cpu.native", store=store_dir, options={"isa": "x86-64-v9"})


def test_wrong_isa_is_refused_before_dlopen(monkeypatch, store_dir, zoo_model, tmp_path) -> None:
    """An artifact built for x86-64-v4 on a CPU without AVX-512: the load-time check reads the
    CPU's flags (here a /proc/cpuinfo of an AVX2-only CPU) and refuses before dlopen."""
    from hwb_plugins.cpu_native import build, target

    if build.arch() != "x86_64":
        pytest.skip("x86-64 ISA levels")
    host = build.host_flags()
    if not {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= host:
        cm = None  # this CPU lacks AVX-512 itself: the real check refuses the real build
    else:
        cm = hwb.compile(zoo_model("signal"), "cpu.native", store=store_dir,
                         options={"isa": "x86-64-v4"})
        assert "avx512f" in cm.artifact.meta["requires"]
    avx2_only = tmp_path / "cpuinfo"
    avx2_only.write_text("processor\t: 0\nflags\t\t: " + " ".join(sorted(host - {
        f for f in host if f.startswith("avx512")})) + "\n")
    monkeypatch.setattr(build, "CPUINFO", str(avx2_only))
    with pytest.raises(UnavailableError, match=r"x86-64-v4.*avx512.*SIGILL.*isa"):
        hwb.compile(zoo_model("signal"), "cpu.native", store=store_dir, options={"isa": "x86-64-v4"})
    if cm is not None:
        with pytest.raises(UnavailableError, match="avx512f"):
            target.check_isa(cm.artifact.meta)
        monkeypatch.undo()
        target.check_isa(cm.artifact.meta)  # this CPU has it


def test_isa_levels_differ_in_required_features() -> None:
    from hwb_plugins.cpu_native import build

    if build.arch() != "x86_64":
        pytest.skip("x86-64 ISA levels")
    cc = build.compiler_path()
    v2, v3, v4 = (set(build.required_flags(cc, f"x86-64-v{i}")) for i in (2, 3, 4))
    assert {"sse4_2", "popcnt"} <= v2 and "avx2" not in v2
    assert {"avx2", "fma"} <= v3 and "avx512f" not in v3
    assert {"avx512f", "avx512bw", "avx512vl"} <= v4


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ for the C++ example")
def test_cpp_example_matches_python_bit_for_bit(compiled, tmp_path) -> None:
    cm = compiled("signal", "cpu.native")
    tgt = get_registry().target("cpu.native")
    files = tgt.export(cm.artifact, "c", tmp_path / "lib")
    assert sorted(p.name for p in files) == ["hwb_model.h", "libhwb_model.so"]
    header = (tmp_path / "lib" / "hwb_model.h").read_text()
    assert cm.artifact.fingerprint in header and "int hwb_model_predict(const float *x, float *y);" in header
    exe = tmp_path / "native_strategy"
    subprocess.run(["g++", "-O2", "-std=c++17", "-Wall", "-Werror", f"-I{tmp_path / 'lib'}",
                    str(ROOT / "examples" / "native_strategy.cpp"), str(tmp_path / "lib" / "libhwb_model.so"),
                    f"-Wl,-rpath,{tmp_path / 'lib'}", "-o", str(exe)], check=True, timeout=120)
    x = np.random.default_rng(9).standard_normal((257, *cm.input.shape)).astype(np.float32)
    x.tofile(tmp_path / "x.f32")
    subprocess.run([str(exe), str(tmp_path / "x.f32"), str(tmp_path / "y.f32")], check=True, timeout=60)
    got = np.fromfile(tmp_path / "y.f32", np.float32).reshape(len(x), *cm.output.shape)
    want = np.empty_like(got)
    out = np.empty(cm.output.batched(1), np.float32)
    for i in range(len(x)):
        cm.predict_into(x[i:i + 1], out)
        want[i] = out[0]
    assert got.tobytes() == want.tobytes()
    with pytest.raises(UnsupportedError, match="triton"):
        tgt.export(cm.artifact, "triton", tmp_path / "t")


def test_two_executors_of_one_artifact_on_two_threads(compiled, store_dir, zoo_model) -> None:
    """The generated code keeps no global state (intermediate tensors are on the caller's
    stack), so two executors of one artifact (one extension module, loaded once) called from
    two threads give the single-threaded answers. The call holds the GIL (releasing it would
    put the wait for re-acquiring it, up to the interpreter's switch interval, into the
    caller's tail), so the threads interleave call by call."""
    import threading

    a = compiled("lstm", "cpu.native")
    b = hwb.compile(zoo_model("lstm"), "cpu.native", store=store_dir, fidelity=False)
    assert b.artifact.cached
    x = np.random.default_rng(4).standard_normal((400, *a.input.shape)).astype(np.float32)
    want = a.predict(x)
    got = {}

    def run(cm, key):
        out = np.empty(cm.output.batched(1), np.float32)
        rows = np.empty_like(want)
        for _ in range(20):
            for i in range(len(x)):
                cm.predict_into(x[i:i + 1], out)
                rows[i] = out[0]
        got[key] = rows

    threads = [threading.Thread(target=run, args=(cm, k)) for k, cm in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got["a"].tobytes() == want.tobytes() == got["b"].tobytes()


@pytest.mark.slow  # three converter runs (tf2onnx, torch.onnx) and three builds
def test_onnx_mlps_from_tf2onnx_and_torch_onnx(zoo_model, store_dir, tmp_path) -> None:
    """ONNX sources: the Gemm chains torch.onnx writes and the MatMul+Add chains of tf2onnx
    (the core's own converters) compile and match the source model (ONNX Conv/LSTM/GRU
    graphs: tests/test_layer_ir_formats.py)."""
    from hwb_plugins.converters.to_onnx import keras_to_onnx, torch_to_onnx

    for name, convert in (("mlp", keras_to_onnx), ("mlp_torch", torch_to_onnx), ("signal", keras_to_onnx)):
        src = zoo_model(name)
        onnx_model = convert(src, tmp_path)
        ops = {n.op_type for n in onnx_model.obj.graph.node}
        cm = hwb.compile(hwb.load_model(onnx_model.obj), "cpu.native", store=store_dir, fidelity=False)
        x = src.representative(64)
        np.testing.assert_allclose(cm.predict(x), src.reference(x), atol=2e-6)
        assert ops & {"Gemm", "MatMul"}, ops


def test_the_artifact_holds_each_weight_array_once(compiled) -> None:
    """The model function and its sliding window read the same weights from one array each
    (emit.share_constants): the artifact's C declares no two constant arrays alike, and the
    window's answers are predict_into's bit for bit over every slot."""
    import re

    cm = compiled("lstm", "cpu.native", "fp32")
    code = Path(cm.artifact.file("model.c")).read_text()
    bodies = re.findall(r"^static const \w+ \w+\[\d+\](?: A64)? = (\{.*\});$", code, re.M)
    assert len(bodies) == len(set(bodies)), "a constant array is declared twice"
    assert re.search(r"^#define SLW\d+ W\d+$", code, re.M), "the window's weights are the model's"
    xs = np.random.default_rng(5).normal(size=(40, 8)).astype(np.float32)
    win = cm.sliding()
    got = np.array([np.array(win.push(x)).ravel() for x in xs][15:])
    want = cm.predict(np.stack([xs[i - 15:i + 1] for i in range(15, 40)])).reshape(len(got), -1)
    assert got.tobytes() == want.tobytes()


def test_share_constants_merges_only_equal_arrays() -> None:
    from hwb_plugins.cpu_native.emit import share_constants

    code = "\n".join(["static const float W0[2] A64 = {0x1p+0f,0x0.0p+0f};",
                      "static const float SLW1[2] A64 = {0x1p+0f,0x0.0p+0f};",
                      "static const float B2[2] A64 = {0x1p+0f,0x1p+0f};",
                      "static const int8_t Q3[2] A64 = {0x1p+0f,0x0.0p+0f};",
                      "static const float W4[2] = {0x1p+0f,0x0.0p+0f};",
                      "void f(void) { g(SLW1); }"])
    lines = share_constants(code).split("\n")
    assert lines[1] == "#define SLW1 W0"
    assert [ln.startswith("static const") for ln in lines[:5]] == [True, False, True, True, True]
    assert lines[5] == "void f(void) { g(SLW1); }"
