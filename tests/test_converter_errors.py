"""A converter from another library that fails on a model comes back from
``hwb compile`` as an HwbError (exit 1, the README's exit codes) naming the converter, the op, the
library's own message and what to do — never a traceback. Each model here really makes that
converter fail, built in the test; for ONNX Runtime's quantiser, the awkward models it must
take (a duplicated default domain, an ML-only graph) quantise."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_run import Run, hwb

from hwbackends.cli import EXIT_ERROR, EXIT_OK


def hwb_compile(path: Path, store: Path, *args: str) -> Run:
    return hwb("compile", str(path), "--cache-dir", str(store), *args)


def failed_cleanly(p: Run, error: str) -> str:
    """The one ``hwb compile: <error>: …`` line, after checking the exit code and that no
    traceback reached the user."""
    assert p.returncode == EXIT_ERROR, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith(f"hwb compile: {error}: ")]
    assert len(lines) == 1, p.stderr
    return lines[0]


def _matmul_onnx(path: Path, opsets: list[tuple[str, int]]) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 1)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["input", "w"], ["output"])], "g",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1])],
                          initializer=[w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets],
                                ir_version=8), str(path))
    return path


def _tree_onnx(path: Path) -> Path:
    """A one-tree TreeEnsembleRegressor whose only opset import is ai.onnx.ml (the form a
    gradient-boosted model exported by an ONNX-ML converter can take)."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node(
        "TreeEnsembleRegressor", ["input"], ["output"], domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.0, 0.0, 0.0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0], target_treeids=[0, 0],
        target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[-1.0, 1.0],
        post_transform="NONE", aggregate_function="SUM")
    g = helper.make_graph([node], "tree",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 3)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


# -- ONNX Runtime's int8 quantiser ------------------------------------------------------------

def test_duplicate_default_domain_quantises(tmp_path: Path) -> None:
    """``""`` and ``"ai.onnx"`` at one version (the same domain twice) made the quantiser raise
    ``ValueError: Failed to find proper ai.onnx domain`` with a traceback; now it is merged
    and the model builds and passes its int8 gate."""
    path = _matmul_onnx(tmp_path / "dup.onnx", [("", 17), ("ai.onnx", 17)])
    p = hwb_compile(path, tmp_path / "store", "-t", "cpu.onnxruntime", "-p", "int8-dynamic")
    assert p.returncode == EXIT_OK, p.stderr
    assert "fidelity" in p.stdout


@pytest.mark.parametrize("precision", ["int8-dynamic", "int8"])
def test_onnx_ml_only_model_quantises(tmp_path: Path, precision: str) -> None:
    """A graph importing only ai.onnx.ml builds at both int8 precisions and is exact (the
    quantiser has nothing to quantise in a tree ensemble)."""
    path = _tree_onnx(tmp_path / "tree.onnx")
    p = hwb_compile(path, tmp_path / "store", "-t", "cpu.onnxruntime", "-p", precision)
    assert p.returncode == EXIT_OK, p.stderr
    assert "max_abs=0 " in p.stdout


def test_ml_only_model_gets_a_default_domain_without_pre_processing() -> None:
    """The repair itself, where ``quant_pre_process`` fails and the quantiser gets the graph as
    it is: without it ONNX Runtime's quantiser raises on the ai.onnx.ml-only graph."""
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from hwb_plugins.cpu_onnxruntime.quantiser import with_default_domain

    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "tree.onnx", Path(d) / "q.onnx"
        _tree_onnx(src)
        with pytest.raises(ValueError, match="ai.onnx domain"):
            quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8)
        onnx.save(with_default_domain(onnx.load(str(src))), str(src))
        quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8)
        assert {n.op_type for n in onnx.load(str(out)).graph.node} == {"TreeEnsembleRegressor"}


