"""ONNX's own backend test data (tests/onnx_backend_cases.py: ``pytorch-converted``,
``pytorch-operator``, ``simple`` from the ``onnx`` wheel, models nobody here wrote, each with
inputs and expected outputs) through ``hwb.load_model`` and ``hwb.compile``:

* old files (opset 6, older than ONNX Runtime runs) are upgraded with
  ``onnx.version_converter`` before any target sees them, the conversion named in
  ``describe()``; a graph the converter cannot upgrade is refused naming it;
* on every target that takes ONNX (ref, cpu.onnxruntime, cpu.native): 0 wrong answers and
  0 raw tracebacks (refusals are fine and counted), and docs/targets.md's table
  (scripts/onnx_backend_table.py) says what each takes."""
from __future__ import annotations

import shutil

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
import onnx_backend_cases as ob  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import hwbackends as hwb  # noqa: E402
from hwbackends.models.onnx import MIN_OPSET, UPGRADE_OPSET, default_opset  # noqa: E402

TARGETS = ("ref", "cpu.onnxruntime", "cpu.native")
#: right answers each target must keep (of 140; docs/targets.md has the measured counts)
FLOORS = {"ref": 116, "cpu.onnxruntime": 116, "cpu.native": 70}


def _case(name: str):
    return next(c for c in ob.cases() if c.name == name)


def test_an_old_opset_is_upgraded_before_any_target_sees_it(tmp_path) -> None:
    case = _case("test_Linear")  # pytorch-converted, opset 6: ONNX Runtime refuses its Gemm(6)
    import onnx
    assert default_opset(onnx.load(str(case / "model.onnx"))) < MIN_OPSET
    m = hwb.load_model(str(case / "model.onnx"))
    up = {"from_opset": 6, "to_opset": UPGRADE_OPSET, "by": f"onnx.version_converter (onnx {onnx.__version__})"}
    assert m.meta["upgraded"] == up and m.describe()["upgraded"] == up
    assert default_opset(m.obj) == UPGRADE_OPSET
    assert ob.run_case(case, "cpu.onnxruntime", tmp_path).verdict == "right"
    cm = hwb.compile(m, "cpu.onnxruntime", store=tmp_path, isolate_compile=False)
    assert cm.describe()["upgraded"] == up
    # the user's file is the fingerprint's source; the same file loads to the same model
    assert hwb.load_model(str(case / "model.onnx")).fingerprint == m.fingerprint


def test_a_current_opset_is_taken_as_written() -> None:
    m = hwb.load_model(str(_case("test_gradient_of_add") / "model.onnx"))
    assert m.meta.get("upgraded") is None and m.describe()["upgraded"] is None


def test_a_graph_the_converter_cannot_upgrade_is_refused_naming_it(tmp_path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path / "old.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 6)]).SerializeToString())
    with pytest.raises(hwb.ModelError, match=r"opset 6.*onnx\.version_converter.*could not upgrade"):
        hwb.load_model(str(path))


@pytest.fixture(scope="module", params=TARGETS)
def tally(request) -> ob.Tally:
    if request.param == "cpu.native" and shutil.which("cc") is None:
        pytest.skip("cpu.native needs a C compiler (cc)")
    return ob.run_target(request.param)


@pytest.mark.slow
def test_every_case_is_right_or_refused(tally: ob.Tally) -> None:
    """About 30-90 s per target (informal: the loaded 2-core dev machine)."""
    bad = [o for o in tally.outcomes if o.verdict in ("wrong", "raw")]
    assert not bad, "\n".join(f"{o.verdict} {o.case}: {o.detail}" for o in bad)
    counts = tally.counts()
    assert len(tally.outcomes) == len(ob.cases()) and counts["right"] >= FLOORS[tally.target], counts
    row = ob.table_row(tally)
    assert row in ob.doc_table(), (f"docs/targets.md's ONNX backend data table is stale for "
                                   f"{tally.target} (measured: {row}); run "
                                   f"python scripts/onnx_backend_table.py")



def _typed_graph(path, in_type, out_type, vocab: int = 5):
    """x (in_type, (batch, 3)) → Gather rows of a (vocab, 2) table, or x itself, → out_type."""
    import numpy as np
    from onnx import numpy_helper
    x = helper.make_tensor_value_info("ids", in_type, ["batch", 3])
    y = helper.make_tensor_value_info("y", out_type, ["batch", 3, 2])
    table = numpy_helper.from_array(np.arange(vocab * 2, dtype=np.float32).reshape(vocab, 2) / 4, "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"])]
    if out_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["rows"], ["y"], to=out_type))
    else:
        nodes.append(helper.make_node("Identity", ["rows"], ["y"]))
    g = helper.make_graph(nodes, "g", [x], [y], [table])
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


