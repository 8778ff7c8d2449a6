"""gpu.tensorrt with several inputs/outputs. Without a GPU: the precision-carrying graph
(``prepare_onnx``) of the multi-IO zoo model ``two_head`` runs in the real ONNX Runtime and is
gated per output; the pure pieces of the build and load (profile entries, name mapping,
calibration by name) are checked directly; the executor's per-tensor structure is checked in
its source (it needs TensorRT and a GPU to run: those tests skip with the reason)."""
from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.config import FidelityConfig
from hwbackends.errors import UnavailableError, UnsupportedError
from hwbackends.fidelity import compare
from hwbackends.specs import Mode, TensorSpec

NAMES = ["signal", "confidence"]


@pytest.fixture(scope="module")
def two_head_onnx(zoo_model):
    """(batch-1 ONNX proto as gpu.tensorrt's compile() makes it, calibration tuple,
    validation tuple, reference outputs)."""
    from hwb_plugins._util import importable
    if not (importable("tensorflow") and importable("tf2onnx")):
        pytest.skip("tensorflow/tf2onnx not installed: the Keras zoo model cannot become ONNX")
    from hwb_plugins._shared.onnx_batch import fix_batch
    from hwb_plugins.converters.to_onnx import keras_to_onnx

    m = zoo_model("two_head")
    proto = fix_batch(keras_to_onnx(m, None).obj, 1)
    cal, val = m.representative(512, seed=5), m.representative(512, seed=1)
    return proto, cal, val, m.reference(val)


