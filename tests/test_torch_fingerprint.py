"""A torch module's fingerprint covers what its ``forward`` does, not only what ``repr``
shows: two modules with the same submodules and weights whose ``forward`` differs by a plain
attribute (``TransformerEncoderLayer(norm_first=...)``, an activation picked by a flag) are
different models, so neither is served the other's cached artifact."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import hwbackends as hwb

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402


class Switch(nn.Module):
    """Same submodules and weights either way; ``forward`` reads a plain attribute."""

    def __init__(self, squash: bool) -> None:
        super().__init__()
        self.squash = squash
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        y = self.fc(x)
        return torch.tanh(y) if self.squash else torch.relu(y)


def _pair(kind: str):
    torch.manual_seed(0)
    if kind == "encoder":
        a = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=False)
        b = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
        shape = (4, 8)
    else:
        a, b, shape = Switch(False), Switch(True), (6,)
    b.load_state_dict(a.state_dict())
    assert repr(a) == repr(b) or kind == "encoder"  # what the fingerprint read before
    return a.eval(), b.eval(), shape


@pytest.mark.parametrize("kind", ["switch", "encoder"])
def test_forward_differences_change_the_fingerprint(kind) -> None:
    a, b, shape = _pair(kind)
    fa = hwb.load_model(a, input_shape=shape).fingerprint
    assert fa == hwb.load_model(a, input_shape=shape).fingerprint  # stable
    assert fa != hwb.load_model(b, input_shape=shape).fingerprint


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
@pytest.mark.parametrize("kind", ["switch", "encoder"])
def test_each_model_gets_its_own_artifact_from_one_store(tmp_path, kind) -> None:
    """The reproduction: both compiled into one store, each must answer as itself."""
    a, b, shape = _pair(kind)
    x = np.random.default_rng(1).standard_normal((16, *shape)).astype(np.float32)
    for m in (a, b):
        cm = hwb.compile(hwb.load_model(m, input_shape=shape), "cpu.native", store=tmp_path / "s",
                         fidelity=False)
        with torch.no_grad():
            want = m(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(cm.predict(x), want, atol=1e-4)