@pytest.mark.parametrize("target", ["ref", "cpu.onnxruntime", "tpu.xla"])
def test_integer_inputs_and_outputs_pass_the_float32_interface_cast_in_the_graph(tmp_path, target) -> None:
    import numpy as np
    if target == "tpu.xla":
        pytest.importorskip("jax", reason="tpu.xla needs jax")
    path = _typed_graph(tmp_path / "ids.onnx", TensorProto.INT64, TensorProto.INT64)
    m = hwb.load_model(str(path))
    assert m.describe()["cast"] == {"inputs": {"ids": "int64"}, "outputs": {"y": "int64"}}
    assert [s.dtype for s in m.inputs + m.outputs] == ["float32", "float32"]
    syn = m.synthetic(64, 0)  # whole numbers, as a user feeds indices
    assert np.array_equal(syn, np.rint(syn))
    cm = hwb.compile(m, target, "fp32", store=tmp_path / "s", isolate_compile=False)
    ids = np.array([[0, 1, 4], [3, 3, 2]], np.float32)
    table = np.arange(10, dtype=np.float32).reshape(5, 2) / 4
    want = np.trunc(table[ids.astype(np.int64)])  # int64 output: Cast truncates toward zero
    assert np.array_equal(cm.predict(ids), want)
    assert np.array_equal(cm.predict(ids.astype(np.int64)), want)  # the user's own int64 indices


def test_an_input_with_no_float32_form_is_refused_naming_it(tmp_path) -> None:
    x = helper.make_tensor_value_info("words", TensorProto.STRING, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.STRING, ["batch", 3])
    g = helper.make_graph([helper.make_node("Identity", ["words"], ["y"])], "g", [x], [y])
    path = tmp_path / "words.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.raises(hwb.ModelError, match=r"input 'words' is a string tensor.*float32"):
        hwb.load_model(str(path))


def test_float32_only_targets_refuse_a_cast_input_naming_it(tmp_path) -> None:
    if shutil.which("cc") is None:
        pytest.skip("cpu.native needs a C compiler (cc)")
    m = hwb.load_model(str(_typed_graph(tmp_path / "ids.onnx", TensorProto.INT64, TensorProto.FLOAT)))
    with pytest.raises(hwb.UnsupportedError, match=r"input 'ids' as int64.*ref or cpu\.onnxruntime"):
        hwb.compile(m, "cpu.native", "fp32", store=tmp_path / "s", isolate_compile=False)


def test_float64_values_beyond_float32_are_refused_as_such(tmp_path) -> None:
    import numpy as np
    m = hwb.load_model(str(_typed_graph(tmp_path / "ids.onnx", TensorProto.INT64, TensorProto.FLOAT)))
    cm = hwb.compile(m, "ref", "fp32", store=tmp_path / "s", isolate_compile=False)
    with pytest.raises(hwb.InputError, match=r"beyond float32's range \(up to 1e\+300\)"):
        cm.predict(np.array([[0, 1, 1e300]]))
    with pytest.raises(hwb.InputError, match="NaN/Inf"):
        cm.predict(np.array([[0, 1, np.nan]]))
