"""The precision-family fidelity policy lives once, in :mod:`hwbackends.fidelity`:
``hwb compile``'s gate, the conformance kit's fidelity check and a fleet node's
artifact import all decide with :func:`hwbackends.fidelity.gate_violations`, so changing the
one table changes all three."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from registry_helpers import registry_with

import hwbackends as hwb
from hwbackends import fidelity
from hwbackends.compiler import fidelity_gate, import_artifact
from hwbackends.errors import CacheError
from hwbackends.fidelity import Tolerance, compare, gate_violations, precision_family
from hwbackends.store.artifacts import ArtifactStore
from hwbackends.testing import Conformance, ConformanceError, Variant, run_variant_check
from hwbackends.testing.sample_target import NumpyDenseTarget

#: Nothing meets it: a correlation above 1.
IMPOSSIBLE = Tolerance(corr_min=1.5)


class Sample(NumpyDenseTarget):
    name = "cpu.policy_sample"


def _registry():
    return registry_with(Sample(), name="policy_sample")


def test_the_family_gate_separates_precisions():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((256, 4))
    noisy = ref + 0.01 * rng.standard_normal(ref.shape)  # a quantisation-sized error
    f = compare(ref, noisy)
    assert gate_violations("int8", f) == [] and gate_violations("ap_fixed<16,6>", f) == []
    assert any("rel_err" in v for v in gate_violations("fp32", f))
    assert precision_family("bf16") == "half" and precision_family("FP32") == "fp32"
    assert gate_violations("fp32", compare(ref, ref)) == []


def test_one_table_decides_compile_kit_and_import(zoo_model, tmp_path, monkeypatch):
    reg = _registry()
    m = zoo_model("mlp")
    cm = hwb.compile(m, Sample.name, store=tmp_path / "a", registry=reg, isolate_compile=False)
    assert fidelity_gate(cm)["passed"], fidelity_gate(cm)
    ctx = Conformance(Sample.name, tmp_path / "kit", models=("mlp",), registry=reg)
    run_variant_check(ctx, Variant("mlp", "fp32"), "fidelity")  # passes with the real table

    monkeypatch.setitem(fidelity.TOLERANCES, "fp32", IMPOSSIBLE)
    gate = fidelity_gate(cm)
    assert not gate["passed"] and gate["family"] == "fp32"
    assert any("corr" in v and "1.5" in v for v in gate["violations"])
    with pytest.raises(ConformanceError, match="1.5"):
        run_variant_check(ctx, Variant("mlp", "fp32"), "fidelity")
    # a fleet import of the same artifact is held to the same (now impossible) gate
    src = ArtifactStore(tmp_path / "a")
    dst = ArtifactStore(tmp_path / "b")
    staged = dst.stage()
    for p in cm.artifact.path.iterdir():
        if p.name != "manifest.json":
            shutil.copy2(p, staged / p.name)
    with pytest.raises(CacheError, match="reference model"):
        import_artifact(dst, staged, src.get(cm.artifact.key), m, Sample.name, registry=reg)
    assert dst.get(cm.artifact.key) is None


def test_the_gate_fields_are_declared_once():
    """A strategy's ``fidelity`` table takes exactly Tolerance's gate fields, with Tolerance's
    defaults and the ranges declared beside them; the serving engine's swap gate is the
    policy's SWAP_GATE."""
    from pydantic import ValidationError

    from hwbackends.config import FidelityConfig
    from hwbackends.serve.engine import EngineConfig

    gate = Tolerance.gate_fields()
    assert list(FidelityConfig.model_fields) == [f.name for f in gate]
    assert FidelityConfig().tolerance().gates() == Tolerance().gates()
    for f in gate:
        lo, hi = f.metadata["bounds"]
        for bad in ([lo - 1] if lo is not None else []) + ([hi + 1] if hi is not None else []):
            with pytest.raises(ValidationError, match=f.name):
                FidelityConfig(**{f.name: bad})
    assert FidelityConfig(rel_err=0.5).tolerance(kind="signed").rel_err == 0.5
    assert EngineConfig().tolerance == fidelity.SWAP_GATE