def test_conflicting_default_domains_are_a_compile_error(tmp_path: Path) -> None:
    """``""`` 17 and ``"ai.onnx"`` 13 disagree: nothing is guessed; the quantiser's refusal
    comes back naming it, the ops, the imports and what to do."""
    path = _matmul_onnx(tmp_path / "conf.onnx", [("", 17), ("ai.onnx", 13)])
    p = hwb_compile(path, tmp_path / "store", "-t", "cpu.onnxruntime", "-p", "int8-dynamic")
    line = failed_cleanly(p, "CompileError")
    for part in ("ONNX Runtime's int8 quantiser", "Failed to find proper ai.onnx domain",
                 "MatMul", "'ai.onnx' 13", "cpu.onnxruntime:fp32", "another target"):
        assert part in line, line


# -- tf2onnx and torch.onnx -------------------------------------------------------------------

def test_tf2onnx_unconverted_op_is_refused_by_name(tmp_path: Path) -> None:
    """tf2onnx leaves Keras's Discretization (TF ``Bucketize``) unconverted and carries on;
    the refusal names the converter, the op and the targets that read Keras."""
    import keras

    inp = keras.Input((4,))
    h = keras.layers.Discretization(bin_boundaries=[-1.0, 0.0, 1.0])(inp)
    keras.Model(inp, keras.layers.Dense(1)(keras.ops.cast(h, "float32"))).save(tmp_path / "d.keras")
    p = hwb_compile(tmp_path / "d.keras", tmp_path / "store", "-t", "cpu.onnxruntime")
    line = failed_cleanly(p, "UnsupportedError")
    for part in ("tf2onnx", "Bucketize", "cpu.litert", "tensorflow-onnx/issues"):
        assert part in line, line


def test_torch_onnx_failure_names_the_op(tmp_path: Path) -> None:
    """torch.onnx has no ONNX function for ``torch.special.bessel_j0``: a CompileError naming
    torch.onnx, the op and what to do; the exporter's coloured multi-line text is one line."""
    import torch

    class Bessel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(torch.special.bessel_j0(x))

    torch.export.save(torch.export.export(Bessel().eval(), (torch.zeros(1, 4),)),
                      tmp_path / "bessel.pt2")
    p = hwb_compile(tmp_path / "bessel.pt2", tmp_path / "store", "-t", "cpu.onnxruntime")
    line = failed_cleanly(p, "CompileError")
    for part in ("torch.onnx could not convert", "op prims.bessel_j0", "gpu.torch",
                 "pytorch/issues"):
        assert part in line, line
    assert "\x1b[" not in line


# -- hls4ml and the torch.export rebuild the FPGA targets use -------------------------------

def test_hls4ml_failure_names_the_users_layer(tmp_path: Path) -> None:
    """hls4ml's Keras 3 recurrent handler raises a bare Exception on ``return_state=True`` (in
    its config pass, which escaped with a traceback): a refusal naming the user's layer,
    hls4ml's message and what to do."""
    import keras

    inp = keras.Input((6, 2))
    out, _, _ = keras.layers.LSTM(4, return_state=True, name="rec")(inp)
    keras.Model(inp, keras.layers.Dense(1)(out)).save(tmp_path / "rs.keras")
    p = hwb_compile(tmp_path / "rs.keras", tmp_path / "store", "-t", "fpga.hls4ml",
                    "-p", "ap_fixed<16,6>")
    line = failed_cleanly(p, "UnsupportedError")
    for part in ("hls4ml 1.3", "'rec' (LSTM)", "return_state=True is not supported",
                 "pick another target"):
        assert part in line, line


def test_torch_export_constant_weight_is_refused_by_op(tmp_path: Path) -> None:
    """A ``torch.export`` program whose Linear weight is a lifted tensor constant (a plain
    attribute, not an nn.Parameter) raised ``KeyError`` rebuilding the module for hls4ml."""
    import torch

    class Const(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.randn(1, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(x, self.w)

    torch.export.save(torch.export.export(Const().eval(), (torch.zeros(1, 4),)),
                      tmp_path / "const.pt2")
    p = hwb_compile(tmp_path / "const.pt2", tmp_path / "store", "-t", "fpga.hls4ml",
                    "-p", "ap_fixed<16,6>")
    line = failed_cleanly(p, "UnsupportedError")
    for part in ("op aten.linear.default", "not one of its parameters or buffers",
                 "register_buffer", "Keras twin"):
        assert part in line, line
