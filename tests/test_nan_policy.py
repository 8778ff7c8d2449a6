"""The NaN rule: ``nan_policy='reject'`` (the
default) refuses NaN/Inf in ``predict``; with ``nan_policy='pass'`` and on ``predict_into``
(never checked: the hot path), a non-finite input never becomes a finite answer on a float
target. cpu.native (fp32, int8) writes NaN to every output of such a sample, whatever its
layers (a ReLU's max or int8's clamp made it finite before)."""
from __future__ import annotations

import numpy as np
import pytest

import hwbackends as hwb
from hwbackends.errors import InputError

#: (target, precision): the CPU targets of a default install, float arithmetic.
FLOAT_TARGETS = [("ref", "fp32"), ("cpu.onnxruntime", "fp32"), ("cpu.litert", "fp32"),
                 ("cpu.native", "fp32"), ("cpu.native", "int8")]


def _inputs(m) -> tuple[np.ndarray, np.ndarray]:
    """Eight samples: NaN in one feature, all NaN, -Inf in one feature, +Inf, then finite."""
    x = m.representative(8, seed=1).copy()
    flat = x.reshape(len(x), -1)
    flat[0, 0], flat[1, :], flat[2, 3], flat[3, -1] = np.nan, np.nan, -np.inf, np.inf
    bad = np.zeros(len(x), bool)
    bad[:4] = True
    return x, bad


@pytest.mark.parametrize("target,precision", FLOAT_TARGETS)
@pytest.mark.parametrize("zoo", ["mlp", "conv1d"])
def test_a_non_finite_input_never_gives_a_finite_answer(zoo, target, precision, store_dir):
    m = hwb.load_model(f"zoo:{zoo}")
    x, bad = _inputs(m)
    try:
        cm = hwb.compile(m, target, precision, nan_policy="pass", store=store_dir, fidelity=False)
    except hwb.errors.UnavailableError as exc:
        pytest.skip(str(exc))
    y = np.asarray(cm.predict(x)).reshape(len(x), -1)
    assert np.isnan(y[bad]).any(axis=1).all(), (cm.variant, y[bad])
    assert np.isfinite(y[~bad]).all()
    # the hot path, sample by sample, gives the same (a framework's batch-1 kernel may round
    # the last bit otherwise)
    out = np.empty(cm.output.batched(1), np.float32)
    for i in range(len(x)):
        cm.predict_into(np.ascontiguousarray(x[i:i + 1]), out)
        np.testing.assert_allclose(out.reshape(-1), y[i], rtol=1e-5, atol=1e-6)
    if target == "cpu.native":  # every output of the sample, not only where IEEE carries it
        assert np.isnan(y[bad]).all(), y[bad]
    with pytest.raises(InputError, match="NaN/Inf"):
        hwb.compile(m, target, precision, store=store_dir, fidelity=False).predict(x)
