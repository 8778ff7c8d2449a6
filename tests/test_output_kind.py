"""The output kind is declared, and inferred only as a printed default.

A regression whose outputs happen to lie in [0, 1] was judged as probabilities (``> 0.5``
agreement, trivially 1.0) and a ``sign_min`` in its tolerance was skipped without a word.
Now ``output_kind`` (``compile(...)``, a strategy's ``output_kind``) decides the gated
metrics, an inferred kind says it was inferred, a tolerance the kind does not gate is an
error naming the kind, and ``hwb route --explain`` shows the kind and the gate's defaults."""
from __future__ import annotations

import json

import numpy as np
import pytest

import hwbackends
from hwbackends.cli import main
from hwbackends.config import FidelityConfig, load_config
from hwbackends.errors import ConfigError
from hwbackends.fidelity import Tolerance, compare
from hwbackends.registry import get_registry

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

#: The installed plugins: the strategies' targets are checked against them.
REG = get_registry()


def bounded_regression(path):
    """y = 0.5 + x·w with small w: one column, every output within [0, 1] on N(0,1) inputs
    (a forecast of, say, a fill ratio — not a probability)."""
    w = numpy_helper.from_array(np.full((8, 1), 0.02, np.float32), "w")
    b = numpy_helper.from_array(np.array([0.5], np.float32), "b")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"])], "g", [x], [y], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return bounded_regression(tmp_path_factory.mktemp("kind") / "fill.onnx")


def test_inferred_kind_is_labelled_and_a_declared_kind_decides_the_gate(model, store_dir):
    inferred = hwbackends.compile(model, "cpu.onnxruntime", store=store_dir).fidelity
    assert (inferred.kind, inferred.kind_source) == ("probabilities", "inferred")
    assert "[probabilities, inferred]" in str(inferred)
    assert inferred.argmax_agree is not None and "argmax" in inferred.gated

    reg = hwbackends.compile(model, "cpu.onnxruntime", store=store_dir, output_kind="regression").fidelity
    assert (reg.kind, reg.kind_source) == ("regression", "declared")
    assert reg.argmax_agree is None and set(reg.gated) == {"corr", "max_abs", "rel_err", "mae"}
    assert "inferred" not in str(reg)

    signed = hwbackends.compile(model, "cpu.onnxruntime", store=store_dir, output_kind="signed").fidelity
    assert "sign" in signed.gated and "argmax" not in signed.gated

    with pytest.raises(ConfigError, match="'price' is not an output kind; one of signed, regression"):
        hwbackends.compile(model, "cpu.onnxruntime", store=store_dir, output_kind="price")


def test_a_tolerance_the_kind_does_not_gate_is_an_error_naming_the_kind():
    rng = np.random.default_rng(0)
    ref = 0.5 + 0.05 * rng.standard_normal((200, 1))
    f = compare(ref, ref + 1e-4)
    with pytest.raises(ConfigError, match=r"sign_min does not apply to a probabilities output "
                                          r"\(inferred: the reference outputs are ≥ 0 and within"):
        Tolerance(sign_min=0.99, strict=True).violations(f)
    with pytest.raises(ConfigError, match="argmax_min does not apply to a regression output"):
        Tolerance(argmax_min=0.99, strict=True).violations(compare(ref, ref, kind="regression"))
    # A strategy's gate is strict; a generic bundle (the FPGA search target) skips what the
    # kind does not gate.
    assert FidelityConfig(sign_min=0.99).tolerance().strict
    assert Tolerance(sign_min=0.99, argmax_min=0.99).violations(f) == []
    # Declared for the strategy, the same measurement is judged as that kind.
    assert Tolerance(sign_min=0.99, kind="signed", strict=True).violations(f) == []
    flipped = compare(ref - 0.5, -(ref - 0.5))
    assert Tolerance(corr_min=None, sign_min=0.99).violations(flipped)[0].startswith("sign agreement")


