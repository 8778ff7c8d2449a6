"""Classifiers on fpga.hls4ml with precision="auto" and default tolerances:
probabilities are gated on decision agreement, error and correlation, not on sign."""
from __future__ import annotations

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.registry import get_registry

pytestmark = pytest.mark.slow
TARGET = "fpga.hls4ml"


def _need_target() -> None:
    avail = get_registry().target(TARGET).probe()
    if not avail.usable:
        pytest.skip(f"{TARGET} unavailable here: {avail.reason}")


def _keras(layers: tuple[int, ...], head: str, seed: int, bn: bool = False) -> hwb.Model:
    """Seeded dense classifier, e.g. the 16→64→32→32→5 jet tagger of hls4ml's examples.
    ``bn``: the head is Dense → BatchNormalization (set, non-trivial statistics) → activation,
    the shape hls4ml's Keras 3 converter cannot take (the target folds the BN into the Dense)."""
    import keras

    keras.utils.set_random_seed(seed)
    hidden = [keras.layers.Dense(u, activation="relu", name=f"fc{i}")
              for i, u in enumerate(layers[1:-1], 1)]
    if bn:
        norm = keras.layers.BatchNormalization(name="bn")
        act = keras.layers.Softmax(name="prob") if head == "softmax" else keras.layers.Activation(head, name="prob")
        top = [keras.layers.Dense(layers[-1], name="out"), norm, act]
    else:
        top = [keras.layers.Dense(layers[-1], activation=head, name="out")]
    km = keras.Sequential([keras.Input((layers[0],)), *hidden, *top])
    if bn:  # gamma, beta, moving mean, moving variance: folding them is not the identity
        r = np.random.default_rng(seed)
        n = layers[-1]
        norm.set_weights([r.uniform(0.5, 2.0, n), r.uniform(-0.3, 0.3, n), r.uniform(-0.2, 0.4, n),
                          r.uniform(0.5, 3.0, n)])
    x = np.random.default_rng(seed).standard_normal((1024, layers[0])).astype(np.float32)
    return hwb.load_model(km, name=f"{head}{'_bn' if bn else ''}_classifier", validation_data=x)


# The softmax jet tagger carries BatchNormalization before its softmax: it is also the test
# that a BN before a softmax compiles on hls4ml, folded (no layer of its own in the design),
# and meets the gate (tests/test_real_models.py's bn_softmax compile merged here: one auto
# search less, ~30 s in CI).
@pytest.mark.parametrize("layers,head,bn", [((16, 64, 32, 32, 5), "softmax", True),
                                            ((16, 32, 16, 1), "sigmoid", False)])
def test_classifier_compiles_with_auto_precision(store_dir, layers, head, bn):
    _need_target()
    cm = hwb.compile(_keras(layers, head, seed=3, bn=bn), TARGET, "auto", store=store_dir)
    f = cm.fidelity
    assert f.kind == "probabilities" and "sign" not in f.gated and "argmax" in f.gated, f
    assert f.argmax_agree >= 0.99 and f.corr > 0.999, f
    assert cm.describe()["fidelity"]["gated"] == list(f.gated)
    if bn:
        assert f.argmax_agree > 0.99, f
        types = cm.artifact.meta["types"]
        assert "bn" not in types and "out" in types, types  # folded into the Dense before it


def test_softmax_classifier_on_fpga_da4ml_meets_the_default_gate_bit_exact(store_dir):
    """On fpga.da4ml the 5-class softmax meets the default gate: its tables are wider than 8
    bits (which floor the error at ~0.011), and widths where da4ml's rows would sum to 4.5
    (a da4ml bug) are skipped by construction. Auto, RTL simulation, no synthesis. An 8→16→16→5 classifier:
    the softmax's tables and the gate do not depend on the layers before it, and the jet
    tagger's (16→64→32→32→5) search and Verilator build cost several times as much (it stays
    the fpga.hls4ml classifier above). Here max_abs was 0.0013 and argmax agreement 1.0."""
    if not get_registry().target("fpga.da4ml").probe().usable:
        pytest.skip("fpga.da4ml unavailable here")
    cm = hwb.compile(_keras((8, 16, 16, 5), "softmax", seed=3), "fpga.da4ml", "auto",
                     store=store_dir, options={"synth": False})
    f = cm.fidelity
    assert f.kind == "probabilities" and f.argmax_agree >= 0.995 and f.max_abs < 0.01, f
    meta = cm.describe()["meta"]
    assert meta["bit_exact"]["bit_exact"] is True, meta["bit_exact"]
    x = np.random.default_rng(9).standard_normal((64, 8)).astype(np.float32)
    np.testing.assert_allclose(cm.predict(x).sum(axis=1), 1, atol=0.01)
