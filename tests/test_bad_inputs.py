"""Property-based: no bad input escapes the public API as anything but an HwbError whose
message says what was expected.

Each target compiles the zoo MLP once (the session store); Hypothesis then drives
``predict``/``predict_into`` with generated arrays, ``load_model`` with truncated and
random-byte files of every format, and ``compile`` with ONNX files of odd batch dimensions.
Example counts are small so the file stays in the normal suite.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import hwbackends as hwb
from hwbackends.errors import HwbError

TARGETS = ("cpu.onnxruntime", "tpu.xla", "ref", "cpu.litert")
FAST = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])
#: Every refusal names what was expected (or the fix for non-finite/empty data).
SAYS_WHAT = re.compile(r"expected|NaN/Inf|at least one sample|must be|takes|compiled for", re.I)
DTYPES = (np.float32, np.float64, np.float16, np.int32, np.uint8, np.bool_, np.complex64)


@pytest.fixture(scope="module", params=TARGETS)
def cm(request, compiled):
    target = request.param
    avail = hwb.get_registry().target(target).probe()
    if not avail.usable:
        pytest.skip(f"{target} unavailable: {avail.reason}")
    # The torch twin needs no TensorFlow on the ONNX targets; LiteRT takes the Keras one.
    return compiled("mlp" if target == "cpu.litert" else "mlp_torch", target)


@st.composite
def arrays(draw: st.DrawFn, sample: tuple[int, ...]) -> np.ndarray:
    """Right and wrong shapes (ranks 0–4, empty, off by one), dtypes and NaN/Inf."""
    n = draw(st.integers(0, 3))
    shape = draw(st.one_of(
        st.just(sample), st.just((n, *sample)), st.just((1, 1, *sample)),
        st.just((n, sample[0] + draw(st.sampled_from([-1, 1])))),
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)))
    dtype = draw(st.sampled_from(DTYPES))
    if np.dtype(dtype).kind in "fc":
        elems = st.floats(allow_nan=True, allow_infinity=True, width=16)
    else:
        elems = None
    return draw(hnp.arrays(dtype, shape, elements=elems))


def _valid(x: np.ndarray, sample: tuple[int, ...]) -> bool:
    shape_ok = x.shape == sample or (x.ndim == len(sample) + 1 and x.shape[1:] == sample
                                     and len(x) > 0)
    return shape_ok and x.dtype.kind in "fiub" and bool(np.isfinite(x).all())


def _names_expectation(exc: HwbError) -> None:
    assert SAYS_WHAT.search(str(exc)), f"{type(exc).__name__} does not say what was expected: {exc}"


@FAST
@given(data=st.data())
def test_predict_takes_good_arrays_and_refuses_bad_ones_clearly(cm, data):
    sample = tuple(cm.input.shape)
    x = data.draw(arrays(sample))
    try:
        y = cm.predict(x)
    except HwbError as exc:
        assert not _valid(x, sample), f"valid input {x.shape} {x.dtype} refused: {exc}"
        _names_expectation(exc)
        return
    assert _valid(x, sample), f"bad input {x.shape} {x.dtype} accepted"
    want = tuple(cm.output.shape) if x.shape == sample else (len(x), *cm.output.shape)
    assert y.shape == want and np.isfinite(y).all()


@FAST
@given(data=st.data())
def test_predict_into_refuses_anything_but_its_compiled_buffers(cm, data):
    b, sample, osample = cm.batch_size, tuple(cm.input.shape), tuple(cm.output.shape)
    x = data.draw(st.one_of(arrays(sample), st.just(np.zeros((b, *sample), np.float32))))
    out = data.draw(st.sampled_from([np.zeros((b, *osample), np.float32),
                                     np.zeros((b + 1, *osample), np.float32),
                                     np.zeros((b, *osample), np.float64),
                                     np.zeros(osample, np.float32)]))
    good = (x.shape == (b, *sample) and x.dtype == np.float32
            and out.shape == (b, *osample) and out.dtype == np.float32)
    try:
        cm.predict_into(x, out)
    except HwbError as exc:
        if cm.target != "ref":  # ref takes any batch size in predict_into
            assert not good, f"valid buffers refused: {exc}"
        _names_expectation(exc)
        return
    assert good or cm.target == "ref", f"predict_into accepted x {x.shape} {x.dtype}, out {out.shape} {out.dtype}"


# -- model files ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_files(tmp_path_factory, zoo_model) -> dict[str, Path]:
    """The zoo MLP in every file format load_model takes."""
    import torch

    d = tmp_path_factory.mktemp("files")
    km = zoo_model("mlp").obj
    km.save(d / "m.keras")
    km.save(d / "m.h5")
    (d / "m.json").write_text(km.to_json())
    net = zoo_model("mlp_torch").obj.eval()
    x = torch.zeros(2, 64)
    torch.export.save(torch.export.export(net, (x,)), d / "m.pt2")
    torch.jit.trace(net, x).save(str(d / "m.pt"))
    torch.onnx.export(net, (x,), str(d / "m.onnx"), dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "b"}, "output": {0: "b"}})
    return {p.suffix: p for p in d.iterdir()}


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_truncated_and_random_model_files_are_model_errors(model_files, tmp_path_factory, data):
    suffix = data.draw(st.sampled_from(sorted(model_files)))
    good = model_files[suffix].read_bytes()
    how = data.draw(st.sampled_from(["truncate", "random", "empty"]))
    if how == "truncate":
        blob = good[:data.draw(st.integers(1, len(good) - 1))]
    elif how == "random":
        blob = data.draw(st.binary(min_size=1, max_size=2048))
    else:
        blob = b""
    path = tmp_path_factory.mktemp("bad") / f"bad{suffix}"
    path.write_bytes(blob)
    try:
        m = hwb.load_model(path, input_shape=(64,) if suffix == ".pt" else None,
                           weights=model_files[".h5"] if suffix == ".json" else None)
    except HwbError as exc:
        assert path.name in str(exc) or "bad" in str(exc), exc
        return
    # A prefix that still parses (a protobuf cut at a field boundary) must run or say why.
    try:
        m.reference(np.zeros((2, *m.input.shape), np.float32))
    except HwbError as exc:
        assert "failed to run" in str(exc), exc


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.sampled_from([0, 1, 2, 3, 7, 789444]))
def test_onnx_files_with_odd_fixed_batches_compile_or_refuse(model_files, tmp_path_factory,
                                                             store_dir, batch):
    import onnx
    import onnxruntime as ort

    proto = onnx.load(str(model_files[".onnx"]))
    for vi in (*proto.graph.input, *proto.graph.output):
        vi.type.tensor_type.shape.dim[0].Clear()
        vi.type.tensor_type.shape.dim[0].dim_value = batch
    path = tmp_path_factory.mktemp("odd") / f"b{batch}.onnx"
    onnx.save(proto, str(path))
    try:
        cm = hwb.compile(path, "cpu.onnxruntime", store=store_dir)
    except HwbError as exc:
        assert batch == 0 and "batch dimension of 0" in str(exc), exc
        return
    x = np.random.default_rng(batch).standard_normal((3, 64)).astype(np.float32)
    sess = ort.InferenceSession(str(model_files[".onnx"]), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(cm.predict(x), sess.run(None, {"input": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", ["cpu.onnxruntime", "ref"])
def test_a_value_the_runtime_refuses_is_an_hwb_error_and_the_variant_still_serves(target, tmp_path):
    """An embedding lookup (an int64 input, cast at the graph's edge) fed an index past its
    table: ONNX Runtime raises from inside the run. The caller gets an HwbError that says a
    value is outside what the model takes, and the next good call is answered."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "table")
    g = helper.make_graph([helper.make_node("Gather", ["table", "idx"], ["y"])], "g",
                          [helper.make_tensor_value_info("idx", TensorProto.INT64, ["N", 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 3])],
                          [table])
    path = tmp_path / "embed.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    cm = hwb.compile(str(path), target, store=tmp_path / "s", isolate_compile=False, fidelity=False)
    with pytest.raises(HwbError, match=r"(?i)outside what the model takes|failed to run") as err:
        cm.predict(np.array([[1.0, 9.0]], np.float32))
    assert "Traceback" not in str(err.value)
    np.testing.assert_array_equal(cm.predict(np.array([[1.0, 3.0]], np.float32)),
                                  [[[3, 4, 5], [9, 10, 11]]])