def _run(proto, xs, *, fused: bool = True) -> list[np.ndarray]:
    """The graph in ONNX Runtime, batch 1 per call, inputs by graph name (graph order = the
    model's here: tf2onnx keeps the Keras input names). ``fused=False``: Q/DQ run as the ONNX
    operators define them (see tests/test_gpu_prepare.py::_run)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if not fused:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    assert names == ["features", "state"]
    rows = [s.run(None, {n: x[i:i + 1] for n, x in zip(names, xs, strict=True)})
            for i in range(len(xs[0]))]
    return [np.concatenate([r[k] for r in rows]) for k in range(len(rows[0]))]


def _io_types(proto) -> list[int]:
    return [v.type.tensor_type.elem_type for v in (*proto.graph.input, *proto.graph.output)]


@pytest.mark.slow
def test_fp16_graph_keeps_every_io_fp32_and_passes_the_gate(two_head_onnx):
    import onnx

    from hwb_plugins.gpu_tensorrt.precision import prepare_onnx

    proto, _, val, ref = two_head_onnx
    g = prepare_onnx(proto, "fp16")
    assert len(g.graph.input) == 2 and len(g.graph.output) == 2
    assert _io_types(g) == [onnx.TensorProto.FLOAT] * 4
    weights = [i for i in g.graph.initializer if i.dims and np.prod(i.dims) > 1]
    assert weights and all(i.data_type == onnx.TensorProto.FLOAT16 for i in weights)
    f = compare(tuple(ref), tuple(_run(g, val)), names=NAMES)
    assert FidelityConfig().tolerance().passes(f), str(f)
    assert f.corr > 0.9999, str(f)


@pytest.mark.slow
def test_int8_qdq_graph_calibrates_every_input(two_head_onnx):
    import onnx

    from hwb_plugins.gpu_tensorrt.precision import prepare_onnx, qdq_zero_points

    proto, cal, val, ref = two_head_onnx
    g = prepare_onnx(proto, "int8", {"state": cal[1], "features": cal[0]})
    assert _io_types(g) == [onnx.TensorProto.FLOAT] * 4
    zps = qdq_zero_points(g)
    assert all(v == 0 for vals in zps.values() for v in vals), zps
    # Each graph input is quantized (a QuantizeLinear reads it directly): both were calibrated.
    quantized = {n.input[0] for n in g.graph.node if n.op_type == "QuantizeLinear"}
    assert {"features", "state"} <= quantized, sorted(quantized)
    f = compare(tuple(ref), tuple(_run(g, val, fused=False)), names=NAMES)
    assert f.corr >= 0.995, str(f)  # the int8 gate of the single-IO zoo tests
    # A tuple in graph input order is the same calibration as the dict by name.
    same = prepare_onnx(proto, "int8", cal)
    assert same.SerializeToString() == g.SerializeToString()


@pytest.mark.slow
def test_int8_refuses_calibration_that_does_not_match_the_inputs(two_head_onnx):
    from hwb_plugins.gpu_tensorrt.precision import prepare_onnx

    proto, cal, _, _ = two_head_onnx
    with pytest.raises(UnsupportedError, match="one array per graph input \\(features, state\\)"):
        prepare_onnx(proto, "int8", cal[0])
    with pytest.raises(UnsupportedError, match="keyed \\['features'\\]"):
        prepare_onnx(proto, "int8", {"features": cal[0]})
    with pytest.raises(UnsupportedError, match="different numbers of samples"):
        prepare_onnx(proto, "int8", (cal[0], cal[1][:10]))


# -- the pure pieces of build and load ---------------------------------------------------------
def _graph(inputs: list[str], outputs: list[str]):
    """A real ONNX graph with these input/output names (Identity/Add nodes)."""
    from onnx import TensorProto, helper

    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 2]) for n in inputs]
    vo = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 2]) for n in outputs]
    nodes = [helper.make_node("Add", [inputs[0], inputs[-1]], [outputs[0]])]
    nodes += [helper.make_node("Identity", [inputs[0]], [o]) for o in outputs[1:]]
    return helper.make_model(helper.make_graph(nodes, "g", vi, vo))


def test_graph_io_maps_specs_by_name_else_by_position():
    from hwb_plugins.gpu_tensorrt.target import calibration_by_input, graph_io

    specs = lambda *ns: [TensorSpec(n, (2,)) for n in ns]  # noqa: E731
    g = _graph(["state", "features"], ["Identity:0", "Identity_1:0"])
    io = graph_io(g, specs("features", "state"), specs("signal", "confidence"))
    # the specs carry the graph's input names (in another order): by name; outputs: by position
    assert io == {"inputs": ["features", "state"], "outputs": ["Identity:0", "Identity_1:0"]}
    a, b = np.zeros((3, 2), np.float32), np.ones((3, 2), np.float32)
    assert calibration_by_input(io, (a, b)).keys() == {"features", "state"}
    assert calibration_by_input(io, (a, b))["features"] is a
    assert calibration_by_input(io, a) is a  # one input: unchanged
    io2 = graph_io(g, specs("x0", "x1"), specs("y0", "y1"))  # converted names: by position
    assert io2["inputs"] == ["state", "features"]
    with pytest.raises(UnsupportedError, match="declares"):
        graph_io(g, specs("features"), specs("signal", "confidence"))


def test_profile_has_one_entry_per_dynamic_input():
    from hwb_plugins.gpu_tensorrt.target import profile_shapes

    shapes = {"features": (1, 16), "state": (1, 4)}
    assert profile_shapes([("features", (1, 16)), ("state", (1, 4))], shapes) == []
    assert profile_shapes([("features", (-1, 16)), ("state", (-1, 4))], shapes) == [
        ("features", (1, 16)), ("state", (1, 4))]
    assert profile_shapes([("features", (1, 16)), ("state", (-1, 4))], shapes) == [("state", (1, 4))]
    with pytest.raises(UnsupportedError, match="'extra'.*declares no shape"):
        profile_shapes([("extra", (-1, 3))], shapes)
    with pytest.raises(UnsupportedError, match="declares \\(1, 4\\)"):
        profile_shapes([("state", (-1, 5))], shapes)


def test_engine_io_uses_the_recorded_names_in_spec_order():
    from hwb_plugins.gpu_tensorrt.target import engine_io

    names = ["state", "features", "Identity:0", "Identity_1:0"]  # engine order
    modes = [True, True, False, False]
    assert engine_io(names, modes, ["features", "state"], ["Identity:0", "Identity_1:0"]) == (
        ["features", "state"], ["Identity:0", "Identity_1:0"])
    assert engine_io(names, modes, None, None) == (["state", "features"],
                                                   ["Identity:0", "Identity_1:0"])
    with pytest.raises(UnsupportedError, match="rebuild"):
        engine_io(names, modes, ["features", "other"], None)


# -- the executor's structure (runs only with TensorRT and a GPU) ------------------------------
def _loop_calls(func) -> set[str]:
    """Attribute names called inside a ``for`` loop of ``func``'s body."""
    tree = ast.parse(_dedent(func))
    found: set[str] = set()
    for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For)):
        for call in (n for n in ast.walk(loop) if isinstance(n, ast.Call)):
            if isinstance(call.func, ast.Attribute):
                found.add(call.func.attr)
    return found


