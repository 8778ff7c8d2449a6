"""Models with several inputs and outputs (issue 14, item 4): ``zoo:two_head`` (features (16,)
+ state (4,) → signal (1,) + confidence (1,)) through predict/predict_into on the targets that
take them, per-output fidelity, clear refusals everywhere else."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.errors import InputError, UnsupportedError
from hwbackends.inputs import as_batches
from hwbackends.specs import TensorSpec

MULTI_TARGETS = ("ref", "cpu.onnxruntime", "tpu.xla", "cpu.litert")


@pytest.fixture(scope="module")
def two_head(zoo_model):
    return zoo_model("two_head")


@pytest.fixture(scope="module")
def data(two_head):
    rng = np.random.default_rng(7)
    return (rng.standard_normal((10, 16)).astype(np.float32),
            rng.standard_normal((10, 4)).astype(np.float32))


def test_two_head_loads_with_named_specs(two_head):
    assert two_head.multi_io
    assert [(s.name, s.shape) for s in two_head.inputs] == [("features", (16,)), ("state", (4,))]
    assert [(s.name, s.shape) for s in two_head.outputs] == [("signal", (1,)), ("confidence", (1,))]
    ys = two_head.reference(two_head.representative(5))
    assert isinstance(ys, tuple) and [y.shape for y in ys] == [(5, 1), (5, 1)]
    assert np.all((ys[1] > 0) & (ys[1] < 1)) and np.all(np.abs(ys[0]) < 1)  # sigmoid, tanh


@pytest.mark.parametrize("target", MULTI_TARGETS)
def test_compile_predict_and_predict_into(target, compiled, two_head, data):
    batch = None if target == "ref" else 4
    cm = compiled("two_head", target, batch_size=batch) if batch else compiled("two_head", target)
    assert cm.multi_io and [s.name for s in cm.inputs] == ["features", "state"]
    assert cm.input.name == "features" and cm.output.name == "signal"
    want = two_head.reference(data)
    # predict: a tuple, a list, a dict by name; n = 10 is not a multiple of the batch (pad/chunk)
    for x in (data, list(data), {"state": data[1], "features": data[0]}):
        got = cm.predict(x)
        assert isinstance(got, tuple) and len(got) == 2
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, atol=1e-5)
    one = cm.predict((data[0][3], data[1][3]))  # one sample per tensor: no batch axis back
    assert [o.shape for o in one] == [(1,), (1,)]
    np.testing.assert_allclose(one[1], want[1][3], atol=1e-5)
    # predict_into: tuples, one buffer per tensor, at the compiled batch
    b = cm.batch_size
    outs = tuple(np.full(s.batched(b), np.nan, np.float32) for s in cm.outputs)
    assert cm.predict_into((data[0][:b], data[1][:b]), outs) is None
    for o, w in zip(outs, want, strict=True):
        np.testing.assert_allclose(o, w[:b], atol=1e-5)
    # fidelity per output; the reported metrics are the worst output's
    f = cm.fidelity
    assert f.outputs is not None and set(f.outputs) == {"signal", "confidence"}
    assert f.output in f.outputs and f.corr == min(x.corr for x in f.outputs.values())
    assert f.outputs["confidence"].kind == "probabilities" and f.outputs["signal"].kind == "signed"
    assert f.corr > 0.9999 and f.max_abs < 1e-4
    d = cm.describe()
    assert [t["name"] for t in d["outputs"]] == ["signal", "confidence"]
    assert set(d["fidelity"]["outputs"]) == {"signal", "confidence"}


def test_cached_multi_io_artifact_reloads_and_is_checked(store_dir, two_head, data):
    first = hwb.compile(two_head, "cpu.onnxruntime", batch_size=4, store=store_dir)
    again = hwb.compile(two_head, "cpu.onnxruntime", batch_size=4, store=store_dir)
    assert again.artifact.cached
    for a, b in zip(first.predict(data), again.predict(data), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("target", ["fpga.hls4ml", "fpga.da4ml"])
def test_single_io_targets_refuse_before_building(target, two_head, store_dir):
    if target not in hwb.get_registry().targets:
        pytest.skip(f"{target} is not installed here")
    with pytest.raises(UnsupportedError) as e:
        hwb.compile(two_head, target, store=store_dir)
    msg = str(e.value)
    assert target in msg and "features" in msg and "state" in msg
    for able in MULTI_TARGETS:
        assert able in msg  # says where it does run


@pytest.mark.parametrize("target, precision", [("cpu.onnxruntime", "int8-dynamic"),
                                               ("tpu.xla", "bf16"), ("cpu.litert", "fp16")])
def test_reduced_precisions_meet_a_per_output_gate(target, precision, compiled):
    from hwbackends.fidelity import Tolerance

    f = compiled("two_head", target, precision, batch_size=4).fidelity
    assert set(f.outputs) == {"signal", "confidence"}
    assert Tolerance(corr_min=0.999, max_abs=0.05).passes(f), str(f)


@pytest.fixture(scope="module")
def ort_cm(compiled):
    return compiled("two_head", "cpu.onnxruntime", batch_size=4)


@pytest.mark.parametrize("bad, says", [
    (lambda d: d[0], "takes 2 inputs"),                            # one array for two inputs
    (lambda d: (d[0],), "got 1 input arrays"),                     # wrong count
    (lambda d: (d[0], d[1], d[1]), "got 3 input arrays"),
    (lambda d: (d[0], d[1][:, :3]), "input 'state' has shape (10, 3)"),
    (lambda d: (d[0][:, :5], d[1]), "input 'features' has shape (10, 5)"),
    (lambda d: {"features": d[0]}, "missing ['state']"),
    (lambda d: {"features": d[0], "state": d[1], "extra": d[1]}, "unknown ['extra']"),
    (lambda d: (d[0], d[1][:7]), "different numbers of samples"),
    (lambda d: (d[0], np.where(d[1] > 0, np.nan, d[1])), "input 'state' contains"),
    (lambda d: (d[0], d[1].astype(str)), "input 'state' has dtype"),
])
def test_bad_inputs_name_the_tensor(ort_cm, data, bad, says):
    with pytest.raises(InputError) as e:
        ort_cm.predict(bad(data))
    assert says in str(e.value)


def test_predict_into_guard_names_the_tensor(ort_cm, data):
    b = ort_cm.batch_size
    xs = (data[0][:b].copy(), data[1][:b].copy())
    outs = tuple(np.zeros(s.batched(b), np.float32) for s in ort_cm.outputs)
    cases = [
        ((xs[0], xs[1][:, :2]), outs, "input 'state' has shape"),
        ((xs[0], xs[1].astype(np.float64)), outs, "input 'state' has dtype float64"),
        (xs, (outs[0], np.zeros((b, 2), np.float32)), "out 'confidence' has shape"),
        ((xs[0],), outs, "got 1 inputs"),
        (xs[0], outs, "must be a tuple"),
    ]
    for x, o, says in cases:
        with pytest.raises(InputError) as e:
            ort_cm.predict_into(x, o)
        assert says in str(e.value)
        with pytest.raises(InputError):
            ort_cm.check(x, o)
    ro = np.zeros((b, 1), np.float32)
    ro.flags.writeable = False
    with pytest.raises(InputError, match="out 'confidence' is read-only"):
        ort_cm.check(xs, (outs[0], ro))


def test_as_batches_one_input_and_errors():
    spec = [TensorSpec("x", (3,))]
    (a,) = as_batches(np.ones(3), spec)
    assert a.shape == (1, 3) and a.dtype == np.float32
    # the tuple form, a dict keyed by the name and a nested list are the same one input
    for x in ((np.ones(3),), [np.ones(3)], {"x": np.ones(3)}):
        (b,) = as_batches(x, spec)
        assert b.shape == (1, 3)
    (c,) = as_batches([[1.0, 2.0, 3.0]], spec)
    assert c.shape == (1, 3)
    # one input: the message says "input" as the single-array predict always did
    with pytest.raises(InputError, match=r"^input has shape \(2, 4\)"):
        as_batches(np.ones((2, 4)), spec)
    with pytest.raises(InputError, match="is a dict.*one input"):
        as_batches({"y": np.ones(3)}, spec)
    two = [TensorSpec("a", (3,)), TensorSpec("b", (2,))]
    with pytest.raises(InputError, match="input 'b' has shape"):
        as_batches((np.ones(3), np.ones(3)), two)


def _onnx_two_io(path: Path) -> Path:
    """An ONNX graph with inputs a (3,), b (2,) → sum_a = a·W (1,), prod = b * 2 (2,)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.array([[1.0], [-2.0], [0.5]], np.float32), "W")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["a", "W"], ["sum_a"]), helper.make_node("Mul", ["b", "two"], ["prod"])],
        "two_io",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("sum_a", TensorProto.FLOAT, ["n", 1]),
         helper.make_tensor_value_info("prod", TensorProto.FLOAT, ["n", 2])],
        [w, two])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.mark.parametrize("target", ["ref", "cpu.onnxruntime", "tpu.xla"])
