"""Classifiers on fpga.hls4ml with precision="auto" and default tolerances (issue 14, item 2):
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


def _keras(layers: tuple[int, ...], head: str, seed: int) -> hwb.Model:
    """Seeded dense classifier, e.g. the 16→64→32→32→5 jet tagger of hls4ml's examples."""
    import keras

    keras.utils.set_random_seed(seed)
    km = keras.Sequential([keras.Input((layers[0],))]
                          + [keras.layers.Dense(u, activation="relu", name=f"fc{i}")
                             for i, u in enumerate(layers[1:-1], 1)]
                          + [keras.layers.Dense(layers[-1], activation=head, name="out")])
    x = np.random.default_rng(seed).standard_normal((1024, layers[0])).astype(np.float32)
    return hwb.load_model(km, name=f"{head}_classifier", validation_data=x)


@pytest.mark.parametrize("layers,head", [((16, 64, 32, 32, 5), "softmax"), ((16, 32, 16, 1), "sigmoid")])
def test_classifier_compiles_with_auto_precision(store_dir, layers, head):
    _need_target()
    cm = hwb.compile(_keras(layers, head, seed=3), TARGET, "auto", store=store_dir)
    f = cm.fidelity
    assert f.kind == "probabilities" and "sign" not in f.gated and "argmax" in f.gated, f
    assert f.argmax_agree >= 0.99 and f.corr > 0.999, f
    assert cm.describe()["fidelity"]["gated"] == list(f.gated)