def _dedent(func) -> str:
    import textwrap
    return textwrap.dedent(inspect.getsource(func))


def test_executor_binds_copies_and_profiles_every_tensor_by_name():
    from hwb_plugins.gpu_tensorrt import target as t
    from hwbackends.target import Executor

    assert t.TensorRTTarget.multi_io and t.TensorRTTarget.multi_io_calibrated
    # one executor class for one tensor or several (tuples inside)
    assert issubclass(t.TensorRTExecutor, (t._TensorRTRunner, Executor))
    assert not hasattr(t, "TensorRTMultiExecutor")
    assert "set_shape" in _loop_calls(t.build_engine)  # one profile entry per input
    assert "set_input_shape" in _loop_calls(t._TensorRTRunner._check_shapes)
    assert {"set_tensor_address", "cudaMalloc"} <= _loop_calls(t._TensorRTRunner._allocate)
    assert _loop_calls(t._TensorRTRunner._enqueue) >= {"cudaMemcpyAsync"}
    src = _dedent(t.TensorRTTarget.load)
    assert "TensorRTExecutor(" in src and "artifact.inputs," in src and "multi_io" not in src
    assert len(_dedent(t.TensorRTExecutor.__init__).splitlines()) <= 10


def test_core_takes_multi_io_int8_to_tensorrt_and_only_the_gpu_is_missing(zoo_model, store_dir):
    """The core takes the model and its calibrated precision: without a GPU the target's own
    probe is what stops it."""
    if "gpu.tensorrt" not in hwb.get_registry().targets:
        pytest.skip("gpu.tensorrt is not installed here")
    if hwb.get_registry().target("gpu.tensorrt").probe().usable:
        pytest.skip("a GPU is usable here: test_two_head_end_to_end runs instead")
    with pytest.raises(UnavailableError, match="gpu\\.tensorrt is unavailable"):
        hwb.compile(zoo_model("two_head"), "gpu.tensorrt", "int8", store=store_dir)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp32", "fp16", "int8"))
def test_two_head_end_to_end(compiled, zoo_model, precision):
    a = hwb.get_registry().target("gpu.tensorrt").probe()
    if not a.usable:
        pytest.skip(f"gpu.tensorrt unavailable: {a.reason}")
    cm = compiled("two_head", "gpu.tensorrt", precision, batch_size=4)
    assert cm.mode is Mode.HARDWARE and cm.multi_io
    lim = {"fp32": 0.99999, "fp16": 0.999, "int8": 0.98}[precision]
    assert cm.fidelity.corr > lim and set(cm.fidelity.outputs) == set(NAMES), str(cm.fidelity)
    m = zoo_model("two_head")
    xs = m.representative(4, seed=4)
    outs = tuple(np.zeros(s.batched(4), np.float32) for s in cm.outputs)
    for _ in range(3):  # replays reuse the same buffers
        cm.predict_into(xs, outs)
    for o, w in zip(outs, m.reference(xs), strict=True):
        np.testing.assert_allclose(o, w, atol=1e-4 if precision == "fp32" else 5e-2)