def test_several_outputs_take_one_kind_each():
    rng = np.random.default_rng(1)
    a, b = 0.5 + 0.05 * rng.standard_normal((64, 1)), rng.standard_normal((64, 3))
    f = compare((a, b), (a, b), kind={"fill": "regression"}, names=["fill", "logits"])
    assert f.outputs["fill"].kind == "regression" and f.outputs["fill"].kind_source == "declared"
    assert (f.outputs["logits"].kind, f.outputs["logits"].kind_source) == ("logits", "inferred")


def test_hwb_compile_prints_the_kind_and_takes_it(model, store_dir, capsys):
    assert main(["compile", str(model), "-t", "cpu.onnxruntime", "--cache-dir", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "[probabilities, inferred]" in out and "output    probabilities (inferred:" in out, out
    assert main(["compile", str(model), "-t", "cpu.onnxruntime", "--cache-dir", str(store_dir),
                 "--output-kind", "regression", "--json"]) == 0
    fid = json.loads(capsys.readouterr().out)["fidelity"]
    assert (fid["kind"], fid["kind_source"], fid["argmax_agree"]) == ("regression", "declared", None)


STRATEGIES = """
[tiers.any]
p99_us = 1e6

[router.bench]
n = 50
warmup = 0

[strategies.fill]
model = "{model}"
tier = "any"
targets = ["cpu.onnxruntime"]
precisions = ["fp32"]
{extra}
"""


def _config(tmp_path, model, extra=""):
    cfg = tmp_path / "s.toml"
    cfg.write_text(STRATEGIES.format(model=model, extra=extra))
    return cfg


def test_a_strategy_declares_its_output_kind_and_a_misfit_tolerance_is_a_config_error(tmp_path, model):
    ok = load_config(_config(tmp_path, model, 'output_kind = "regression"'), REG)
    assert ok.strategies["fill"].output_kind == "regression"
    cfg = _config(tmp_path, model, 'output_kind = "probabilities"\nfidelity = { sign_min = 0.99 }')
    with pytest.raises(ConfigError, match=r"s.toml:\d+: strategies.fill.fidelity.sign_min: fidelity "
                                          r"sign_min does not apply to a probabilities output"):
        load_config(cfg, REG)
    with pytest.raises(ConfigError, match="output_kind"):
        load_config(_config(tmp_path, model, 'output_kind = "prices"'), REG)


def test_route_explain_shows_the_kind_and_the_default_tolerances(tmp_path, model, store_dir, capsys):
    cfg = _config(tmp_path, model)
    assert main(["route", str(cfg), "--explain", "--cache-dir", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "output kind: probabilities (inferred: the reference outputs are ≥ 0" in out, out
    assert "declare output_kind (hwb compile --output-kind) as one of signed, regression, " \
           "probabilities, logits" in out
    assert "fidelity gate: corr_min 0.999 (default); not checked: max_abs, rel_err, mae, " \
           "sign_min, argmax_min" in out, out

    declared = _config(tmp_path, model, 'output_kind = "signed"\nfidelity = { sign_min = 0.99, rel_err = 0.01 }')
    assert main(["route", str(declared), "--explain", "--cache-dir", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "output kind: signed (declared; gates corr, max_abs, rel_err, mae, sign)" in out, out
    assert "corr_min 0.999 (default), rel_err 0.01 (set), sign_min 0.99 (set)" in out, out
    assert main(["route", str(declared), "--json", "--cache-dir", str(store_dir)]) == 0
    cand = json.loads(capsys.readouterr().out)["strategies"][0]["candidates"][0]
    assert cand["fidelity"]["kind"] == "signed" and cand["fidelity"]["kind_source"] == "declared"

    # The bug: sign_min on an output inferred as probabilities was skipped; now it is refused.
    silent = _config(tmp_path, model, "fidelity = { sign_min = 0.99 }")
    assert main(["route", str(silent), "--explain", "--cache-dir", str(store_dir)]) != 0
    err = capsys.readouterr()
    assert "sign_min does not apply to a probabilities output (inferred" in err.out + err.err