def test_onnx_file_with_two_inputs_and_outputs(target, tmp_path, store_dir):
    path = _onnx_two_io(tmp_path / "two_io.onnx")
    m = hwb.load_model(path)
    assert [s.name for s in m.inputs] == ["a", "b"] and [s.name for s in m.outputs] == ["sum_a", "prod"]
    cm = hwb.compile(m, target, batch_size=None if target == "ref" else 2, store=store_dir)
    a = np.arange(15, dtype=np.float32).reshape(5, 3)
    b = np.arange(10, dtype=np.float32).reshape(5, 2)
    s, p = cm.predict({"b": b, "a": a})
    np.testing.assert_allclose(s, a @ np.array([[1.0], [-2.0], [0.5]], np.float32), atol=1e-5)
    np.testing.assert_allclose(p, b * 2, atol=1e-6)


def test_single_io_models_keep_one_array(compiled):
    cm = compiled("mlp", "cpu.onnxruntime")
    assert not cm.multi_io and cm.inputs == [cm.input] and cm.outputs == [cm.output]
    y = cm.predict(np.zeros((3, 64), np.float32))
    assert isinstance(y, np.ndarray) and y.shape == (3, 3)


def test_cli_predict_takes_an_npz_keyed_by_input_name(tmp_path, store_dir, two_head, data):
    import subprocess
    import sys

    np.savez(tmp_path / "x.npz", state=data[1][:3], features=data[0][:3])
    args = [sys.executable, "-m", "hwbackends", "predict", "zoo:two_head", "-t", "cpu.onnxruntime",
            "--batch-size", "4", "--cache-dir", str(store_dir)]
    subprocess.run([*args, "-i", str(tmp_path / "x.npz"), "--output", str(tmp_path / "y.npz")],
                   check=True, capture_output=True, text=True, timeout=300)
    y = np.load(tmp_path / "y.npz")
    want = two_head.reference((data[0][:3], data[1][:3]))
    np.testing.assert_allclose(y["signal"], want[0], atol=1e-5)
    np.testing.assert_allclose(y["confidence"], want[1], atol=1e-5)
    np.save(tmp_path / "one.npy", data[0][:3])
    r = subprocess.run([*args, "-i", str(tmp_path / "one.npy")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and "takes 2 inputs (features, state)" in r.stderr and ".npz" in r.stderr


def test_validation_data_as_a_tuple_or_dict(store_dir, data):
    from hwbackends import zoo

    m = hwb.load_model(zoo.keras_two_head(), name="two_head_val",
                       validation_data={"features": data[0], "state": data[1]})
    assert isinstance(m.validation_data, tuple) and m.validation_data[1].shape == (10, 4)
    cm = hwb.compile(m, "ref", store=store_dir)  # the model travels to the worker and back
    assert cm.fidelity.n == 5  # the held-out half of the 10 given samples
    cm = hwb.compile(m, "cpu.onnxruntime", store=store_dir, validation_data=(data[0][:6], data[1][:6]))
    assert cm.fidelity.n == 3
    with pytest.raises(InputError, match="input 'state' has shape"):
        hwb.load_model(zoo.keras_two_head(), validation_data=(data[0], data[1][:, :2]))


@pytest.mark.parametrize("target", ["cpu.onnxruntime", "cpu.litert"])
def test_multi_io_hot_path_allocates_no_arrays(target, compiled, data):
    """The tuple guard and copies stay within the conformance kit's per-call bounds."""
    from hwbackends.testing.alloc import ALLOC_BOUND_BYTES, PEAK_BOUND_BYTES, measure

    cm = compiled("two_head", target, batch_size=4)
    xs = (np.ascontiguousarray(data[0][:4]), np.ascontiguousarray(data[1][:4]))
    outs = tuple(np.zeros(s.batched(4), np.float32) for s in cm.outputs)
    best = min((measure(cm.predict_into, xs, outs, 1000, 200) for _ in range(3)),
               key=lambda p: (p.peak, p.net))
    assert best.peak <= PEAK_BOUND_BYTES and best.net <= ALLOC_BOUND_BYTES, best
